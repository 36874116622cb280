package outboxdb_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// TestPartitionUpkeepDoesNotStallInserts holds an application transaction open on the outbox (it
// appended an event and has not committed) while the partition upkeep runs, and meanwhile other
// sessions keep inserting; their insert latency and the database's catalog are the observers.
// Creating the partitions of the days ahead must not wait for the transaction (it attaches tables
// instead of CREATE TABLE ... PARTITION OF, which needs the table's ACCESS EXCLUSIVE lock and, behind
// the transaction, would queue every insert until it ends). Dropping a partition past retention
// still needs that lock: it must give up within its bounded wait (ErrPartitionBusy) rather than
// stall the inserts for as long as the transaction lasts, and succeed once the transaction ended.
func TestPartitionUpkeepDoesNotStallInserts(t *testing.T) {
	ctx := context.Background()
	db, _ := openDB(t)
	tb := outboxdb.MustParseTable("outbox")
	if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
		t.Fatal(err)
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	old := today.AddDate(0, 0, -10)
	if _, err := outboxdb.EnsurePartitions(ctx, db, tb, old, today); err != nil {
		t.Fatal(err)
	}
	insert(t, db, tb, old.Add(time.Hour), true)
	name := func(d time.Time) string { return "outbox_p" + d.Format("20060102") }

	long, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback() }()
	if _, err := long.Exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'long', 'OrderCreated', '{}')`); err != nil {
		t.Fatal(err)
	}

	// Other sessions insert throughout the upkeep.
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		slowest time.Duration
		inserts int
		werr    error
	)
	stop := make(chan struct{})
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				_, err := db.Exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'OrderCreated', '{}')`,
					fmt.Sprintf("w%d-%d", w, i))
				d := time.Since(start)
				mu.Lock()
				inserts++
				slowest = max(slowest, d)
				if err != nil && werr == nil {
					werr = err
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	stopWriters := func() {
		close(stop)
		wg.Wait()
		if werr != nil {
			t.Fatalf("insert: %v", werr)
		}
	}

	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	created, err := outboxdb.EnsurePartitions(cctx, db, tb, today, today.AddDate(0, 0, 5))
	createTook := time.Since(start)
	if err != nil {
		stopWriters()
		t.Fatalf("creating partitions while a transaction holds the outbox: %v (after %s)", err, createTook)
	}
	if len(created) != 5 {
		t.Errorf("created %v, want the 5 days after today", created)
	}
	start = time.Now()
	err = outboxdb.DropPartition(cctx, db, tb, name(old))
	dropTook := time.Since(start)
	time.Sleep(100 * time.Millisecond) // inserts after the drop gave up, for the count below
	stopWriters()
	if !errors.Is(err, outboxdb.ErrPartitionBusy) {
		t.Fatalf("dropping a partition while a transaction holds the outbox: %v after %s, want ErrPartitionBusy", err, dropTook)
	}
	t.Logf("while a transaction held the outbox: created %d partitions in %s, the drop gave up after %s; %d inserts from other sessions, the slowest took %s",
		len(created), createTook.Round(time.Millisecond), dropTook.Round(time.Millisecond), inserts, slowest.Round(time.Millisecond))
	if slowest > 750*time.Millisecond {
		t.Errorf("an insert took %s: partition upkeep made the application wait", slowest)
	}
	if inserts < 20 {
		t.Errorf("only %d inserts during the upkeep: the test did not measure them", inserts)
	}

	if err := long.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := outboxdb.DropPartition(ctx, db, tb, name(old)); err != nil {
		t.Fatalf("dropping once the transaction ended: %v", err)
	}
	var gone bool
	if err := db.QueryRow(`SELECT to_regclass($1) IS NULL`, "public."+name(old)).Scan(&gone); err != nil || !gone {
		t.Fatalf("partition %s still exists (%v)", name(old), err)
	}
}
