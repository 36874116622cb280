package relay

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// TestFailedAggregateRecovers: the broker refuses an aggregate's large events (its topic's
// max.message.bytes), so that aggregate is held back (row tracking: blocked with its rows
// pending; snapshot tracking: parked) while writers keep appending to it and to others. Then the
// topic accepts them again: the held-back events are published, then the later ones, in order,
// with every other aggregate flowing throughout. Under snapshot tracking this exercises parked
// retries that empty an aggregate while new events of it arrive.
func TestFailedAggregateRecovers(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	forEachTracking(t, func(t *testing.T, tracking Tracking) { testFailedAggregateRecovers(t, k, tracking) })
}

// TestFailedAggregateRecoversExactlyOnce: the same under exactly-once delivery, read by a
// read_committed consumer: a transaction that meets the refused events aborts and the rest of
// its batch goes again without their aggregate, which is parked (the parks carried in the
// cursor record until the database has them); once the topic accepts them, the parked events
// are published from the parked table, each once.
func TestFailedAggregateRecoversExactlyOnce(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	testFailedAggregateRecoversDelivery(t, k, TrackSnapshot, true)
}

func testFailedAggregateRecovers(t *testing.T, k *kafkatest.Cluster, tracking Tracking) {
	testFailedAggregateRecoversDelivery(t, k, tracking, false)
}

func testFailedAggregateRecoversDelivery(t *testing.T, k *kafkatest.Cluster, tracking Tracking, exactlyOnce bool) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	topic := kafkatest.UniqueTopic("relay.recover")
	createSmallTopic(t, k, topic, 1000)
	c := newCollector(t, k, topic)
	cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	if exactlyOnce {
		_, cursors := exactlyOnceTopics(t, k, "relay.recover.eos", 1)
		cfg.Delivery, cfg.CursorTopic = contract.DeliveryExactlyOnce, cursors
		c = &collector{c: k.NewCommittedConsumer(t, topic), byEvent: map[string]int{}}
	}
	cfg.BatchSize = 20
	cfg.RetryBackoff = Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}
	cfg.MaxAttempts = 1000
	startRelay(t, cfg, string(tracking))
	ctx := context.Background()
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}

	// The "big" aggregate's events are larger than the topic accepts; the others are small.
	want := map[string]int{}
	write := func(n int, big bool) {
		for range n {
			var evs []outbox.Event
			for _, agg := range []string{"big", "a", "b", "c"} {
				want[agg]++
				pad := 0
				if agg == "big" && big {
					pad = 1500
				}
				p, _ := json.Marshal(seqEvent{Agg: agg, Seq: want[agg], Pad: strings.Repeat("x", pad)})
				evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: agg, EventType: "Seq", Payload: p})
			}
			if err := seqtest.AppendEvents(ctx, pool, w, evs); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(20, true)
	waitFor(t, 30*time.Second, "the other aggregates to flow", func() bool {
		c.poll(t, 100*time.Millisecond)
		return len(c.byEvent) >= 60
	})
	for _, rec := range c.recs {
		if rec.Key == "big" {
			t.Fatalf("an event of the refused aggregate was published: %v", rec.Headers)
		}
	}

	// The topic accepts large messages again while writers go on.
	k.SetTopicConfig(t, topic, "max.message.bytes", "1000000")
	for range 10 {
		write(5, false)
		time.Sleep(20 * time.Millisecond)
	}
	total := 0
	for _, n := range want {
		total += n
	}
	c.waitDistinct(t, total, time.Minute)
	c.poll(t, 500*time.Millisecond)
	if dups := checkOrder(t, c.recs, want); dups != 0 && exactlyOnce {
		t.Errorf("%d duplicates read committed under exactly-once delivery", dups)
	} else if dups != 0 {
		t.Logf("%d duplicates", dups)
	}
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	var parked int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_parked`).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if parked != 0 {
		t.Errorf("%d events still parked", parked)
	}
	t.Logf("%s: %d events in order, the refused aggregate's %d after the topic accepted them", tracking, total, want["big"])
}
