package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// tableChecks are the names PostgreSQL gave the four CHECKs of migration 00001 on public.outbox.
var tableChecks = []string{"outbox_aggregate_id_check", "outbox_aggregate_type_check", "outbox_event_type_check", "outbox_headers_check"}

// TestInvalidEventsInPrepare: the events the table's CHECKs would refuse (an empty aggregate_type,
// aggregate_id or event_type; headers that are not a JSON object: an array, a string, a number,
// a boolean, JSON null) are poison when the relay builds its batch, each with its reason, even
// where routing would find them a topic (a default topic) or not (a topic map): the empty
// column is named first. An event skipped by hand stays "skipped".
func TestInvalidEventsInPrepare(t *testing.T) {
	type tc struct {
		aggType, aggID, eventType, headers string
		attempts                           int32
		reason, detail                     string // "" for a good event
	}
	const refused = " (a plain INSERT: the writer libraries and the SQL appends refuse it, the table's CHECKs too under spec.writers.checks: Table)"
	run := func(t *testing.T, defaultTopic string, topicMap map[string]string, cases []tc) {
		cfg := testConfig("postgres://unused@127.0.0.1:1/x", []string{"127.0.0.1:1"}, defaultTopic)
		cfg.TopicMap = topicMap
		r, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer r.pub.close()
		b := r.getBatch()
		for i, c := range cases {
			b.rows = append(b.rows, row{id: int64(i + 1), createdAt: time.Now(), attempts: c.attempts,
				eventID: []byte(fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1)),
				aggType: []byte(c.aggType), aggID: []byte(c.aggID), eventType: []byte(c.eventType),
				payload: []byte(`{"n": 1}`), headers: []byte(c.headers)})
		}
		r.prepare(b, time.Now(), nil, nil)
		for i, c := range cases {
			row := &b.rows[i]
			what := fmt.Sprintf("event %d (aggregate_type %q, aggregate_id %q, event_type %q, headers %s)", i+1, c.aggType, c.aggID, c.eventType, c.headers)
			if c.reason == "" {
				if row.poison != "" || row.state != rowInFlight {
					t.Errorf("%s: poison %q (%s), state %d; want it published", what, row.poison, row.errText, row.state)
				}
				continue
			}
			if row.poison != c.reason || row.state != rowFailed || !strings.Contains(row.errText, c.detail) {
				t.Errorf("%s: poison %q, state %d, error %q; want %q, failed, an error containing %q", what, row.poison, row.state, row.errText, c.reason, c.detail)
			}
		}
		if got := metricValue(t, r.metrics.poison.WithLabelValues(reasonInvalid, string(PoisonBlock))); got < 1 {
			t.Errorf("outbox_poison_events_total{reason=invalid} = %v", got)
		}
	}
	t.Run("default topic", func(t *testing.T) {
		run(t, "events", nil, []tc{
			{aggType: "order", aggID: "a", eventType: "Placed", headers: `{}`},
			{aggType: "", aggID: "b", eventType: "Placed", headers: `{}`, reason: reasonInvalid, detail: "poison: empty aggregate_type" + refused},
			{aggType: "order", aggID: "", eventType: "Placed", headers: `{}`, reason: reasonInvalid, detail: "poison: empty aggregate_id" + refused},
			{aggType: "order", aggID: "d", eventType: "", headers: `{}`, reason: reasonInvalid, detail: "poison: empty event_type" + refused},
			{aggType: "", aggID: "e", eventType: "", headers: `[]`, reason: reasonInvalid, detail: "empty aggregate_type"},
			{aggType: "order", aggID: "f", eventType: "Placed", headers: `[]`, reason: reasonBadHeaders, detail: "headers column is not a JSON object"},
			{aggType: "order", aggID: "g", eventType: "Placed", headers: `[{"a": "b"}]`, reason: reasonBadHeaders, detail: "headers column is not a JSON object"},
			{aggType: "order", aggID: "h", eventType: "Placed", headers: `"x"`, reason: reasonBadHeaders, detail: "headers column is not a JSON object"},
			{aggType: "order", aggID: "i", eventType: "Placed", headers: `3`, reason: reasonBadHeaders, detail: "headers column is not a JSON object"},
			{aggType: "order", aggID: "j", eventType: "Placed", headers: `true`, reason: reasonBadHeaders, detail: "headers column is not a JSON object"},
			{aggType: "order", aggID: "k", eventType: "Placed", headers: `null`, reason: reasonBadHeaders, detail: "headers column is not a JSON object"},
			{aggType: "order", aggID: "l", eventType: "Placed", headers: `{"x": "y"}`},
		})
	})
	t.Run("topic map", func(t *testing.T) {
		run(t, "", map[string]string{"order": "orders"}, []tc{
			{aggType: "order", aggID: "a", eventType: "Placed", headers: `{}`},
			{aggType: "", aggID: "b", eventType: "Placed", headers: `{}`, reason: reasonInvalid, detail: "poison: empty aggregate_type" + refused},
			{aggType: "mystery", aggID: "c", eventType: "Placed", headers: `{}`, reason: reasonNoTopic, detail: `no topic for aggregate type "mystery"`},
			{aggType: "", aggID: "d", eventType: "Placed", headers: `{}`, attempts: outboxdb.DeadLetterRequested, reason: reasonSkipped, detail: "skipped to the dead-letter topic by hand"},
		})
	})
	good := &row{aggType: []byte("order"), aggID: []byte("a"), eventType: []byte("Placed")}
	if n := testing.AllocsPerRun(100, func() {
		if emptyColumn(good) != "" {
			t.Fatal("a good event has an empty column")
		}
	}); n != 0 {
		t.Errorf("emptyColumn allocates %.0f times", n)
	}
}

