package outboxdb_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestPartitionUpkeepDoesNotStallInserts holds an application transaction open on the outbox (it
// appended an event and has not committed) while the partition upkeep runs, and meanwhile other
// sessions keep inserting; the lock waits PostgreSQL shows (pg_stat_activity.wait_event_type =
// 'Lock', pg_locks not granted, pg_blocking_pids) and the database's catalog are the observers.
// Creating the partitions of the days ahead must not wait for the transaction (it attaches tables
// instead of CREATE TABLE ... PARTITION OF, which needs the table's ACCESS EXCLUSIVE lock and, behind
// the transaction, would queue every insert until it ends). Dropping a partition past retention
// still needs that lock: inserts queue behind its request, and it must give up within its bounded
// wait (ErrPartitionBusy) rather than stall them for as long as the transaction lasts, so the
// inserts go on while the transaction is still open; the drop succeeds once the transaction ended.
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
	var longPID int
	if err := long.QueryRow(`SELECT pg_backend_pid()`).Scan(&longPID); err != nil {
		t.Fatal(err)
	}

	// Other sessions insert throughout the upkeep.
	const insertSQL = `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'OrderCreated', '{}')`
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		slowest time.Duration
		inserts int
		werr    error
	)
	count := func() int { mu.Lock(); defer mu.Unlock(); return inserts }
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
				_, err := db.Exec(insertSQL, fmt.Sprintf("w%d-%d", w, i))
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
	// Every lock wait of the database while the upkeep runs, judged at the end.
	var (
		seenMu sync.Mutex
		seen   []pgtest.LockWait
	)
	isDrop := func(w pgtest.LockWait) bool { return strings.Contains(w.Query, tb.Derived("drop_partition")+"(") }
	isInsert := func(w pgtest.LockWait) bool { return w.Query == insertSQL }
	behindDrop := func() (drop, inserts bool) { // in one sample: the drop behind the transaction, inserts behind the drop
		seenMu.Lock()
		defer seenMu.Unlock()
		drops := map[int]bool{}
		for _, w := range seen {
			if isDrop(w) && w.BlockedBy(longPID) && w.Relation == "outbox" && w.Mode == "AccessExclusiveLock" {
				drops[w.PID], drop = true, true
			}
		}
		for _, w := range seen {
			for _, b := range w.Blockers {
				inserts = inserts || (isInsert(w) && drops[b])
			}
		}
		return drop, inserts
	}
	stopWatch := pgtest.WatchLocks(ctx, db, 2*time.Millisecond, func(ws []pgtest.LockWait) {
		seenMu.Lock()
		seen = append(seen, ws...)
		seenMu.Unlock()
	})
	t.Cleanup(func() { _ = stopWatch() })
	for count() < 4 { // the writers run
		time.Sleep(time.Millisecond)
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
	// The drop gives up behind the transaction; until a sample has seen inserts queued behind it
	// (the wait this test is about), it is tried again.
	attempts := 0
	for {
		attempts++
		start = time.Now()
		err = outboxdb.DropPartition(cctx, db, tb, name(old))
		if !errors.Is(err, outboxdb.ErrPartitionBusy) {
			stopWriters()
			t.Fatalf("dropping a partition while a transaction holds the outbox: %v after %s, want ErrPartitionBusy", err, time.Since(start))
		}
		if drop, ins := behindDrop(); (drop && ins) || attempts == 20 {
			break
		}
	}
	// Once the drop gave up, the inserts go on while the transaction is still open.
	after := count()
	for count() < after+4 && cctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	if cctx.Err() != nil {
		t.Errorf("the inserts did not go on after the drop gave up: %d, then %d", after, count())
	}
	stopWriters()
	if err := stopWatch(); err != nil {
		t.Fatal(err)
	}

	drops := map[int]bool{}
	for _, w := range seen {
		if isDrop(w) {
			drops[w.PID] = true
		}
	}
	var (
		queued  int
		longest = -1.0
	)
	for _, w := range seen {
		switch {
		case isDrop(w):
			continue
		case w.BlockedBy(longPID):
			t.Errorf("waited for the open transaction: %s", w)
		case isInsert(w) && w.LockType == "relation": // not their own queue at commit (notifications)
			for _, b := range w.Blockers {
				if !drops[b] {
					t.Errorf("an insert waited for something other than the drop's request: %s", w)
				}
			}
			queued++
			longest = max(longest, w.Waited)
		}
	}
	if drop, ins := behindDrop(); !drop || !ins {
		t.Errorf("in %d attempts, the drop waiting for the transaction seen: %t, inserts queued behind it seen: %t; the test did not observe the wait it is about", attempts, drop, ins)
	}
	// How long the queued inserts waited, as PostgreSQL dates their waits (pg_locks.waitstart, 14
	// and later; a lower bound, however late a sample ran): about the drop's 250 ms, with room for a
	// loaded machine; a drop whose wait were seconds long, or not bounded, would exceed it.
	if longest > 2 {
		t.Errorf("an insert waited %.3f s behind the drop's request, whose wait is bounded at 250 ms", longest)
	}
	t.Logf("while a transaction held the outbox: created %d partitions in %s; %d drop attempt(s) gave up; %d inserts from other sessions (the slowest took %s), in %d samples queued behind the drop, at most %.3f s by PostgreSQL's clock",
		len(created), createTook.Round(time.Millisecond), attempts, count(), slowest.Round(time.Millisecond), queued, longest)

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
