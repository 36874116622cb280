package relay

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

func TestDecide(t *testing.T) {
	layout := func(count, requested int32) *outboxdb.Layout {
		return &outboxdb.Layout{ShardCount: count, Requested: requested, Generation: 3}
	}
	tests := map[string]struct {
		fixed, index int
		l            *outboxdb.Layout
		wantCount    int
		wantSwitch   bool
	}{
		"follow, no layout":              {0, 0, nil, 0, false},
		"follow, inside the layout":      {0, 1, layout(2, 0), 2, false},
		"follow, beyond the layout":      {0, 2, layout(2, 0), 0, false},
		"follow, change in progress":     {0, 0, layout(2, 4), 0, false},
		"fixed, no layout":               {4, 1, nil, 0, true},
		"fixed, its layout":              {4, 1, layout(4, 0), 4, false},
		"fixed, another layout":          {4, 1, layout(2, 0), 0, true},
		"fixed, change to its layout":    {4, 1, layout(2, 4), 0, true},
		"fixed, change to another":       {4, 1, layout(2, 8), 0, false},
		"fixed, its layout being left":   {4, 1, layout(4, 8), 0, false},
		"follow, index 0 of one shard":   {0, 0, layout(1, 0), 1, false},
		"fixed one, first layout absent": {1, 0, nil, 0, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			count, sw, why := decide(tc.fixed, tc.index, tc.l)
			if count != tc.wantCount || sw != tc.wantSwitch {
				t.Fatalf("decide = %d, %v, %q; want %d, %v", count, sw, why, tc.wantCount, tc.wantSwitch)
			}
			if count == 0 && why == "" {
				t.Fatal("standing by without a reason")
			}
		})
	}
}

// TestReshardUnderLoad runs four relays that follow the table's layout (as the operator runs
// them) while writers append continuously to 1,000 aggregates, and moves the layout from 1 to 4,
// 2 and back to 1 shard with the protocol the operator uses. An independent consumer must see every
// event, each aggregate's in order with no duplicate, and each change must report its pause.
func TestReshardUnderLoad(t *testing.T) { forEachTracking(t, testReshardUnderLoad) }

func testReshardUnderLoad(t *testing.T, tracking Tracking) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.reshard.load")
	k.CreateTopic(t, topic, 6)
	c := newCollector(t, k, topic)
	ctx := context.Background()

	if ok, err := outboxdb.SwitchLayout(ctx, db, testTable, 1); err != nil || !ok {
		t.Fatalf("first layout: %v, %v", ok, err)
	}
	relays := make([]*running, 4)
	for i := range relays {
		cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
		cfg.ShardCount, cfg.ShardIndex = 0, i
		cfg.BatchSize = 100
		relays[i] = startRelay(t, cfg, fmt.Sprintf("follower %d", i))
	}
	waitFor(t, 30*time.Second, "shard 0 of 1 ready", relays[0].Ready)
	readyOnly := func(want int) func() bool {
		return func() bool {
			for i, r := range relays {
				if r.Ready() != (i < want) {
					return false
				}
			}
			return true
		}
	}

	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	load := seqtest.StartLoad(ctx, pool, w, "order", 1000, 4, 10, 2*time.Millisecond)

	var pauses []time.Duration
	reshard := func(n int32) {
		t.Helper()
		before := load.Written()
		waitFor(t, 30*time.Second, "more events under the current layout", func() bool { return load.Written() > before+2000 })
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		l, err := outboxdb.Reshard(rctx, db, testTable, n, 20*time.Millisecond)
		if err != nil {
			t.Fatalf("reshard to %d: %v", n, err)
		}
		waitFor(t, 30*time.Second, fmt.Sprintf("exactly shards 0..%d ready", n-1), readyOnly(int(n)))
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		if l, err = outboxdb.WaitForPause(wctx, outboxdb.RealClock{}, db, testTable, l.Generation, 20*time.Millisecond); err != nil {
			t.Fatalf("waiting for the pause of resharding to %d: %v", n, err)
		}
		pause, _ := l.Pause()
		// released_at and switched_at are now() of two transactions that overlap (the last relay
		// of the old layout standing down, the first of the new switching): the switch's may
		// precede the release by the time between the two transactions' starts (0.13 ms seen).
		const skew = 100 * time.Millisecond
		if l.ShardCount != n || l.ReleasedAt.Before(l.RequestedAt) || l.SwitchedAt.Before(l.ReleasedAt.Add(-skew)) || l.ResumedAt.Before(l.SwitchedAt) {
			t.Fatalf("layout after resharding to %d: %+v", n, l)
		}
		pauses = append(pauses, pause)
		t.Logf("resharded %d -> %d under load: publishing paused %s (requested to released %s)",
			l.Previous, n, pause.Round(time.Millisecond), l.ReleasedAt.Sub(l.RequestedAt).Round(time.Millisecond))
	}
	reshard(4)
	reshard(2)
	// Back to one shard: its buckets come from two cursor rows (snapshot tracking), each of which
	// it must bring to a common snapshot reading only its own buckets' events.
	reshard(1)
	before := load.Written()
	waitFor(t, 30*time.Second, "more events under 1 shard", func() bool { return load.Written() > before+2000 })
	all := load.Stop(t)
	total := load.Written()
	c.waitDistinct(t, total, 2*time.Minute)
	c.poll(t, time.Second)
	if dups := checkOrder(t, c.recs, all); dups != 0 {
		t.Errorf("%d duplicates: an event was published by two layouts, or by a relay that stood down without recording it", dups)
	}
	waitFor(t, 10*time.Second, "every row marked sent", func() bool { return pendingRows(t, pool) == 0 })
	var published float64
	for _, r := range relays {
		published += metricValue(t, r.metrics.published)
	}
	if int(published) != total {
		t.Errorf("the relays published %v events, %d were written", published, total)
	}
	if relays[1].Ready() || relays[2].Ready() || relays[3].Ready() {
		t.Error("shards 1 to 3 publish under a 1-shard layout")
	}
	t.Logf("%d events of %d aggregates, 0 lost, 0 reordered, pauses %v", total, len(all), pauses)
}
