package relay

import (
	"context"
	"database/sql"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestActsByHand covers what the relay does with acts by hand (outboxdb.SkipEvent and
// RetryAggregate, behind kubectl outbox skip and retry), in both tracking modes, with backoffs
// far longer than the test so that nothing is retried by itself: an event skipped to the
// dead-letter topic reaches it (read by an independent consumer) with its event_id and the
// aggregate's later events follow on their topic; a dropped event reaches no topic and its
// aggregate's later events follow; a retried aggregate whose cause was fixed (its topic's
// max.message.bytes raised) is published at once.
func TestActsByHand(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	forEachTracking(t, func(t *testing.T, tracking Tracking) { testActsByHand(t, k, tracking) })
}

func testActsByHand(t *testing.T, k *kafkatest.Cluster, tracking Tracking) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	topic, small, dlq := kafkatest.UniqueTopic("relay.byhand"), kafkatest.UniqueTopic("relay.byhand-small"), kafkatest.UniqueTopic("relay.byhand-dlq")
	k.CreateTopic(t, topic, 3)
	k.CreateTopic(t, dlq, 1)
	createSmallTopic(t, k, small, 600)

	cfg := testConfig(url, k.Brokers, "")
	cfg.TopicMap = map[string]string{"order": topic, "small": small}
	cfg.MaxPayloadBytes = 1000
	cfg.RetryBackoff = Backoff{Min: 10 * time.Minute, Max: 10 * time.Minute}
	cfg.PoisonPolicy = PoisonBlock // a dead-letter topic serves skips by hand only
	cfg.DeadLetterTopic = dlq
	cfg.Tracking = tracking
	startRelay(t, cfg, "byhand")

	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	ev := func(aggType, agg string, seq, pad int) outbox.Event {
		p, _ := json.Marshal(seqEvent{Agg: agg, Seq: seq, Pad: strings.Repeat("x", pad)})
		return outbox.Event{AggregateType: aggType, AggregateID: agg, EventType: "Seq", Payload: p}
	}
	var evs []outbox.Event
	for s := 1; s <= 3; s++ {
		pad := 0
		if s == 1 {
			pad = 2000
		}
		evs = append(evs, ev("order", "good", s, 0), ev("order", "p-dead", s, pad), ev("order", "p-drop", s, pad))
		if s == 1 {
			pad = 700 // within --max-payload-bytes, over the small topic's max.message.bytes
		}
		evs = append(evs, ev("small", "p-retry", s, pad))
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.AppendBatch(ctx, tx, evs)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	firstOf := func(agg string) (id int64, eventID string) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT id, event_id::text FROM outbox WHERE aggregate_id = $1 ORDER BY id LIMIT 1`, agg).Scan(&id, &eventID); err != nil {
			t.Fatal(err)
		}
		return id, eventID
	}
	main := newCollector(t, k, topic, small)
	main.waitDistinct(t, 3, time.Minute)
	waitFor(t, time.Minute, "the three first events failed", func() bool {
		rows := poisonRows(t, url)
		return rows["p-dead/1"].attempts >= 1 && rows["p-drop/1"].attempts >= 1 && rows["p-retry/1"].attempts >= 1
	})

	deadID, deadEvent := firstOf("p-dead")
	s, err := outboxdb.SkipEvent(ctx, db, testTable, deadID, outboxdb.SkipDeadLetter, "jane", "payload too large; the consumer team re-sends it")
	if err != nil {
		t.Fatal(err)
	}
	if s.Parked != (tracking == TrackSnapshot) || s.PreviousAttempts < 1 {
		t.Errorf("skip = %+v: want parked only under snapshot tracking, previous attempts at least 1", s)
	}
	dead := newCollector(t, k, dlq)
	dead.waitDistinct(t, 1, 30*time.Second)
	rec := dead.recs[0]
	if rec.Key != "p-dead" || rec.Headers[contract.HeaderEventID] != deadEvent || !strings.Contains(rec.Headers[contract.HeaderError], "skipped to the dead-letter topic by hand") ||
		rec.Headers[contract.HeaderOriginalTopic] != topic {
		t.Errorf("dead letter: key %q headers %v; want key p-dead, event_id %s, the skip as error, original_topic %s", rec.Key, rec.Headers, deadEvent, topic)
	}

	dropID, _ := firstOf("p-drop")
	if _, err := outboxdb.SkipEvent(ctx, db, testTable, dropID, outboxdb.SkipDrop, "jane", "duplicate of order 42"); err != nil {
		t.Fatal(err)
	}
	if _, err := outboxdb.SkipEvent(ctx, db, testTable, dropID, outboxdb.SkipDrop, "jane", "again"); err == nil || !strings.Contains(err.Error(), "already skipped") {
		t.Errorf("second skip of event %d: %v, want it refused as already skipped", dropID, err)
	}
	main.waitDistinct(t, 3+2+2, 30*time.Second) // good 1-3, then p-dead 2-3 and p-drop 2-3

	// Raise the small topic's limit: the cause is fixed, but the aggregate's backoff lasts 10m.
	k.SetTopicConfig(t, small, "max.message.bytes", "100000")
	r, err := outboxdb.RetryAggregate(ctx, db, testTable, "p-retry", "jane")
	if err != nil {
		t.Fatal(err)
	}
	if r.Events != 1 || r.MaxAttempts < 1 || r.FirstError == nil || !strings.Contains(*r.FirstError, "Message Size Too Large") {
		t.Errorf("retry = %+v (first error %q): want one failed event reset, with its error", r, deref(r.FirstError))
	}
	main.waitDistinct(t, 3+2+2+3, 30*time.Second)
	waitFor(t, 30*time.Second, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })

	for _, rec := range main.recs {
		if p := rec.Headers[contract.HeaderEventID]; p == deadEvent {
			t.Errorf("the event skipped to the dead-letter topic reached %s", rec.Topic)
		}
		var e seqEvent
		if err := json.Unmarshal(rec.Value, &e); err == nil && e.Agg == "p-drop" && e.Seq == 1 {
			t.Errorf("the dropped event reached %s", rec.Topic)
		}
	}
	if dups := checkOrderFrom(t, main.recs, map[string]int{"good": 3, "p-dead": 3, "p-drop": 3, "p-retry": 3},
		map[string]int{"p-dead": 1, "p-drop": 1}); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	var skips, retries int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_skips WHERE skipped_by = 'jane'), (SELECT count(*) FROM outbox_retries)`).Scan(&skips, &retries); err != nil {
		t.Fatal(err)
	}
	if skips != 2 || retries != 1 {
		t.Errorf("recorded %d skips and %d retries, want 2 and 1", skips, retries)
	}
}
