package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// createSmallTopic creates a topic whose broker-side max.message.bytes rejects larger batches.
func createSmallTopic(t testing.TB, k *kafkatest.Cluster, topic string, maxBytes int) {
	t.Helper()
	v := fmt.Sprint(maxBytes)
	k.CreateTopicWithConfig(t, topic, 3, map[string]*string{"max.message.bytes": &v})
}

type poisonRow struct {
	agg, aggType string
	seq          int
	attempts     int
	err          *string
	sent         bool
}

// poisonRows reads each event's state in either tracking mode: attempts and error from its row,
// or from the parked and dead-lettered tables of snapshot tracking, and whether it was published
// (the table's own outbox_published function).
func poisonRows(t testing.TB, url string) map[string]poisonRow {
	t.Helper()
	pool := newPool(t, url)
	rows, err := pool.Query(context.Background(),
		`SELECT o.aggregate_id, o.aggregate_type, (o.payload->>'seq')::int, coalesce(p.attempts, o.attempts),
		        coalesce(p.error, d.error, o.error), public.outbox_published(o.id)
		 FROM outbox o LEFT JOIN outbox_parked p ON p.id = o.id LEFT JOIN outbox_dead_lettered d ON d.id = o.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]poisonRow{}
	for rows.Next() {
		var r poisonRow
		if err := rows.Scan(&r.agg, &r.aggType, &r.seq, &r.attempts, &r.err, &r.sent); err != nil {
			t.Fatal(err)
		}
		out[fmt.Sprintf("%s/%d", r.agg, r.seq)] = r
	}
	return out
}

// TestPoison covers the three kinds of poison event under both policies: an aggregate type
// with no topic, a payload over --max-payload-bytes, and an event the broker refuses until it
// has failed --max-attempts times (its topic's max.message.bytes is smaller than the event).
// Under block, the poison event's aggregate waits (its later events too) while the other
// aggregates flow, with attempts and error recorded on the row. Under dead-letter, the poison
// event goes to the dead-letter topic with its headers plus error (and original_topic when
// known), its row is marked sent with the error, and the aggregate's later events flow.
// Snapshot tracking parks the poison event and the later events of its aggregate (with the
// error "held back ...") and records a dead-lettered event in <table>_dead_lettered.
func TestPoison(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	forEachTracking(t, func(t *testing.T, tracking Tracking) { testPoison(t, k, tracking) })
}

func testPoison(t *testing.T, k *kafkatest.Cluster, tracking Tracking) {
	for _, policy := range []PoisonPolicy{PoisonBlock, PoisonDeadLetter} {
		t.Run(string(policy), func(t *testing.T) {
			url := pgtest.NewDatabase(t)
			pool := newOutboxDB(t, url)
			topic := kafkatest.UniqueTopic("relay.poison")
			small := kafkatest.UniqueTopic("relay.small")
			dlq := kafkatest.UniqueTopic("relay.dlq")
			k.CreateTopic(t, topic, 3)
			k.CreateTopic(t, dlq, 1)
			createSmallTopic(t, k, small, 600)

			cfg := testConfig(url, k.Brokers, "")
			cfg.TopicMap = map[string]string{"order": topic, "small": small}
			cfg.MaxPayloadBytes = 1000
			cfg.MaxAttempts = 3
			cfg.BatchSize = 16 // an aggregate's events span batches: exercises the pipeline's filters
			cfg.RetryBackoff = Backoff{Min: 50 * time.Millisecond, Max: 400 * time.Millisecond}
			cfg.PoisonPolicy = policy
			cfg.Tracking = tracking
			if policy == PoisonDeadLetter {
				cfg.DeadLetterTopic = dlq
			}
			r := startRelay(t, cfg, string(policy))

			w, err := outbox.New("public.outbox")
			if err != nil {
				t.Fatal(err)
			}
			ev := func(aggType, agg string, seq int, pad int) outbox.Event {
				p, _ := json.Marshal(seqEvent{Agg: agg, Seq: seq, Pad: strings.Repeat("x", pad)})
				return outbox.Event{AggregateType: aggType, AggregateID: agg, EventType: "Seq", Payload: p,
					Headers: map[string]string{"traceparent": fmt.Sprintf("00-%032d-%016d-01", seq, seq), "correlationId": agg}}
			}
			var evs []outbox.Event
			good := map[string]int{}
			for s := 1; s <= 5; s++ {
				for a := range 10 {
					agg := fmt.Sprintf("good-%d", a)
					evs = append(evs, ev("order", agg, s, 0))
					good[agg] = s
				}
				if s == 1 {
					evs = append(evs, ev("mystery", "p-type", 1, 0), ev("order", "p-size", 1, 2000), ev("small", "p-reject", 1, 700))
				} else {
					evs = append(evs, ev("order", "p-type", s, 0), ev("order", "p-size", s, 0), ev("small", "p-reject", s, 0))
				}
			}
			if err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
				_, err := w.AppendBatch(context.Background(), tx, evs)
				return err
			}); err != nil {
				t.Fatal(err)
			}

			main := newCollector(t, k, topic, small)
			if policy == PoisonBlock {
				main.waitDistinct(t, 50, time.Minute)
				// The poison events are retried at the longest backoff; give them a few rounds.
				waitFor(t, 30*time.Second, "poison rows retried", func() bool {
					rows := poisonRows(t, url)
					return rows["p-type/1"].attempts >= 3 && rows["p-size/1"].attempts >= 3 && rows["p-reject/1"].attempts >= 5
				})
				main.poll(t, time.Second)
				if dups := checkOrder(t, main.recs, good); dups != 0 {
					t.Errorf("%d duplicates", dups)
				}
				for _, rec := range main.recs {
					if strings.HasPrefix(rec.Key, "p-") {
						t.Errorf("an event of blocked aggregate %s was published: %v", rec.Key, rec.Headers)
					}
				}
				rows := poisonRows(t, url)
				for key, want := range map[string]string{
					"p-type/1":   `no topic for aggregate type "mystery"`,
					"p-size/1":   "exceeds --max-payload-bytes 1000",
					"p-reject/1": "Message Size Too Large",
				} {
					row := rows[key]
					if row.sent || row.err == nil || !strings.Contains(*row.err, want) {
						t.Errorf("poison row %s: sent %v, error %v, want an error containing %q", key, row.sent, deref(row.err), want)
					}
				}
				for _, agg := range []string{"p-type", "p-size", "p-reject"} {
					for s := 2; s <= 5; s++ {
						row := rows[fmt.Sprintf("%s/%d", agg, s)]
						waiting := row.err == nil
						if tracking == TrackSnapshot {
							waiting = row.err != nil && *row.err == heldBack
						}
						if row.sent || row.attempts != 0 || !waiting {
							t.Errorf("later event %s/%d: sent %v, attempts %d, error %v; want it waiting untouched", agg, s, row.sent, row.attempts, deref(row.err))
						}
					}
				}
				for _, reason := range []string{reasonNoTopic, reasonOversized, reasonMaxAttempts} {
					if got := metricValue(t, r.metrics.poison.WithLabelValues(reason, string(PoisonBlock))); got < 1 {
						t.Errorf("outbox_poison_events_total{reason=%q} = %v", reason, got)
					}
				}
				if got := metricValue(t, r.metrics.publishErrors); got < 9 {
					t.Errorf("outbox_publish_errors_total = %v", got)
				}
				if !r.Ready() {
					t.Error("relay not ready while it blocks poison events")
				}
				return
			}

			// dead-letter
			dead := newCollector(t, k, dlq)
			dead.waitDistinct(t, 3, time.Minute)
			want := map[string]int{"p-type": 5, "p-size": 5, "p-reject": 5}
			for agg, n := range good {
				want[agg] = n
			}
			main.waitDistinct(t, 50+3*4, time.Minute)
			waitFor(t, 10*time.Second, "every row marked sent", func() bool { return pendingRows(t, pool) == 0 })
			// On their topics, the poisoned aggregates continue with event 2.
			if dups := checkOrderFrom(t, main.recs, want, map[string]int{"p-type": 1, "p-size": 1, "p-reject": 1}); dups != 0 {
				t.Errorf("%d duplicates", dups)
			}
			byAgg := map[string]map[string]string{}
			for _, rec := range dead.recs {
				byAgg[rec.Key] = rec.Headers
			}
			for agg, want := range map[string]struct{ err, original string }{
				"p-type":   {err: `no topic for aggregate type "mystery"`},
				"p-size":   {err: "exceeds --max-payload-bytes 1000", original: topic},
				"p-reject": {err: "failed 3 times (--max-attempts 3)", original: small},
			} {
				h := byAgg[agg]
				if h == nil {
					t.Errorf("no dead letter for %s", agg)
					continue
				}
				if !strings.Contains(h[HeaderError], want.err) || h[HeaderOriginalTopic] != want.original {
					t.Errorf("dead letter of %s: error %q, original_topic %q; want %q, %q", agg, h[HeaderError], h[HeaderOriginalTopic], want.err, want.original)
				}
				if h[HeaderEventID] == "" || h[HeaderEventType] != "Seq" || h[HeaderAggregateID] != agg || h["correlationId"] != agg ||
					!strings.HasPrefix(h["traceparent"], "00-") {
					t.Errorf("dead letter of %s lacks its original headers: %v", agg, h)
				}
			}
			rows := poisonRows(t, url)
			for _, key := range []string{"p-type/1", "p-size/1", "p-reject/1"} {
				row := rows[key]
				if !row.sent || row.err == nil || !strings.HasPrefix(*row.err, "dead-lettered to "+dlq+": ") {
					t.Errorf("dead-lettered row %s: sent %v, error %q", key, row.sent, deref(row.err))
				}
			}
			if got := metricValue(t, r.metrics.poison.WithLabelValues(reasonMaxAttempts, string(PoisonDeadLetter))); got != 1 {
				t.Errorf("outbox_poison_events_total{reason=max_attempts,policy=dead-letter} = %v", got)
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
