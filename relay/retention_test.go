package relay

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// TestRetentionAcrossMidnight (snapshot tracking): created_at defaults to the transaction's
// start, so a transaction that began before midnight inserts into yesterday's partition after
// midnight, with a transaction id above every snapshot taken at midnight. Such a transaction
// (its row dated yesterday, explicitly) stays open while other events flow and the cursor moves
// on: yesterday's partition, past retention, is kept (not droppable, and a drop is refused)
// until the transaction committed and the cursor passed it; then its event is published and the
// partition goes.
func TestRetentionAcrossMidnight(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.midnight", 3)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	today := time.Now().UTC().Truncate(24 * time.Hour)
	yesterday := today.AddDate(0, 0, -1)
	if _, err := outboxdb.EnsurePartitions(ctx, db, testTable, yesterday, today); err != nil {
		t.Fatal(err)
	}
	part := "outbox_p" + yesterday.Format("20060102")
	c := newCollector(t, k, topic)
	startRelay(t, withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot), "snapshot")
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}

	// The transaction that began "before midnight".
	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	p, _ := json.Marshal(seqEvent{Agg: "late", Seq: 1})
	if _, err := late.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		VALUES ('order', 'late', 'Seq', $1, $2)`, p, today.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	// Events of today flow, and the cursor moves past them.
	if err := seqtest.Append(ctx, pool, w, "order", []seqEvent{{Agg: "today", Seq: 1}, {Agg: "today", Seq: 2}}); err != nil {
		t.Fatal(err)
	}
	c.waitDistinct(t, 2, 30*time.Second)
	// The late row is not committed: no other session sees it pending.
	waitFor(t, 10*time.Second, "the cursor to pass today's events", func() bool { return pendingRows(t, pool) == 0 })

	droppable := func() bool {
		names, err := outboxdb.DroppablePartitions(ctx, db, testTable, time.Nanosecond)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(names, part)
	}
	if droppable() {
		t.Fatalf("%s is droppable while a transaction that writes into it is open", part)
	}
	// Refused either way: the drop does not get the partition's lock within its timeout (the
	// transaction holds it), or, had it got it, it would find the transaction's row pending.
	if err := outboxdb.DropPartition(ctx, db, testTable, part); !errors.Is(err, outboxdb.ErrPartitionBusy) && !errors.Is(err, outboxdb.ErrPartitionHasPending) {
		t.Fatalf("dropping %s while a transaction writes into it: %v", part, err)
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitDistinct(t, 3, 30*time.Second)
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	// The relay writes a cursor that only moved past empty batches at most once a second.
	waitFor(t, 10*time.Second, "the partition to become droppable", droppable)
	if err := outboxdb.DropPartition(ctx, db, testTable, part); err != nil {
		t.Fatalf("dropping %s once its events are published: %v", part, err)
	}
	checkOrder(t, c.recs, map[string]int{"late": 1, "today": 2})
}
