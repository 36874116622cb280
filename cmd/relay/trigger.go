package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// triggerCommand is a subcommand that shows or sets one of the table's triggers: relay wakeups
// (the insert trigger) and relay inserts (the lock trigger).
type triggerCommand struct {
	name    string // the subcommand
	on, off string // its modes: with the trigger, without
	read    func(context.Context, *sql.DB, outboxdb.Table) (bool, error)
	set     func(context.Context, *sql.DB, outboxdb.Table, bool, time.Duration) (bool, error)
	// says what the table does in each mode (a line of output, after "<table>: <mode> ").
	sayOn, sayOff func(t outboxdb.Table) string
}

// run is the subcommand: `relay NAME [flags]` shows the mode, `relay NAME set ON|OFF [flags]`
// sets it, waiting at most --lock-wait for the table's lock behind the inserts in progress.
func (tc triggerCommand) run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	set := len(args) > 0 && args[0] == "set"
	mode := ""
	if set {
		if len(args) < 2 || (args[1] != tc.on && args[1] != tc.off) {
			fmt.Fprintf(stderr, "relay %s set: want %q or %q\n", tc.name, tc.on, tc.off)
			return 2
		}
		mode, args = args[1], args[2:]
	}
	var lockWait time.Duration
	db, t, log, red, code := dbCommand(tc.name, args, getenv, stderr, func(fs *flag.FlagSet) {
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
		changed, err := tc.set(ctx, db, t, mode == tc.on, lockWait)
		if err != nil {
			log.Error(tc.name+" set failed (the table is as it was)", "err", red.Error(err))
			return 1
		}
		log.Info(tc.name+" set", "mode", mode, "changed", changed)
	}
	on, err := tc.read(ctx, db, t)
	if err != nil {
		log.Error("reading the table's "+tc.name+" failed", "err", red.Error(err))
		return 1
	}
	if on {
		fmt.Fprintf(stdout, "%s: %s %s\n", t, tc.on, tc.sayOn(t))
	} else {
		fmt.Fprintf(stdout, "%s: %s %s\n", t, tc.off, tc.sayOff(t))
	}
	return 0
}
