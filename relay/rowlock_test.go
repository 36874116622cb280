package relay

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outbox"
)

// TestLockedRowIsWaitedFor: another session (an admin about to fix a poison row) holds the row
// lock of an aggregate's first unsent event while later events of that aggregate are committed.
// The row-tracking relay must wait for that row, not skip it: pg_locks shows its backend waiting
// for the admin's transaction, the independent consumer sees none of the aggregate's events while
// the lock is held, and once it is released it sees all of them in order. (With SKIP LOCKED the
// later events went out first.)
func TestLockedRowIsWaitedFor(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.rowlock", 3)
	ctx := context.Background()
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: "a", Seq: 1}}); err != nil {
		t.Fatal(err)
	}
	admin, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Rollback(ctx)
	var locked int64
	if err := admin.QueryRow(ctx, `SELECT id FROM outbox WHERE aggregate_id = 'a' FOR UPDATE`).Scan(&locked); err != nil {
		t.Fatal(err)
	}
	if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: "a", Seq: 2}, {Agg: "a", Seq: 3}}); err != nil {
		t.Fatal(err)
	}

	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackRow)
	r := startRelay(t, cfg, "relay")
	var adminXid string
	if err := admin.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&adminXid); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the relay's fetch to wait for the admin's row lock (pg_locks)", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
  WHERE locktype = 'transactionid' AND transactionid::text = $1 AND NOT granted)`, adminXid).Scan(&waiting)
		return err == nil && waiting
	})
	c := newCollector(t, k, topic)
	c.poll(t, 2*time.Second) // the lock is held: nothing of aggregate a may arrive
	if len(c.recs) != 0 {
		t.Fatalf("%d events published while the aggregate's first event was locked by another session", len(c.recs))
	}
	if err := admin.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitDistinct(t, 3, 30*time.Second)
	if dups := checkOrder(t, c.recs, map[string]int{"a": 3}); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	if !r.Ready() {
		t.Error("the relay is not ready after the lock was released")
	}
	t.Logf("event %d locked by another session: the relay waited for it (pg_locks), published nothing meanwhile, then all 3 in order", locked)
}
