package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// insertsCmd shows or sets whether plain INSERTs into the table take the aggregate's lock
// (migration 00019): locked (a BEFORE INSERT trigger takes the writer libraries' lock and draws
// the id after it: plain INSERTs keep per-aggregate commit order) or plain (the default: only the
// libraries and <table>_append take it).
func insertsCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	set := len(args) > 0 && args[0] == "set"
	mode := ""
	if set {
		if len(args) < 2 || (args[1] != "locked" && args[1] != "plain") {
			fmt.Fprintf(stderr, "relay inserts set: want \"locked\" or \"plain\"\n")
			return 2
		}
		mode, args = args[1], args[2:]
	}
	var lockWait time.Duration
	db, t, log, red, code := dbCommand("inserts", args, getenv, stderr, func(fs *flag.FlagSet) {
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
		changed, err := outboxdb.SetLockedInserts(ctx, db, t, mode == "locked", lockWait)
		if err != nil {
			log.Error("inserts set failed (the table is as it was)", "err", red.Error(err))
			return 1
		}
		log.Info("inserts set", "mode", mode, "changed", changed)
	}
	on, err := outboxdb.LockedInserts(ctx, db, t)
	if err != nil {
		log.Error("reading the inserts' mode failed", "err", red.Error(err))
		return 1
	}
	if on {
		fmt.Fprintf(stdout, "%s: locked (a plain INSERT takes its aggregate's lock, as outbox.Append and %s_append do)\n", t, t.Name)
	} else {
		fmt.Fprintf(stdout, "%s: plain (only outbox.Append and %s_append take the aggregate's lock)\n", t, t.Name)
	}
	return 0
}
