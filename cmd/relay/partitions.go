package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// exitDeferred is the exit status of `relay partitions prune` when a drop was deferred: nothing
// failed, but a scheduled job should run it again later.
const exitDeferred = 3

// partitionsCmd is `relay partitions ensure|prune`: it creates the daily partitions ahead, or drops
// the old ones whose rows are all sent (the SQL functions and drop loop the operator uses).
func partitionsCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "ensure" && args[0] != "prune") {
		fmt.Fprintf(stderr, "relay partitions: want \"ensure --days N\" or \"prune --retention 168h\"\n")
		return 2
	}
	sub, args := args[0], args[1:]
	var (
		days      int
		retention time.Duration
	)
	db, t, log, red, code := dbCommand("partitions "+sub, args, getenv, stderr, func(fs *flag.FlagSet) {
		if sub == "ensure" {
			fs.IntVar(&days, "days", outboxdb.DefaultPremakeDays, "create the partitions from today (UTC) to this many days ahead")
		} else {
			fs.DurationVar(&retention, "retention", outboxdb.DefaultRetention, "drop the partitions whose day ended longer ago than this, if all their rows are sent")
		}
	})
	if code >= 0 {
		return code
	}
	defer db.Close()
	if sub == "ensure" && (days < 0 || days > 366) {
		fmt.Fprintf(stderr, "relay partitions ensure: --days %d out of range: want 0 to 366\n", days)
		return 2
	}
	if sub == "prune" && retention <= 0 {
		fmt.Fprintf(stderr, "relay partitions prune: --retention must be positive, got %s\n", retention)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if sub == "ensure" {
		today := time.Now().UTC().Truncate(24 * time.Hour)
		created, err := outboxdb.EnsurePartitions(ctx, db, t, today, today.AddDate(0, 0, days))
		if err != nil {
			log.Error("partitions ensure failed", "err", red.Error(err))
			return 1
		}
		for _, p := range created {
			fmt.Fprintf(stdout, "created %s\n", p)
		}
		log.Info("partitions ensured", "from", today.Format(time.DateOnly), "days_ahead", days, "created", len(created))
		return 0
	}
	pruned, err := outboxdb.PrunePartitions(ctx, db, t, retention)
	for _, p := range pruned.Dropped {
		fmt.Fprintf(stdout, "dropped %s\n", p)
	}
	for _, p := range pruned.Pending {
		log.Warn("partition kept: it still holds unsent events", "partition", p)
	}
	for _, p := range pruned.Busy {
		log.Warn("partition kept for now: a transaction still uses the table (the drop waits at most 250 ms for its lock, so as not to stall inserts); run prune again later", "partition", p)
	}
	failed := err != nil
	if failed {
		log.Error("partitions prune failed", "err", red.Error(err))
	}
	names := slices.Concat(pruned.Dropped, pruned.Pending, pruned.Busy)
	log.Info("partitions pruned", "retention", retention.String(), "candidates", len(names))
	switch {
	case failed:
		return 1
	case len(pruned.Busy) > 0:
		return exitDeferred
	}
	return 0
}
