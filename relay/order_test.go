package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestOrderFourShards runs four relays (shards 0..3 of 4) in this process while eight writers
// append concurrently to 1,000 aggregates. Every event must arrive, each aggregate's events in
// sequence (after dropping duplicates by event_id; there must be none), each aggregate on one
// partition, and each relay must have published exactly the events of its own buckets.
func TestOrderFourShards(t *testing.T) {
	forEachTracking(t, testOrderFourShards)
}

func testOrderFourShards(t *testing.T, tracking Tracking) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.order")
	k.CreateTopic(t, topic, 6)
	c := newCollector(t, k, topic)

	const shards = 4
	relays := make([]*running, shards)
	for i := range shards {
		cfg := testConfig(url, k.Brokers, topic)
		cfg.ShardCount, cfg.ShardIndex = shards, i
		cfg.BatchSize = 100
		cfg.Tracking = tracking
		relays[i] = startRelay(t, cfg, fmt.Sprintf("shard %d", i))
	}
	for _, r := range relays {
		waitFor(t, 30*time.Second, "relay readiness", r.Ready)
	}

	const (
		aggregates = 1000
		writers    = 8
		rounds     = 40 // transactions per writer
		perTx      = 30 // events per transaction
	)
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	want := make([]map[string]int, writers)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	start := time.Now()
	for wr := range writers {
		want[wr] = map[string]int{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(wr), 7))
			// Writer wr owns the aggregates a with a % writers == wr, so it alone numbers their events.
			for range rounds {
				evs := make([]seqEvent, 0, perTx)
				for range perTx {
					a := fmt.Sprintf("agg-%04d", rnd.IntN(aggregates/writers)*writers+wr)
					want[wr][a]++
					evs = append(evs, seqEvent{Agg: a, Seq: want[wr][a]})
				}
				if err := appendSeq(ctx, pool, w, "order", evs); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := writers * rounds * perTx
	all := map[string]int{}
	for _, m := range want {
		for a, n := range m {
			all[a] = n
		}
	}
	c.waitDistinct(t, total, 2*time.Minute)
	t.Logf("%d events of %d aggregates written by %d writers and published by %d shards in %s",
		total, len(all), writers, shards, time.Since(start).Round(time.Millisecond))
	if dups := checkOrder(t, c.recs, all); dups != 0 {
		t.Errorf("%d duplicates without any crash", dups)
	}
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })

	// Each relay published the events of its own buckets, and only those.
	rows, err := pool.Query(ctx, `SELECT `+outboxdb.BucketExpr+` % 4, count(*) FROM outbox GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	perShard := map[int]int{}
	for rows.Next() {
		var s, n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		perShard[s] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for i, r := range relays {
		got := int(metricValue(t, r.metrics.published))
		if got != perShard[i] {
			t.Errorf("shard %d published %d events, its buckets hold %d", i, got, perShard[i])
		}
		if perShard[i] == 0 {
			t.Errorf("shard %d owns no event: the test does not exercise sharding", i)
		}
	}
}
