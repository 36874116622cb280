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

// indexesCmd shows or sets the table's pending index for a tracking mode (outboxdb/indexes.go),
// as the operator does for an OutboxRelay: snapshot drops it once the snapshot cursor has passed
// its first batch, row builds it (CONCURRENTLY, a partition at a time, resumable).
func indexesCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	set := len(args) > 0 && args[0] == "set"
	mode := ""
	if set {
		if len(args) < 2 || (args[1] != "snapshot" && args[1] != "row") {
			fmt.Fprintf(stderr, "relay indexes set: want \"snapshot\" or \"row\" (the table's tracking mode)\n")
			return 2
		}
		mode, args = args[1], args[2:]
	}
	var lockWait time.Duration
	db, t, log, red, code := dbCommand("indexes", args, getenv, stderr, func(fs *flag.FlagSet) {
		if set {
			fs.DurationVar(&lockWait, "lock-wait", 2*time.Second, "how long to wait for the table's lock behind inserts in progress")
		}
	})
	if code >= 0 {
		return code
	}
	defer db.Close()
	// A build reads every partition; no bound but the caller's.
	s, err := outboxdb.ReadPendingIndex(ctx, db, t)
	if err != nil {
		log.Error("reading the indexes failed", "err", red.Error(err))
		return 1
	}
	switch {
	case mode == "snapshot" && !s.SnapshotStarted && s.Exists:
		log.Error("the pending index stays until every snapshot cursor row has passed its first batch (which reads the lowest unsent id): start the snapshot relays, then run this again")
		return 1
	case mode == "snapshot" && s.Exists:
		if _, err := outboxdb.DropPendingIndex(ctx, db, t, lockWait); err != nil {
			log.Error("dropping the pending index failed (the table is as it was)", "err", red.Error(err))
			return 1
		}
		log.Info("dropped the pending index")
	case mode == "row" && !s.Valid:
		if _, err := outboxdb.BuildPendingIndex(ctx, db, t, lockWait, 0); err != nil {
			log.Error("building the pending index failed (run this again to resume)", "err", red.Error(err))
			return 1
		}
		log.Info("built the pending index")
	}
	if mode != "" {
		if s, err = outboxdb.ReadPendingIndex(ctx, db, t); err != nil {
			log.Error("reading the indexes failed", "err", red.Error(err))
			return 1
		}
	}
	switch {
	case s.Valid:
		fmt.Fprintf(stdout, "%s: pending index (row tracking reads it; snapshot tracking does without)\n", t)
	case s.Exists:
		fmt.Fprintf(stdout, "%s: pending index incomplete, missing on %s (relay indexes set row resumes the build)\n", t, strings.Join(s.Missing, ", "))
	default:
		fmt.Fprintf(stdout, "%s: no pending index (snapshot tracking; relay indexes set row builds it)\n", t)
	}
	return 0
}
