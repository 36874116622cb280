package plugin

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/plugin/replaycli"
	"github.com/outbox-operator/outbox-operator/relay"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
)

// TestThroughKafka runs status, events, skip --to-dead-letter, published, retry and replay against a
// real relay publishing to a real broker, in both tracking modes: two aggregates whose first
// event the broker refuses (over the topic's max.message.bytes) wait with backoffs far longer
// than the test. skip --to-dead-letter sends one to the dead-letter topic (read by an independent
// consumer) and its later events follow; retry, once the topic's limit is raised, publishes the
// other at once. replay publishes 200 events again, read by the consumer with their event_ids.
func TestThroughKafka(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	for _, tracking := range []v1alpha1.Tracking{v1alpha1.TrackRow, v1alpha1.TrackSnapshot} {
		t.Run(string(tracking), func(t *testing.T) { testThroughKafka(t, k, tracking) })
	}
}

func testThroughKafka(t *testing.T, k *kafkatest.Cluster, tracking v1alpha1.Tracking) {
	topic, small, dlq := kafkatest.UniqueTopic("plugin.orders"), kafkatest.UniqueTopic("plugin.small"), kafkatest.UniqueTopic("plugin.dlq")
	k.CreateTopic(t, topic, 3)
	k.CreateTopic(t, dlq, 1)
	limit := "600"
	k.CreateTopicWithConfig(t, small, 1, map[string]*string{"max.message.bytes": &limit})
	f := newFixture(t, func(r *v1alpha1.OutboxRelay) {
		r.Spec.DefaultTopic = ""
		r.Spec.Topics = map[string]v1alpha1.TopicName{"order": v1alpha1.TopicName(topic), "small": v1alpha1.TopicName(small)}
		r.Spec.PoisonEvents = v1alpha1.PoisonEventsSpec{Policy: v1alpha1.PoisonDeadLetter, DeadLetterTopic: v1alpha1.TopicName(dlq)}
		r.Spec.Publish.Tracking = tracking
	})

	// The relay as the operator would configure it from that spec, with backoffs of 10 minutes.
	cfg := relay.DefaultConfig()
	cfg.DatabaseURL, cfg.Table, cfg.Kafka.Brokers, cfg.HTTPAddr = f.url, testTable, k.Brokers, ""
	cfg.TopicMap = map[string]string{"order": topic, "small": small}
	cfg.PoisonPolicy, cfg.DeadLetterTopic = relay.PoisonDeadLetter, dlq
	cfg.Tracking = relay.TrackRow
	if tracking == v1alpha1.TrackSnapshot {
		cfg.Tracking = relay.TrackSnapshot
	}
	cfg.RetryBackoff = relay.Backoff{Min: 10 * time.Minute, Max: 10 * time.Minute}
	cfg.ReplayCheckInterval = 200 * time.Millisecond
	r, err := relay.New(cfg, relay.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay Run: %v", err)
		}
	})

	pad := strings.Repeat("x", 700)
	for s := 1; s <= 3; s++ {
		big := ""
		if s == 1 {
			big = pad
		}
		f.exec(t, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES
  ('order', 'good', 'Seq', jsonb_build_object('seq', $1::int)),
  ('small', 'p-dead', 'Seq', jsonb_build_object('seq', $1::int, 'pad', $2::text)),
  ('small', 'p-retry', 'Seq', jsonb_build_object('seq', $1::int, 'pad', $2::text))`, s, big)
	}
	failedState := StateBlocked
	if tracking == v1alpha1.TrackSnapshot {
		failedState = StateParked
	}
	waitUntil(t, time.Minute, "both first events failed", func() bool {
		var evs []Event
		f.runJSON(t, &evs, "events", "orders", "--blocked")
		st := statesOf(evs)
		return st["p-dead/1"] == failedState && st["p-retry/1"] == failedState
	})

	var s Status
	f.runJSON(t, &s, "status", "orders")
	if s.Tracking != tracking.Mode() || len(s.Shards.Relays) != 1 || s.Shards.Relays[0].Buckets != outboxdb.Buckets ||
		s.Shards.Relays[0].Shard == nil || *s.Shards.Relays[0].Shard != 0 || !strings.Contains(s.Shards.Relays[0].Application, "outbox-relay public.outbox shard 0") {
		t.Errorf("status: tracking %s, shards %+v", s.Tracking, s.Shards)
	}
	blocked := map[string]BlockedAggregate{}
	for _, b := range s.Blocked {
		blocked[b.AggregateID] = b
	}
	for _, agg := range []string{"p-dead", "p-retry"} {
		if b := blocked[agg]; b.Error == nil || !strings.Contains(*b.Error, "Message Size Too Large") {
			t.Errorf("status: blocked aggregate %s: %+v, want the broker's refusal as its first error", agg, b)
		}
	}
	out, _, _ := f.run(t, "status", "orders")
	t.Logf("kubectl outbox status orders (%s tracking):\n%s", s.Tracking, out)

	// skip --to-dead-letter: on the dead-letter topic, read by a consumer of our own.
	deadID, deadEvent := f.idOf(t, "p-dead", 1)
	out, errOut, code := f.run(t, "skip", "orders", "--event", deadEvent, "--to-dead-letter", "--reason", "over the topic's size limit; support re-sends it")
	if code != 0 {
		t.Fatalf("skip: exit %d: %s", code, errOut)
	}
	t.Logf("kubectl outbox skip:\n%s", out)
	recs := k.NewConsumer(t, dlq).ReadN(t, 1, 30*time.Second)
	if rec := recs[0]; rec.Key != "p-dead" || rec.Headers[contract.HeaderEventID] != deadEvent || rec.Headers[contract.HeaderOriginalTopic] != small ||
		!strings.Contains(rec.Headers[contract.HeaderError], "skipped to the dead-letter topic by hand") {
		t.Errorf("dead letter: key %q, headers %v; want p-dead's first event", rec.Key, rec.Headers)
	}
	mainTopics := k.NewConsumer(t, small)
	got := mainTopics.ReadN(t, 2, 30*time.Second) // p-dead 2 and 3 follow
	for _, rec := range got {
		if rec.Key != "p-dead" {
			t.Errorf("on %s: %s before p-dead's later events", small, rec.Key)
		}
	}
	waitUntil(t, 30*time.Second, "the skip shown as dead-lettered", func() bool {
		var evs []Event
		f.runJSON(t, &evs, "events", "orders", "--aggregate", "p-dead")
		return len(evs) == 3 && evs[0].State == StateSkippedDeadLettered && evs[0].Skip != nil && evs[0].Skip.SkippedBy == testUser &&
			evs[1].State == StatePublished && evs[2].State == StatePublished
	})
	var p Published
	f.runJSON(t, &p, "published", "orders", "--event", fmt.Sprint(deadID))
	if !p.Published || p.Topic != dlq || p.PublishedAt == nil {
		t.Errorf("published p-dead/1: %+v", p)
	}
	out, _, _ = f.run(t, "published", "orders", "--event", deadEvent)
	t.Logf("kubectl outbox published:\n%s", out)

	// retry, once the cause is fixed: published at once, not in 10 minutes.
	k.SetTopicConfig(t, small, "max.message.bytes", "100000")
	out, errOut, code = f.run(t, "retry", "orders", "--aggregate", "p-retry")
	if code != 0 || !strings.Contains(out, "1 running; told to end the aggregate's backoff now") {
		t.Fatalf("retry: exit %d: %s%s", code, out, errOut)
	}
	t.Logf("kubectl outbox retry:\n%s", out)
	got = mainTopics.ReadN(t, 3, 30*time.Second)
	for i, rec := range got {
		if rec.Key != "p-retry" || !strings.Contains(string(rec.Value), fmt.Sprintf(`"seq": %d`, i+1)) {
			t.Errorf("after the retry, record %d on %s: %s %s", i, small, rec.Key, rec.Value)
		}
	}
	waitUntil(t, 30*time.Second, "nothing pending", func() bool {
		var s Status
		f.runJSON(t, &s, "status", "orders")
		return s.Backlog.PendingCount == 0 && len(s.Blocked) == 0
	})

	// replay: 200 published events again, read by a consumer of our own with the event_ids they
	// had and the replay's header, each aggregate's copies in order.
	orders := k.NewConsumer(t, topic)
	orders.ReadN(t, 3, 30*time.Second) // good's
	const aggs, perAgg = 20, 10
	for s := 1; s <= perAgg; s++ {
		for a := range aggs {
			f.exec(t, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'Seq', jsonb_build_object('seq', $2::int))`, fmt.Sprintf("r-%d", a), s)
		}
	}
	originals := map[string]string{} // event_id -> aggregate/seq
	for _, rec := range orders.ReadN(t, aggs*perAgg, 30*time.Second) {
		originals[rec.Headers[contract.HeaderEventID]] = rec.Key + "/" + string(rec.Value)
	}
	waitUntil(t, 30*time.Second, "the events published", func() bool {
		var s Status
		f.runJSON(t, &s, "status", "orders")
		return s.Backlog.PendingCount == 0
	})
	first, _ := f.idOf(t, "r-0", 1)
	_, last := f.idOf(t, fmt.Sprintf("r-%d", aggs-1), perAgg)
	out, _, _ = f.run(t, "replay", "orders", "--from", fmt.Sprint(first), "--to", last, "--dry-run")
	t.Logf("kubectl outbox replay --dry-run:\n%s", out)
	out, errOut, code = f.run(t, "replay", "orders", "--from", fmt.Sprint(first), "--to", last, "--rate", "100", "--reason", "the consumer lost its state")
	t.Logf("kubectl outbox replay:\n%s", out)
	var open []replaycli.ReplayOutput
	f.runJSON(t, &open, "replay", "orders", "--list", "--open")
	if code != 0 || len(open) != 1 || open[0].Total != aggs*perAgg {
		t.Fatalf("replay: exit %d, %s; open replays %+v, want one of %d events", code, errOut, open, aggs*perAgg)
	}
	res := replaycli.Result{ID: open[0].ID}
	waitUntil(t, 30*time.Second, "status showing the replay running", func() bool {
		out, _, _ = f.run(t, "status", "orders")
		return strings.Contains(out, fmt.Sprintf("%d running: ", res.ID))
	})
	t.Logf("kubectl outbox status during the replay:\n%s", out)
	copies := orders.ReadN(t, aggs*perAgg, 30*time.Second)
	seen, seqs := map[string]bool{}, map[string][]string{}
	for _, rec := range copies {
		orig, ok := originals[rec.Headers[contract.HeaderEventID]]
		if !ok || seen[rec.Headers[contract.HeaderEventID]] || rec.Headers[contract.HeaderReplay] != fmt.Sprint(res.ID) || orig != rec.Key+"/"+string(rec.Value) {
			t.Fatalf("replayed record %s %s, headers %v: want a copy of an event published once, with %s %d", rec.Key, rec.Value, rec.Headers, contract.HeaderReplay, res.ID)
		}
		seen[rec.Headers[contract.HeaderEventID]] = true
		seqs[rec.Key] = append(seqs[rec.Key], string(rec.Value))
	}
	for agg, vs := range seqs {
		for i, v := range vs {
			if !strings.Contains(v, fmt.Sprintf(`"seq": %d}`, i+1)) {
				t.Errorf("aggregate %s: copies out of order: %v", agg, vs)
				break
			}
		}
	}
	waitUntil(t, 30*time.Second, "the replay done", func() bool {
		var list []replaycli.ReplayOutput
		f.runJSON(t, &list, "replay", "orders", "--list")
		return len(list) == 1 && list[0].State == "done" && list[0].Replayed == aggs*perAgg && list[0].RequestedBy == testUser
	})
	out, _, _ = f.run(t, "replay", "orders", "--list")
	t.Logf("kubectl outbox replay --list:\n%s", out)
}

// waitUntil polls cond until it holds or the timeout passes.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
