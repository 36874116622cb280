package relay

import (
	"context"
	"fmt"
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

// TestLargeTransactionOpenAtSnapshot (snapshot tracking): one transaction inserts 100,000
// events in several statements while the relay polls, so it is open at the older snapshot of the
// batch that publishes it and its events are found by its transaction id. They are read in
// chunks through the (txid, id) index (a lookup of all of them per fetch made a 2M-event
// transaction take minutes in make bench), in order, nothing lost.
func TestLargeTransactionOpenAtSnapshot(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.bigtx", 3)
	c := newCollector(t, k, topic)
	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
	cfg.PollInterval = 50 * time.Millisecond
	r := startRelay(t, cfg, "snapshot")
	waitFor(t, 30*time.Second, "relay readiness", r.Ready)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	const parts, per, aggs = 5, 20_000, 1_000
	claims := metricValue(t, r.metrics.claims)
	for i := range parts {
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'agg-' || (g % $2), 'Seq', jsonb_build_object('agg', 'agg-' || (g % $2), 'seq', g / $2 + 1)
FROM generate_series($1::int, $1::int + $3 - 1) AS g`, i*per, aggs, per); err != nil {
			t.Fatal(err)
		}
	}
	// The relay went on polling (claiming waits) while the transaction was open.
	waitFor(t, 10*time.Second, "the relay to poll while the transaction is open", func() bool { return metricValue(t, r.metrics.claims) > claims })
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.waitDistinct(t, parts*per, 2*time.Minute)
	t.Logf("%d events of one transaction open at the older snapshot published in %s", parts*per, time.Since(start).Round(time.Millisecond))
	want := map[string]int{}
	for a := range aggs {
		want[fmt.Sprintf("agg-%d", a)] = parts * per / aggs
	}
	if dups := checkOrder(t, c.recs, want); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
}
