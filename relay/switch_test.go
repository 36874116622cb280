package relay

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// TestSwitchRowToSnapshot switches a table from row to snapshot tracking under load, the way a
// rolling update does: the row relay stops (SIGTERM semantics) with a backlog left, the snapshot
// relay's first batch publishes every row still unsent, and it goes on from its snapshot. Nothing
// is lost, nothing duplicated, order holds. Once the cursor has passed its first batch, the
// table's pending index is dropped under the load, as the operator does (row tracking's index:
// the snapshot relay then reads ids from the primary key), and the relay goes on without it. A
// row relay started afterwards refuses the table.
func TestSwitchRowToSnapshot(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.switch", 3)
	c := newCollector(t, k, topic)
	ctx := context.Background()
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	// A backlog the row relay does not finish, and writers that go on throughout.
	insertBacklog(t, url, 20_000, 1_000, "order")
	load := seqtest.StartLoad(ctx, pool, w, "order", 300, 2, 10, 5*time.Millisecond)

	rowCfg := testConfig(url, k.Brokers, topic)
	rowCfg.BatchSize = 100
	row := startRelay(t, rowCfg, "row")
	waitFor(t, 30*time.Second, "the row relay to publish", func() bool { return metricValue(t, row.metrics.published) > 2000 })
	row.stop(t)
	left := pendingRows(t, pool)
	if left == 0 {
		t.Fatal("the row relay left no backlog: the switch is not exercised")
	}

	snap := startRelay(t, withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot), "snapshot")
	waitFor(t, 30*time.Second, "the snapshot relay to publish", func() bool { return metricValue(t, snap.metrics.published) > 1000 })
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	var idx outboxdb.PendingIndexState
	waitFor(t, time.Minute, "the cursor to pass its first batch (the backlog)", func() bool {
		if idx, err = outboxdb.ReadPendingIndex(ctx, db, testTable); err != nil {
			t.Fatal(err)
		}
		return idx.SnapshotStarted
	})
	if !idx.Exists || load.Written() == 0 {
		t.Fatalf("the pending index before the drop: %+v; writers wrote %d", idx, load.Written())
	}
	if dropped, err := outboxdb.DropPendingIndex(ctx, db, testTable, 5*time.Second); err != nil || !dropped {
		t.Fatalf("dropping the pending index under load: %v, %v", dropped, err)
	}
	atDrop := load.Written()
	waitFor(t, 30*time.Second, "the writers to go on after the drop", func() bool { return load.Written() > atDrop+500 })
	want := load.Stop(t)
	for a := range 1_000 {
		want[fmt.Sprintf("agg-%d", a)] = 20 // the backlog: 20 events of each of 1,000 aggregates
	}
	total := 20_000 + load.Written()
	c.waitDistinct(t, total, 2*time.Minute)
	c.poll(t, 500*time.Millisecond)
	if dups := checkOrder(t, c.recs, want); dups != 0 {
		t.Errorf("%d duplicates across the switch", dups)
	}
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	snap.stop(t)
	t.Logf("switched with %d events unsent, dropped the pending index with %d written: %d events in all, 0 lost, 0 duplicated", left, atDrop, total)

	// Back to row tracking: refused, with the reason, and nothing published.
	back := startRelay(t, testConfig(url, k.Brokers, topic), "row again")
	waitFor(t, 10*time.Second, "the row relay to refuse", func() bool {
		return strings.Contains(back.notReadyReason(), "tracked by snapshot")
	})
	if back.Ready() || metricValue(t, back.metrics.published) != 0 {
		t.Error("a row relay publishes a table tracked by snapshot")
	}
}