// invalidEvent is one event of TestInvalidEvents, written with a plain INSERT.
type invalidEvent struct {
	aggType, agg, eventType, headers string
	seq                              int
}

// TestInvalidEvents: with the table's four CHECKs dropped (spec.writers.checks: Relay), plain
// INSERTs write events they would have refused: an empty aggregate_type, event_type or
// aggregate_id, and headers that are a JSON array, a string, a number or JSON null. The relay
// refuses them as poison, under either policy and either tracking, and never publishes them to
// their topic; the good events of every aggregate reach it in order (an independent consumer
// reads them). Under block, an invalid event's aggregate waits (its later events unpublished,
// untouched) with the error on the row or in the parked table, while the other aggregates flow.
// Under dead-letter, each goes to the dead-letter topic with an error header naming the reason,
// is recorded dead-lettered with the error, and its aggregate's later events flow.
func TestInvalidEvents(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	forEachTracking(t, func(t *testing.T, tracking Tracking) {
		for _, policy := range []PoisonPolicy{PoisonBlock, PoisonDeadLetter} {
			t.Run(string(policy), func(t *testing.T) { testInvalidEvents(t, k, tracking, policy) })
		}
	})
}

func testInvalidEvents(t *testing.T, k *kafkatest.Cluster, tracking Tracking, policy PoisonPolicy) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	topic := kafkatest.UniqueTopic("relay.invalid")
	dlq := kafkatest.UniqueTopic("relay.invalid-dlq")
	k.CreateTopic(t, topic, 3)
	k.CreateTopic(t, dlq, 1)

	// Drop the table's CHECKs, as spec.writers.checks: Relay does, by their names.
	var names []string
	cons, err := pool.Query(ctx, `SELECT conname FROM pg_catalog.pg_constraint WHERE conrelid = 'public.outbox'::regclass AND contype = 'c' ORDER BY conname`)
	if err != nil {
		t.Fatal(err)
	}
	if names, err = pgx.CollectRows(cons, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, tableChecks) {
		t.Fatalf("the table's CHECKs are %q, want %q", names, tableChecks)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE public.outbox DROP CONSTRAINT outbox_aggregate_type_check, DROP CONSTRAINT outbox_aggregate_id_check,
		DROP CONSTRAINT outbox_event_type_check, DROP CONSTRAINT outbox_headers_check`); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(url, k.Brokers, "")
	cfg.TopicMap = map[string]string{"order": topic} // an empty aggregate_type has no topic either: "invalid" must win
	cfg.BatchSize = 8                                // an aggregate's events span batches
	cfg.RetryBackoff = Backoff{Min: 50 * time.Millisecond, Max: 400 * time.Millisecond}
	cfg.PoisonPolicy = policy
	cfg.Tracking = tracking
	if policy == PoisonDeadLetter {
		cfg.DeadLetterTopic = dlq
	}
	r := startRelay(t, cfg, string(policy))

	// Each bad aggregate's first event is invalid, its later ones good; aggregate "" has only
	// invalid events. want is each invalid event's error, by aggregate/seq.
	const badHeaders = "poison: headers column is not a JSON object of strings"
	bad := []struct{ agg, aggType, eventType, headers, err string }{
		{agg: "bad-type", aggType: "", eventType: "Seq", headers: `{}`, err: "poison: empty aggregate_type (a plain INSERT: the writer libraries"},
		{agg: "bad-evtype", aggType: "order", eventType: "", headers: `{}`, err: "poison: empty event_type (a plain INSERT: the writer libraries"},
		{agg: "bad-arr", aggType: "order", eventType: "Seq", headers: `[]`, err: badHeaders},
		{agg: "bad-str", aggType: "order", eventType: "Seq", headers: `"x"`, err: badHeaders},
		{agg: "bad-num", aggType: "order", eventType: "Seq", headers: `3`, err: badHeaders},
		{agg: "bad-null", aggType: "order", eventType: "Seq", headers: `null`, err: badHeaders},
	}
	const emptyAgg = "poison: empty aggregate_id (a plain INSERT: the writer libraries"
	want := map[string]string{"/1": emptyAgg, "/2": emptyAgg}
	var evs []invalidEvent
	good := map[string]int{}             // each aggregate's last seq on the topic
	waiting := []string{}                // the later events of the bad aggregates
	ordinary := `{"correlationId": "c"}` // headers of the good events
	for s := 1; s <= 3; s++ {
		for a := range 5 {
			agg := fmt.Sprintf("good-%d", a)
			evs = append(evs, invalidEvent{aggType: "order", agg: agg, eventType: "Seq", headers: ordinary, seq: s})
			good[agg] = s
		}
		for _, b := range bad {
			if s == 1 {
				evs = append(evs, invalidEvent{aggType: b.aggType, agg: b.agg, eventType: b.eventType, headers: b.headers, seq: 1})
				want[b.agg+"/1"] = b.err
				continue
			}
			evs = append(evs, invalidEvent{aggType: "order", agg: b.agg, eventType: "Seq", headers: ordinary, seq: s})
			waiting = append(waiting, fmt.Sprintf("%s/%d", b.agg, s))
		}
		if s <= 2 {
			evs = append(evs, invalidEvent{aggType: "order", agg: "", eventType: "Seq", headers: ordinary, seq: s})
		}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, e := range evs {
			p, _ := json.Marshal(seqEvent{Agg: e.agg, Seq: e.seq})
			if _, err := tx.Exec(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
				VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb)`, e.aggType, e.agg, e.eventType, string(p), e.headers); err != nil {
				return fmt.Errorf("inserting %+v: %w", e, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The headers are jsonb values of those types (JSON null, not SQL NULL).
	var types map[string]string
	if err := pool.QueryRow(ctx, `SELECT jsonb_object_agg(aggregate_id, jsonb_typeof(headers)) FROM public.outbox WHERE aggregate_id LIKE 'bad-%' AND payload->>'seq' = '1'`).Scan(&types); err != nil {
		t.Fatal(err)
	}
	if w := map[string]string{"bad-type": "object", "bad-evtype": "object", "bad-arr": "array", "bad-str": "string", "bad-num": "number", "bad-null": "null"}; fmt.Sprint(types) != fmt.Sprint(w) {
		t.Fatalf("headers of the bad events are %v, want %v", types, w)
	}

	main := newCollector(t, k, topic)
	// checkTopic fails for every record of an invalid event, or (under block) of a blocked
	// aggregate, and for a good event's record without its headers.
	checkTopic := func() {
		for _, rec := range main.recs {
			var e seqEvent
			_ = json.Unmarshal(rec.Value, &e)
			h := rec.Headers
			if h[HeaderAggregateType] == "" || h[HeaderAggregateID] == "" || h[HeaderEventType] == "" || want[fmt.Sprintf("%s/%d", e.Agg, e.Seq)] != "" {
				t.Errorf("invalid event %s/%d reached %s: headers %v", e.Agg, e.Seq, rec.Topic, h)
			} else if policy == PoisonBlock && strings.HasPrefix(e.Agg, "bad-") {
				t.Errorf("event %s/%d of a blocked aggregate reached %s", e.Agg, e.Seq, rec.Topic)
			} else if h[HeaderAggregateType] != "order" || h[HeaderEventType] != "Seq" || h["correlationId"] != "c" || h[HeaderEventID] == "" {
				t.Errorf("event %s/%d: headers %v", e.Agg, e.Seq, h)
			}
		}
	}
	if policy == PoisonBlock {
		main.waitDistinct(t, 15, time.Minute)
		// Until the relay has dealt with each invalid event: refused it (its error recorded) or,
		// were it not refused, published it. One pool: poisonRows opens one per call.
		waitFor(t, time.Minute, "the invalid events refused or published", func() bool {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM public.outbox o LEFT JOIN public.outbox_parked p ON p.id = o.id
				WHERE (o.aggregate_id LIKE 'bad-%' OR o.aggregate_id = '') AND o.payload->>'seq' = '1'
				  AND (coalesce(p.error, o.error) IS NOT NULL AND coalesce(p.attempts, o.attempts) >= 1 OR public.outbox_published(o.id))`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == len(want)-1 // "/2" waits behind "/1"
		})
		// Everything the relay published is read, then checked.
		main.catchUp(t, k, topic, 30*time.Second)
		if dups := checkOrder(t, main.recs, good); dups != 0 {
			t.Errorf("%d duplicates", dups)
		}
		checkTopic()
		rows := poisonRows(t, url)
		for key, w := range want {
			if key == "/2" {
				continue // behind "/1"
			}
			if row := rows[key]; row.sent || row.err == nil || !strings.HasPrefix(*row.err, w) {
				t.Errorf("invalid event %s: sent %v, error %q; want unsent, an error starting %q", key, row.sent, deref(row.err), w)
			}
		}
		for _, key := range append(waiting, "/2") {
			row := rows[key]
			untouched := row.err == nil
			if tracking == TrackSnapshot {
				untouched = row.err != nil && *row.err == heldBack
			}
			if row.sent || row.attempts != 0 || !untouched {
				t.Errorf("later event %s of a blocked aggregate: sent %v, attempts %d, error %q; want it waiting untouched", key, row.sent, row.attempts, deref(row.err))
			}
		}
		for _, reason := range []string{reasonInvalid, reasonBadHeaders} {
			if got := metricValue(t, r.metrics.poison.WithLabelValues(reason, string(PoisonBlock))); got < 1 {
				t.Errorf("outbox_poison_events_total{reason=%q,policy=block} = %v", reason, got)
			}
		}
		return
	}

	// dead-letter
	dead := newCollector(t, k, dlq)
	// Every event acknowledged (published or dead-lettered), then everything the broker holds read.
	waitFor(t, time.Minute, "every event published or dead-lettered", func() bool { return pendingRows(t, pool) == 0 })
	main.catchUp(t, k, topic, 30*time.Second)
	dead.catchUp(t, k, dlq, 30*time.Second)
	after := map[string]int{}
	for _, b := range bad {
		good[b.agg], after[b.agg] = 3, 1 // the bad aggregates continue with event 2
	}
	if dups := checkOrderFrom(t, main.recs, good, after); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	checkTopic()
	letters := map[string]kafkatest.Record{}
	for _, rec := range dead.recs {
		var e seqEvent
		if err := json.Unmarshal(rec.Value, &e); err != nil {
			t.Fatalf("dead letter %v: %v", rec.Headers, err)
		}
		letters[fmt.Sprintf("%s/%d", e.Agg, e.Seq)] = rec
	}
	rows := poisonRows(t, url)
	for key, w := range want {
		rec, ok := letters[key]
		original := topic
		if key == "bad-type/1" {
			original = "" // no topic is known for an empty aggregate_type
		}
		switch {
		case !ok:
			t.Errorf("no dead letter for invalid event %s", key)
		case !strings.HasPrefix(rec.Headers[HeaderError], w) || rec.Headers[HeaderOriginalTopic] != original || rec.Headers[HeaderEventID] == "":
			t.Errorf("dead letter of %s: error %q, original_topic %q, headers %v; want an error starting %q, original_topic %q", key, rec.Headers[HeaderError], rec.Headers[HeaderOriginalTopic], rec.Headers, w, original)
		}
		if row := rows[key]; !row.sent || row.err == nil || !strings.HasPrefix(*row.err, "dead-lettered to "+dlq+": "+w) {
			t.Errorf("invalid event %s: sent %v, error %q; want it recorded dead-lettered with an error starting %q", key, row.sent, deref(row.err), w)
		}
	}
	if len(letters) != len(want) {
		t.Errorf("%d dead letters, want %d", len(letters), len(want))
	}
	for _, key := range waiting {
		if row := rows[key]; !row.sent || row.err != nil {
			t.Errorf("later event %s of a dead-lettered aggregate: sent %v, error %q; want published", key, row.sent, deref(row.err))
		}
	}
	for _, reason := range []string{reasonInvalid, reasonBadHeaders} {
		if got := metricValue(t, r.metrics.poison.WithLabelValues(reason, string(PoisonDeadLetter))); got < 4 {
			t.Errorf("outbox_poison_events_total{reason=%q,policy=dead-letter} = %v, want 4", reason, got)
		}
	}
}

// TestReplayRefusesInvalidEvents: a replay whose range holds an event the table's CHECKs would
// refuse fails on it, naming it and its empty column, rather than publishing it again; a good
// range builds its messages.
func TestReplayRefusesInvalidEvents(t *testing.T) {
	cfg := testConfig("postgres://unused@127.0.0.1:1/x", []string{"127.0.0.1:1"}, "events")
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.pub.close()
	build := func(aggType, aggID, eventType string) error {
		b := r.getBatch()
		b.rows = append(b.rows, row{id: 7, createdAt: time.Now(), eventID: []byte("00000000-0000-4000-8000-000000000007"),
			aggType: []byte(aggType), aggID: []byte(aggID), eventType: []byte(eventType), payload: []byte(`{}`), headers: []byte(`{}`)})
		return r.replayMessages(&replayJob{id: 1, idText: []byte("1")}, b, headerKeys{})
	}
	if err := build("order", "a", "Placed"); err != nil {
		t.Fatalf("a good event: %v", err)
	}
	for _, c := range []struct{ aggType, aggID, eventType, col string }{
		{"", "a", "Placed", "aggregate_type"}, {"order", "", "Placed", "aggregate_id"}, {"order", "a", "", "event_type"},
	} {
		err := build(c.aggType, c.aggID, c.eventType)
		var ev errReplayEvent
		if !errors.As(err, &ev) || !strings.Contains(err.Error(), "position 7): empty "+c.col) {
			t.Errorf("empty %s: %v, want the replay to fail on it", c.col, err)
		}
	}
}
