package relay

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outbox"
)

// TestExactlyOnceRecordsDeadLettersOfALevelRecord: a shard's committed cursor record whose
// position is level with the database's cursor, and whose dead letters the database has not
// recorded, has them recorded when the next relay starts. That is what a relay leaves that ends
// between the commit and the database's copy of a batch read from the parked table (such a batch
// moves no position): TestExactlyOnceCrash met it in 1 run of several, 9 of 506 dead letters
// unrecorded. Here the state is made directly: a relay dead-letters a poison event and stops
// (the record and the database level, the dead letter recorded), and the dead letter's row is
// deleted; the next relay's first publication follows its reconciliation, after which the
// database must hold the row again.
func TestExactlyOnceRecordsDeadLettersOfALevelRecord(t *testing.T) {
	url, pool, k, events, cursors, _, args := exactlyOnceDeadLetters(t, "relay.eosdead", 3)
	ctx := context.Background()
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{c: k.NewCommittedConsumer(t, events), byEvent: map[string]int{}}
	if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: "a", Seq: 1}, {Agg: "b", Seq: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := appendSeq(ctx, pool, w, "unrouted", []seqEvent{{Agg: "poison", Seq: 1}}); err != nil {
		t.Fatal(err)
	}
	deadRows := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_dead_lettered`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	first := startProc(t, url, args...)
	waitFor(t, time.Minute, "the poison event recorded as dead-lettered", func() bool { return deadRows() == 1 })
	c.waitDistinct(t, 2, time.Minute)
	if code := first.terminate(30 * time.Second); code != 0 {
		t.Fatalf("relay exit code %d after SIGTERM", code)
	}
	var poisonID int64
	if err := pool.QueryRow(ctx, `SELECT id FROM outbox_dead_lettered`).Scan(&poisonID); err != nil {
		t.Fatal(err)
	}
	// The commit's markers reach the cursor topic shortly after the commit returns: the record
	// is read until it is there.
	var rec *txnCursor
	waitFor(t, 30*time.Second, "the last committed cursor record to carry the dead letter", func() bool {
		rec = committedRecord(t, k, cursors, oneShardID(t, pool))
		return rec != nil && slices.ContainsFunc(rec.Dead, func(d txnDead) bool { return d.ID == poisonID })
	})
	if _, err := pool.Exec(ctx, `DELETE FROM outbox_dead_lettered`); err != nil {
		t.Fatal(err)
	}

	second := startProc(t, url, args...)
	if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: "a", Seq: 2}}); err != nil {
		t.Fatal(err)
	}
	c.waitDistinct(t, 3, time.Minute) // published after the tenure's reconciliation
	if code := second.terminate(30 * time.Second); code != 0 {
		t.Fatalf("relay exit code %d after SIGTERM", code)
	}
	if n := deadRows(); n != 1 {
		t.Fatalf("after the next relay: %d rows in outbox_dead_lettered, want the record's dead letter recorded again", n)
	}
}
