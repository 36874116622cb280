package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// wakeupsCmd shows or sets how the relays of a table wake up (docs/architecture.md "Wake-ups"):
// poll (the default: no trigger, writers pay nothing, the relays look every --poll-interval) or
// notify (the insert trigger notifies a waiting relay; run the relays with --notify).
func wakeupsCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	set := len(args) > 0 && args[0] == "set"
	mode := ""
	if set {
		if len(args) < 2 || (args[1] != "notify" && args[1] != "poll") {
			fmt.Fprintf(stderr, "relay wakeups set: want \"notify\" or \"poll\"\n")
			return 2
		}
		mode, args = args[1], args[2:]
	}
	var lockWait time.Duration
	db, t, log, red, code := dbCommand("wakeups", args, getenv, stderr, func(fs *flag.FlagSet) {
		if set {
			fs.DurationVar(&lockWait, "lock-wait", 2*time.Second, "how long to wait for the table's lock behind inserts in progress")
		}
	})
	if code >= 0 {
		return code
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if set {
		changed, err := outboxdb.SetNotify(ctx, db, t, mode == "notify", lockWait)
		if err != nil {
			log.Error("wakeups set failed (the table is as it was)", "err", red.Error(err))
			return 1
		}
		log.Info("wakeups set", "table", t.String(), "mode", mode, "changed", changed)
	}
	on, err := outboxdb.Notifies(ctx, db, t)
	if err != nil {
		log.Error("reading the wake-ups failed", "err", red.Error(err))
		return 1
	}
	if on {
		fmt.Fprintf(stdout, "%s: notify (inserts notify a waiting relay)\n", t)
	} else {
		fmt.Fprintf(stdout, "%s: poll (no insert trigger: run the relays without --notify)\n", t)
	}
	return 0
}

// wakeupsName names a wake-up mode as relay wakeups does.
func wakeupsName(notify bool) string {
	if notify {
		return "notify"
	}
	return "poll"
}
