package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// cursorCmd is `relay cursor [reset --to now|oldest --reason TEXT]`: it shows the table's
// snapshot-tracking cursor, or replaces it (relays stopped) and then shows it.
func cursorCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	reset := len(args) > 0 && args[0] == "reset"
	if reset {
		args = args[1:]
	}
	var to, reason string
	db, t, log, red, code := dbCommand("cursor", args, getenv, stderr, func(fs *flag.FlagSet) {
		if reset {
			fs.StringVar(&to, "to", "", "now (skip every event not yet published) or oldest (publish every retained event again)")
			fs.StringVar(&reason, "reason", "", "why: recorded in <table>_relay_cursor_resets")
		}
	})
	if code >= 0 {
		return code
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if reset {
		if to != outboxdb.ResetToNow && to != outboxdb.ResetToOldest {
			fmt.Fprintf(stderr, "relay cursor reset: --to %q: want %q or %q\n", to, outboxdb.ResetToNow, outboxdb.ResetToOldest)
			return 2
		}
		if strings.TrimSpace(reason) == "" {
			fmt.Fprintf(stderr, "relay cursor reset: --reason is required (it is recorded)\n")
			return 2
		}
		skipped, err := outboxdb.ResetCursor(ctx, db, t, to, reason)
		if err != nil {
			log.Error("cursor reset failed", "err", red.Error(err))
			return 1
		}
		log.Warn("cursor reset", "to", to, "reason", reason, "skipped_events", skipped)
		fmt.Fprintf(stdout, "%s: cursor reset to %s (%d events skipped)\n", t, to, skipped)
	}
	rows, err := outboxdb.ReadCursor(ctx, db, t)
	if err != nil {
		log.Error("reading the cursor failed", "err", red.Error(err))
		return 1
	}
	if len(rows) == 0 {
		fmt.Fprintf(stdout, "%s: tracked by row (no snapshot cursor)\n", t)
		return 0
	}
	fmt.Fprintf(stdout, "%s: tracked by snapshot, %d cursor rows\n", t, len(rows))
	for _, c := range rows {
		snap := c.Snap
		if snap == "" {
			snap = "(before the first batch)"
		}
		fmt.Fprintf(stdout, "  %d buckets: at %s", len(c.Buckets), snap)
		if c.Next != "" {
			fmt.Fprintf(stdout, ", batch to %s done up to id %d", c.Next, c.LastID)
		}
		if !c.SameSystem {
			fmt.Fprint(stdout, " [another database: reset needed]")
		}
		fmt.Fprintf(stdout, ", updated %s\n", c.UpdatedAt.UTC().Format(time.RFC3339))
	}
	return 0
}
