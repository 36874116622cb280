package relay

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// insertBacklog inserts n pending events over aggs aggregates with plain SQL (INSERT ... SELECT
// generate_series), payloads of about 200 bytes and a traceparent header.
func insertBacklog(t testing.TB, url string, n, aggs int, aggType string) {
	t.Helper()
	pool := newPool(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
SELECT $3, 'agg-' || (g % $2), 'Seq',
       jsonb_build_object('agg', 'agg-' || (g % $2), 'seq', g / $2 + 1, 'pad', repeat('x', 150)),
       jsonb_build_object('traceparent', '00-' || md5(g::text) || '-' || left(md5((g + 1)::text), 16) || '-01')
FROM generate_series(0, $1 - 1) AS g`, n, aggs, aggType)
	if err != nil {
		t.Fatal(err)
	}
}

// TestDrainRate measures (and logs, it asserts only that the backlog drains) how fast the relay
// binary, one shard, drains a backlog into the real broker, and its peak RSS.
func TestDrainRate(t *testing.T) { forEachTracking(t, testDrainRate) }

func testDrainRate(t *testing.T, tracking Tracking) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.drain")
	k.CreateTopic(t, topic, 6)
	const n = 100_000
	start := time.Now()
	insertBacklog(t, url, n, 10_000, "order")
	if _, err := pool.Exec(context.Background(), `ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	t.Logf("inserted a backlog of %d events in %s", n, time.Since(start).Round(time.Millisecond))

	relayBinary(t)
	start = time.Now()
	p := startProc(t, url, "--brokers", k.Brokers[0], "--default-topic", topic, "--batch-size", "500", "--tracking", string(tracking))
	var first time.Time
	waitFor(t, 3*time.Minute, "the backlog to drain", func() bool {
		left := pendingRows(t, pool)
		if first.IsZero() && left < n {
			first = time.Now()
		}
		return left == 0
	})
	elapsed := time.Since(first)
	rss, cpu := p.peakRSS(), p.cpuTime()
	if code := p.terminate(30 * time.Second); code != 0 {
		t.Errorf("relay exit code %d after SIGTERM", code)
	}
	t.Logf("drained %d events in %s after the first mark (%s including start-up): %.0f events/s; relay peak RSS %.1f MiB, relay CPU %s (%.1f µs/event)",
		n, elapsed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), float64(n)/elapsed.Seconds(), float64(rss)/(1<<20),
		cpu, float64(cpu.Microseconds())/n)

	c := newCollector(t, k, topic)
	c.waitDistinct(t, n, 2*time.Minute)
	if len(c.recs) != n {
		t.Errorf("%d records for %d events: duplicates in normal operation", len(c.recs), n)
	}
}

// TestPublishLatency measures (and logs; it asserts only that every event arrives) the time from
// commit to the broker's record timestamp (kafka-go stamps the batch it sends) at a steady
// 2,000 events/s written in transactions of 20 events.
func TestPublishLatency(t *testing.T) { forEachTracking(t, testPublishLatency) }

func testPublishLatency(t *testing.T, tracking Tracking) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.latency")
	// The broker stamps each record with its append (the records' own time is the event's
	// created_at, before its commit).
	logAppend := "LogAppendTime"
	k.CreateTopicWithConfig(t, topic, 6, map[string]*string{"message.timestamp.type": &logAppend})
	cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	cfg.StatsInterval = 5 * time.Second // the default
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "relay ready", r.Ready)

	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	const (
		perTx    = 20
		interval = 10 * time.Millisecond // 2,000 events/s
		duration = 5 * time.Second
	)
	ctx := context.Background()
	committed := map[string]time.Time{} // event id -> commit time
	tick := time.NewTicker(interval)
	defer tick.Stop()
	end := time.Now().Add(duration)
	for i := 0; time.Now().Before(end); i++ {
		<-tick.C
		evs := make([]outbox.Event, perTx)
		for j := range evs {
			evs[j] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("agg-%d", (i*perTx+j)%500),
				EventType: "Tick", Payload: []byte(`{"n": 1}`), EventID: newUUID()}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.AppendBatch(ctx, tx, evs)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		for _, e := range evs {
			committed[e.EventID] = now
		}
	}
	c := newCollector(t, k, topic)
	c.waitDistinct(t, len(committed), time.Minute)
	lat := make([]time.Duration, 0, len(c.recs))
	for _, rec := range c.recs {
		if at, ok := committed[rec.Headers[HeaderEventID]]; ok {
			lat = append(lat, rec.Timestamp.Sub(at))
		}
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))].Round(100 * time.Microsecond) }
	t.Logf("commit to the broker's append over %d events at %d events/s: p50 %s, p90 %s, p99 %s, max %s (record timestamps have ms resolution)",
		len(lat), int(float64(perTx)/interval.Seconds()), q(.5), q(.9), q(.99), lat[len(lat)-1].Round(100*time.Microsecond))
}
