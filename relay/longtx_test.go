package relay

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// TestLongTransaction holds a transaction that appended an event open for 30 s while writers
// commit: their events keep flowing (checked by the consumer while it is open, not only at the
// end), the long transaction's event is published once it commits, before the next event of
// its aggregate, and nothing is lost. Snapshot tracking lists such a transaction explicitly
// (it is open at the older snapshot of every batch meanwhile) instead of stalling behind it.
func TestLongTransaction(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	forEachTracking(t, func(t *testing.T, tracking Tracking) {
		t.Parallel()
		testLongTransaction(t, k, tracking)
	})
}

func testLongTransaction(t *testing.T, k *kafkatest.Cluster, tracking Tracking) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	topic := kafkatest.UniqueTopic("relay.longtx")
	k.CreateTopic(t, topic, 3)
	c := newCollector(t, k, topic)
	cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	cfg.BatchSize = 200
	r := startRelay(t, cfg, string(tracking))
	waitFor(t, 30*time.Second, "relay readiness", r.Ready)

	ctx := context.Background()
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	long, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback(ctx) }()
	if err := seqtest.AppendIn(ctx, long, w, "order", []seqEvent{{Agg: "long", Seq: 1}}); err != nil {
		t.Fatal(err)
	}
	opened := time.Now()

	load := seqtest.StartLoad(ctx, pool, w, "order", 200, 2, 10, 5*time.Millisecond)
	var checks int
	for time.Since(opened) < 30*time.Second {
		time.Sleep(2 * time.Second)
		written := load.Written()
		// Everything committed two seconds ago or earlier is on the topic, though the long
		// transaction, older than all of it, is still open.
		waitFor(t, 5*time.Second, "events committed while a long transaction is open", func() bool {
			c.poll(t, 100*time.Millisecond)
			return len(c.byEvent) >= written
		})
		checks++
	}
	all := load.Stop(t)
	if err := long.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := seqtest.Append(ctx, pool, w, "order", []seqEvent{{Agg: "long", Seq: 2}}); err != nil {
		t.Fatal(err)
	}
	all["long"] = 2
	total := load.Written() + 2
	c.waitDistinct(t, total, time.Minute)
	if dups := checkOrder(t, c.recs, all); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	t.Logf("%s: %d events published while a transaction stayed open 30 s (%d checks that nothing stalled); its event followed on commit",
		tracking, total, checks)
}
