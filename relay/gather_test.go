package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outbox"
)

// TestGatherByLatencyBudget: at a steady low rate (single-event transactions every 1-3 ms, seed
// logged) a polling relay with a latency budget (--max-delay 40ms) publishes what commits within
// the budget together, and one without (0) publishes nearly every commit on its own. The broker's
// record batches, one per partition per produce request, are counted by an independent client
// (kafkatest.CountBatches) on a one-partition topic; every event must arrive, in order per
// aggregate. The control run shows that the count can fail: the same load without a budget.
func TestGatherByLatencyBudget(t *testing.T) { forEachTracking(t, testGather) }

func testGather(t *testing.T, tracking Tracking) {
	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	perBatch := map[time.Duration]float64{}
	for _, budget := range []time.Duration{0, 40 * time.Millisecond} {
		url, pool, k, topic := newTopicDB(t, "relay.gather", 1)
		cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
		cfg.Notify, cfg.PollInterval, cfg.MaxDelay = false, 10*time.Millisecond, budget
		r := startRelay(t, cfg, fmt.Sprintf("budget %s", budget))
		waitFor(t, 30*time.Second, "the relay ready", r.Ready)
		w, err := outbox.New(testTable.String())
		if err != nil {
			t.Fatal(err)
		}
		const events, aggs = 600, 8
		want := map[string]int{}
		ctx := context.Background()
		for i := range events {
			agg := fmt.Sprintf("g-%d", i%aggs)
			want[agg]++
			if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: agg, Seq: want[agg]}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Duration(1000+rng.IntN(2000)) * time.Microsecond) // the pace of the load, not a wait for a result
		}
		c := newCollector(t, k, topic)
		c.waitDistinct(t, events, time.Minute)
		checkOrder(t, c.recs, want)
		records, batches := k.CountBatches(t, topic)
		perBatch[budget] = float64(records) / float64(batches)
		gathered := metricValue(t, r.metrics.gathered)
		t.Logf("budget %s: %d records in %d record batches (%.1f per batch); the relay gathered for %.2f s",
			budget, records, batches, perBatch[budget], gathered)
		if budget == 0 && gathered != 0 {
			t.Errorf("without a budget the relay gathered for %.3f s", gathered)
		}
		r.stop(t)
	}
	if off, on := perBatch[0], perBatch[40*time.Millisecond]; on < 5 || on < 3*off {
		t.Fatalf("events per record batch: %.1f with a budget of 40ms, %.1f without; want at least 5 and 3x", on, off)
	}
}
