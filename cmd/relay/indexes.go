package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/outbox-operator/outbox-operator/internal/redact"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// indexesCmd shows or sets the table's pending index for a tracking mode (outboxdb/indexes.go),
// as the operator does for an OutboxRelay: snapshot drops it once the snapshot cursor has passed
// its first batch, row builds it (CONCURRENTLY, a partition at a time, resumable). With --shards
// it sets the bucket index for that many shards (outboxdb/bucket_index.go): 1 drops it (only
// while the layout has one shard), more builds it.
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
	var (
		lockWait time.Duration
		shards   int
	)
	db, t, log, red, code := dbCommand("indexes", args, getenv, stderr, func(fs *flag.FlagSet) {
		if set {
			fs.DurationVar(&lockWait, "lock-wait", 2*time.Second, "how long to wait for the table's lock behind inserts in progress")
			fs.IntVar(&shards, "shards", 0, "the most shards the table's relays run: 1 drops the bucket index, more builds it (0: leave it)")
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
	if code := setBucketIndex(ctx, db, t, shards, lockWait, log, red); code != 0 {
		return code
	}
	switch {
	case s.Valid:
		fmt.Fprintf(stdout, "%s: pending index (row tracking reads it; snapshot tracking does without)\n", t)
	case s.Exists:
		fmt.Fprintf(stdout, "%s: pending index incomplete, missing on %s (relay indexes set row resumes the build)\n", t, strings.Join(s.Missing, ", "))
	default:
		fmt.Fprintf(stdout, "%s: no pending index (snapshot tracking; relay indexes set row builds it)\n", t)
	}
	b, err := outboxdb.ReadBucketIndex(ctx, db, t)
	if err != nil {
		log.Error("reading the indexes failed", "err", red.Error(err))
		return 1
	}
	switch {
	case b.Valid:
		fmt.Fprintf(stdout, "%s: bucket index (the shards of a layout of several read it; one shard does without)\n", t)
	case b.Exists:
		fmt.Fprintf(stdout, "%s: bucket index incomplete, missing on %s (relay indexes set --shards N, N > 1, resumes the build)\n", t, strings.Join(b.Missing, ", "))
	default:
		fmt.Fprintf(stdout, "%s: no bucket index (one shard; relay layout set --shards N builds it before it reshards)\n", t)
	}
	return 0
}

// setBucketIndex drops (shards 1) or builds (more) the bucket index; 0 leaves it.
func setBucketIndex(ctx context.Context, db *sql.DB, t outboxdb.Table, shards int, lockWait time.Duration, log *slog.Logger, red *redact.Redactor) int {
	switch {
	case shards == 1:
		dropped, err := outboxdb.DropBucketIndex(ctx, db, t, lockWait)
		if err != nil {
			log.Error("dropping the bucket index failed (the table is as it was)", "err", red.Error(err))
			return 1
		}
		if dropped {
			log.Info("dropped the bucket index")
		} else if b, err := outboxdb.ReadBucketIndex(ctx, db, t); err == nil && b.Exists {
			log.Error("the bucket index stays while the table's layout has (or is moving to) several shards, or has none yet")
			return 1
		}
	case shards > 1:
		built, err := outboxdb.EnsureBucketIndexFor(ctx, db, t, int32(shards), lockWait)
		if err != nil {
			log.Error("building the bucket index failed (run this again to resume)", "err", red.Error(err))
			return 1
		}
		if built {
			log.Info("built the bucket index")
		}
	}
	return 0
}
