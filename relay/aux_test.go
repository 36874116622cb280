package relay

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// What an idle relay reads only on a notification, with a periodic read as a safety net so that
// idle it costs its database almost nothing, still comes at once when it is due:
//
//   - A replay requested (outboxdb.RequestReplay notifies) is run within seconds although the
//     relay looks for replays by itself only every DefaultReplayCheckInterval (a minute).
//   - The statistics of a shard with nothing pending, refreshed only every statsIdleInterval (a
//     minute) while nothing comes, are measured as soon as the relay fetches events: a poison
//     event held back shows in outbox_pending within seconds.
//
// Both bounds are a tenth of the periodic reads' interval, so a relay that waited for them fails.
func TestIdleReadsComeOnNotice(t *testing.T) { forEachTracking(t, testIdleReadsComeOnNotice) }

func testIdleReadsComeOnNotice(t *testing.T, tracking Tracking) {
	url, pool, k, topic := newTopicDB(t, "relay.idle", 3)
	ctx := context.Background()
	cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	cfg.ReplayCheckInterval = 0 // the default
	cfg.MaxPayloadBytes = 2000
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "the relay ready", r.Ready)
	if r.cfg.ReplayCheckInterval != DefaultReplayCheckInterval || DefaultReplayCheckInterval < time.Minute {
		t.Fatalf("replay check interval %s, want the default of at least a minute", r.cfg.ReplayCheckInterval)
	}
	const bound = 6 * time.Second

	// The statistics, quiet: nothing pending, nothing fetched.
	waitFor(t, 10*time.Second, "the statistics quiet", func() bool {
		return r.statsQuiet.Load() && metricValue(t, r.metrics.pending) == 0
	})
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', 'poison-1', 'Big', jsonb_build_object('pad', repeat('x', 3000)))`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, bound, "outbox_pending to count the held-back event", func() bool { return metricValue(t, r.metrics.pending) == 1 })
	t.Logf("outbox_pending 1 after %s (statistics of a quiet shard every %s)", time.Since(start).Round(time.Millisecond), statsIdleInterval)

	// A replay of published events, requested while the relay idles.
	seq := writeSeq(t, pool, 20, 4, 5)
	c := newCollector(t, k, topic)
	c.waitDistinct(t, 20, 30*time.Second)
	replayTopic := topic + ".replay"
	k.CreateTopic(t, replayTopic, 3)
	waitFor(t, 10*time.Second, "the relay idle again", func() bool { return pendingRows(t, pool) == 1 })
	start = time.Now()
	rep, plan, err := outboxdb.RequestReplay(ctx, pool, testTable, outboxdb.ReplayRequest{From: outboxdb.Bound{ID: 1}, Topic: replayTopic, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	copies := k.NewConsumer(t, replayTopic).ReadN(t, int(plan.Events), bound)
	t.Logf("replay %d: %d copies within %s of the request (events of %d aggregates; replays looked for every %s)",
		rep.ID, len(copies), time.Since(start).Round(time.Millisecond), len(seq), DefaultReplayCheckInterval)
}
