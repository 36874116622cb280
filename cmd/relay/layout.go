package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/outbox-operator/outbox-operator/internal/redact"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// layoutCmd is `relay layout [set --shards N]`: it shows the table's shard layout, or reshards
// safely (outboxdb.Reshard) and then shows it.
func layoutCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	set := len(args) > 0 && args[0] == "set"
	if set {
		args = args[1:]
	}
	var (
		shards  int
		timeout time.Duration
	)
	db, t, log, red, code := dbCommand("layout", args, getenv, stderr, func(fs *flag.FlagSet) {
		if set {
			fs.IntVar(&shards, "shards", 0, "the shard count to move to, 1 to 256")
			fs.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the relays of the old layout to stand down")
		}
	})
	if code >= 0 {
		return code
	}
	defer db.Close()
	if set && (shards < 1 || shards > outboxdb.Buckets) {
		fmt.Fprintf(stderr, "relay layout set: --shards %d out of range: want 1 to %d\n", shards, outboxdb.Buckets)
		return 2
	}
	if set {
		// A layout of several shards reads the bucket index, which a table of one shard may do
		// without (outboxdb/bucket_index.go): build it first, CONCURRENTLY (writers go on); the
		// old layout publishes meanwhile. The build has no bound but the caller's.
		if shards > 1 {
			if s, err := outboxdb.ReadBucketIndex(ctx, db, t); err == nil && !s.Valid {
				log.Info("building the bucket index the shards of a layout of several read, a partition at a time, CONCURRENTLY (writers go on)")
			}
			if _, err := outboxdb.EnsureBucketIndexFor(ctx, db, t, int32(shards), 2*time.Second); err != nil {
				log.Error("building the bucket index failed (the layout is as it was; run this again to resume)", "err", red.Error(err))
				return 1
			}
		}
		rctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		l, err := outboxdb.Reshard(rctx, db, t, int32(shards), 20*time.Millisecond)
		if err != nil {
			if rctx.Err() != nil {
				// Leave the old layout publishing rather than a request nobody completes.
				cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer ccancel()
				if cur, rerr := outboxdb.ReadLayout(cctx, db, t); rerr == nil && cur != nil {
					_ = outboxdb.RequestLayout(cctx, db, t, cur.ShardCount)
				}
				log.Error("the relays of the old layout did not stand down in time; the request is withdrawn", "timeout", timeout.String())
				return 1
			}
			log.Error("layout set failed", "err", red.Error(err))
			return 1
		}
		log.Info("layout switched", "shards", l.ShardCount, "generation", l.Generation)
		// Wait a little for the relays of the new layout to take every bucket, to report the
		// pause; without relays running, the layout is printed as it is.
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		_, _ = outboxdb.WaitForPause(wctx, outboxdb.RealClock{}, db, t, l.Generation, 50*time.Millisecond)
		wcancel()
	}
	return printLayout(ctx, db, t, stdout, log, red)
}

// printLayout writes the table's layout, its last change and who holds its locks.
func printLayout(ctx context.Context, db *sql.DB, t outboxdb.Table, stdout io.Writer, log *slog.Logger, red *redact.Redactor) int {
	l, err := outboxdb.ReadLayout(ctx, db, t)
	if err != nil {
		log.Error("reading the layout failed", "err", red.Error(err))
		return 1
	}
	if l == nil {
		fmt.Fprintf(stdout, "%s: no shard layout yet (the operator sets it; a relay run with --shard-count=N sets N)\n", t)
		return 0
	}
	fmt.Fprintf(stdout, "%s: %d shards (generation %d)\n", t, l.ShardCount, l.Generation)
	if l.Requested != 0 {
		fmt.Fprintf(stdout, "  change to %d shards requested at %s\n", l.Requested, l.RequestedAt.UTC().Format(time.RFC3339))
	}
	if l.Previous != 0 {
		fmt.Fprintf(stdout, "  last change: %d -> %d shards at %s", l.Previous, l.ShardCount, l.SwitchedAt.UTC().Format(time.RFC3339))
		if pause, ok := l.Pause(); ok {
			fmt.Fprintf(stdout, ", publishing paused %d ms", pause.Milliseconds())
		} else {
			fmt.Fprint(stdout, ", the new layout does not hold every bucket yet")
		}
		fmt.Fprintln(stdout)
	}
	locks, err := outboxdb.ReadRelayLocks(ctx, db, t)
	if err != nil {
		log.Error("reading the relay locks failed", "err", red.Error(err))
		return 1
	}
	present := make([]int, 0, len(locks.Present))
	for k := range locks.Present {
		present = append(present, int(k))
	}
	slices.Sort(present)
	fmt.Fprintf(stdout, "  relays running: shards %v; buckets held: %d of %d\n", present, len(locks.Buckets), outboxdb.Buckets)
	return 0
}
