package relay

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
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

// TestCursorWritesCoalesced: under snapshot tracking at a steady rate, the batches' cursor
// moves are written at most every cursorFlushEvery, not once per batch, and an idle relay still
// writes the last one within it, so that the database's pending count follows the published
// events. The writes are counted by a trigger on the cursor table (the database, not the
// relay); the batches by the broker's record batches (kafkatest.CountBatches). Once the load
// stops, the pending count must reach 0 long before the poll interval (1 min, notified) would
// bring another round trip.
func TestCursorWritesCoalesced(t *testing.T) {
	for _, notify := range []bool{true, false} {
		t.Run(fmt.Sprintf("notify=%v", notify), func(t *testing.T) { testCursorWritesCoalesced(t, notify) })
	}
}

func testCursorWritesCoalesced(t *testing.T, notify bool) {
	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	url, pool, k, topic := newTopicDB(t, "relay.coalesce", 1)
	ctx := context.Background()
	if notify {
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if _, err := outboxdb.SetNotify(ctx, db, testTable, true, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE cursor_writes (at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION count_cursor_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO cursor_writes DEFAULT VALUES; RETURN NULL; END $$;
CREATE TRIGGER count_cursor_write AFTER UPDATE ON outbox_relay_cursor FOR EACH ROW EXECUTE FUNCTION count_cursor_write()`); err != nil {
		t.Fatal(err)
	}
	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
	cfg.Notify, cfg.PollInterval = notify, time.Minute
	if !notify {
		cfg.PollInterval = 10 * time.Millisecond
	}
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "the relay ready", r.Ready)
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	const events, aggs = 800, 8
	want := map[string]int{}
	var before int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM cursor_writes`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := range events {
		agg := fmt.Sprintf("c-%d", i%aggs)
		want[agg]++
		if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: agg, Seq: want[agg]}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(500+rng.IntN(2000)) * time.Microsecond) // the pace of the load
	}
	load := time.Since(start)
	waitFor(t, 10*time.Second, "nothing pending (the last cursor move written)", func() bool { return pendingRows(t, pool) == 0 })
	c := newCollector(t, k, topic)
	c.waitDistinct(t, events, time.Minute)
	checkOrder(t, c.recs, want)
	_, batches := k.CountBatches(t, topic)
	var writes int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM cursor_writes`).Scan(&writes); err != nil {
		t.Fatal(err)
	}
	writes -= before
	most := int(load/cursorFlushEvery) + 5 // the first write, the last, a few empty moves
	t.Logf("%d events over %s in %d record batches; %d cursor writes (at most %d expected)", events, load.Round(time.Millisecond), batches, writes, most)
	if writes > most || writes*3 > batches {
		t.Fatalf("%d cursor writes for %d batches over %s: want at most %d and a third of the batches", writes, batches, load, most)
	}
}
