package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// Append takes the caller's transaction in any of pgx's shapes.
var (
	_ Querier = pgx.Tx(nil)
	_ Querier = (*pgxpool.Tx)(nil)
	_ Querier = (*pgxpool.Pool)(nil)
	_ Querier = (*pgx.Conn)(nil)
)

func orderEvent(id string) Event {
	return Event{
		AggregateType: "order",
		AggregateID:   id,
		EventType:     "OrderCreated",
		Payload:       json.RawMessage(`{"order_id":"` + id + `","total":12.50}`),
	}
}

func countRows(t testing.TB, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table string) int {
	t.Helper()
	var n int
	if err := q.QueryRow(ctxT(t), "SELECT count(*) FROM "+outboxdb.MustParseTable(table).Ident()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// StoredPayloadSize must agree with PostgreSQL: the same length as octet_length(p::jsonb::text),
// and an error exactly when jsonb rejects the document.
func TestStoredPayloadSizeMatchesPostgres(t *testing.T) {
	_, pool := newDB(t, "outbox")
	ctx := ctxT(t)
	type doc struct {
		json    string
		atLeast bool
	}
	var docs []doc
	for _, c := range payloadCases {
		docs = append(docs, doc{c.json, c.atLeast})
	}
	for _, p := range randomPayloads(300) {
		docs = append(docs, doc{json: p})
	}
	for _, d := range docs {
		if !json.Valid([]byte(d.json)) {
			t.Fatalf("not valid JSON: %s", d.json)
		}
		got, err := StoredPayloadSize([]byte(d.json))
		var want int
		pgErr := pool.QueryRow(ctx, "SELECT octet_length($1::jsonb::text)", d.json).Scan(&want)
		switch {
		case err != nil && pgErr != nil:
			if !errors.Is(err, ErrInvalidPayload) {
				t.Errorf("%.60s: error %v does not wrap ErrInvalidPayload", d.json, err)
			}
		case err != nil:
			t.Errorf("%.60s: rejected (%v) but PostgreSQL stores it (%d bytes)", d.json, err, want)
		case pgErr != nil:
			t.Errorf("%.60s: accepted (%d bytes) but PostgreSQL rejects it: %v", d.json, got, pgErr)
		case got != want && (!d.atLeast || got <= want):
			t.Errorf("%.60s: size %d, PostgreSQL %d", d.json, got, want)
		}
	}
}

func TestAppendCommit(t *testing.T) {
	for _, table := range []string{"outbox", "shop.events"} {
		t.Run(table, func(t *testing.T) {
			_, pool := newDB(t, table)
			ctx := ctxT(t)
			w := newWriter(t, table)
			ev := Event{
				AggregateType: "order",
				AggregateID:   "order-42",
				EventType:     "OrderCreated",
				Payload:       json.RawMessage(`{"total": 12.50, "items": [{"sku": "A-1", "qty": 2}]}`),
				Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "correlation_id": "c-1",
					"quoted \"key\"": "q\" b\\ n\n t\t r\r c\x01\x1f é 😀 \u2028 <&> \x7f", "empty": ""},
				EventID: "0191F0A4-7E5C-7CC1-9A3E-6B9D2F1C0A11",
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			a, err := w.Append(ctx, tx, ev)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if a.EventID != strings.ToLower(ev.EventID) {
				t.Fatalf("Appended = %+v", a)
			}

			var (
				eventID, aggType, aggID, evType string
				payloadEq                       bool
				headers                         map[string]string
				createdAt                       time.Time
				sentAt                          *time.Time
				attempts                        int
			)
			err = pool.QueryRow(ctx, `SELECT event_id::text, aggregate_type, aggregate_id, event_type,
				payload = $2::jsonb, headers, created_at, sent_at, attempts
				FROM `+outboxdb.MustParseTable(table).Ident()+` WHERE event_id = $1`, a.EventID, string(ev.Payload)).
				Scan(&eventID, &aggType, &aggID, &evType, &payloadEq, &headers, &createdAt, &sentAt, &attempts)
			if err != nil {
				t.Fatal(err)
			}
			if eventID != a.EventID || aggType != "order" || aggID != "order-42" || evType != "OrderCreated" {
				t.Errorf("row: %s %s %s %s", eventID, aggType, aggID, evType)
			}
			if !payloadEq {
				t.Error("stored payload differs from the appended one")
			}
			if !reflect.DeepEqual(headers, ev.Headers) {
				t.Errorf("headers %v, want %v", headers, ev.Headers)
			}
			if time.Since(createdAt) > time.Minute || sentAt != nil || attempts != 0 {
				t.Errorf("created_at %v, sent_at %v, attempts %d", createdAt, sentAt, attempts)
			}

			// Without an EventID, the Writer generates one (version 4); without headers, they are {}.
			tx, err = pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			b, err := w.Append(ctx, tx, orderEvent("order-43"))
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if id, ok := parseUUID(b.EventID); !ok || b.EventID == a.EventID || id[6]>>4 != 4 || id[8]>>6 != 2 || (pgtype.UUID{Bytes: id, Valid: true}).String() != b.EventID {
				t.Errorf("second event %+v after %+v: want a new version 4 UUID in lower case", b, a)
			}
			if idA, idB := rowID(t, pool, table, a.EventID), rowID(t, pool, table, b.EventID); idB <= idA {
				t.Errorf("second event's id %d not above the first's %d", idB, idA)
			}
			var h string
			if err := pool.QueryRow(ctx, "SELECT headers::text FROM "+outboxdb.MustParseTable(table).Ident()+" WHERE event_id = $1", b.EventID).Scan(&h); err != nil || h != "{}" {
				t.Errorf("headers %q, %v", h, err)
			}
		})
	}
}

// A rolled-back transaction leaves no event, whatever it appended.
func TestAppendRollback(t *testing.T) {
	_, pool := newDB(t, "outbox")
	ctx := ctxT(t)
	w := newWriter(t, "outbox")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, tx, orderEvent("o-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.AppendBatch(ctx, tx, []Event{orderEvent("o-2"), orderEvent("o-3")}); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, tx, "outbox"); n != 3 {
		t.Fatalf("%d rows inside the transaction, want 3", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, pool, "outbox"); n != 0 {
		t.Fatalf("%d rows after rollback, want 0", n)
	}
}

func TestAppendBatch(t *testing.T) {
	_, pool := newDB(t, "shop.events")
	ctx := ctxT(t)
	w := newWriter(t, "shop.events")
	evs := []Event{
		orderEvent("b"),
		{AggregateType: "user", AggregateID: "a", EventType: "UserRenamed", Payload: json.RawMessage(`{"name":"x"}`),
			Headers: map[string]string{"k": "v"}, EventID: "11111111-1111-1111-1111-111111111111"},
		orderEvent("c"),
		orderEvent("b"),
		{AggregateType: "user", AggregateID: "a", EventType: "UserDeleted", Payload: json.RawMessage(`null`)},
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	got, err := w.AppendBatch(ctx, tx, evs)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(evs) {
		t.Fatalf("%d results for %d events", len(got), len(evs))
	}
	if got[1].EventID != "11111111-1111-1111-1111-111111111111" {
		t.Errorf("event 1 has event id %s", got[1].EventID)
	}
	// The batch holds one lock per distinct aggregate, each keyed as documented.
	var locks int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.pid = pg_backend_pid() AND l.granted
		  AND ((l.classid::bigint << 32) | l.objid::bigint) IN (
		    SELECT hashtextextended('shop.events:' || a, 0) FROM unnest(ARRAY['a', 'b', 'c']) a)`).Scan(&locks); err != nil {
		t.Fatal(err)
	}
	if locks != 3 {
		t.Errorf("%d aggregate locks held, want 3", locks)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT id, event_id::text, aggregate_type, aggregate_id, event_type, payload::text, headers::text
		FROM shop.events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		id                                     int64
		eventID, aggType, aggID, evType, p, hd string
	}
	stored, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.id, &x.eventID, &x.aggType, &x.aggID, &x.evType, &x.p, &x.hd)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != len(evs) {
		t.Fatalf("%d rows stored", len(stored))
	}
	// Rows are stored, and results returned, in batch order.
	for i, r := range stored {
		ev := evs[i]
		if r.eventID != got[i].EventID || r.aggType != ev.AggregateType ||
			r.aggID != ev.AggregateID || r.evType != ev.EventType {
			t.Errorf("row %d in id order: %+v, result %+v, event %+v", i, r, got[i], ev)
		}
	}
	if stored[1].hd != `{"k": "v"}` || stored[0].hd != `{}` || stored[4].p != "null" {
		t.Errorf("headers %s / %s, payload %s", stored[1].hd, stored[0].hd, stored[4].p)
	}

	// An empty batch writes nothing and needs no connection.
	if got, err := w.AppendBatch(ctx, nil, nil); got != nil || err != nil {
		t.Errorf("empty batch: %v, %v", got, err)
	}
}

// Every validation error is reported with errors.Is, before anything reaches PostgreSQL: the
// caller's transaction is still usable and holds no new row.
func TestAppendValidation(t *testing.T) {
	_, pool := newDB(t, "outbox")
	ctx := ctxT(t)
	ok := Event{AggregateType: "order", AggregateID: "o-1", EventType: "OrderCreated", Payload: json.RawMessage(`{}`)}
	with := func(f func(*Event)) Event { e := ok; f(&e); return e }
	cases := map[string]struct {
		ev    Event
		limit int
		want  error
	}{
		"empty aggregate type": {ev: with(func(e *Event) { e.AggregateType = "" }), want: ErrEmptyAggregateType},
		"empty aggregate id":   {ev: with(func(e *Event) { e.AggregateID = "" }), want: ErrEmptyAggregateID},
		"empty event type":     {ev: with(func(e *Event) { e.EventType = "" }), want: ErrEmptyEventType},
		"NUL in aggregate id":  {ev: with(func(e *Event) { e.AggregateID = "a\x00b" }), want: ErrInvalidText},
		"bad UTF-8 event type": {ev: with(func(e *Event) { e.EventType = "Order\xff" }), want: ErrInvalidText},
		"nil payload":          {ev: with(func(e *Event) { e.Payload = nil }), want: ErrInvalidPayload},
		"truncated JSON":       {ev: with(func(e *Event) { e.Payload = json.RawMessage(`{"a":`) }), want: ErrInvalidPayload},
		"two JSON values":      {ev: with(func(e *Event) { e.Payload = json.RawMessage(`{} {}`) }), want: ErrInvalidPayload},
		"bad UTF-8 payload":    {ev: with(func(e *Event) { e.Payload = json.RawMessage("\"\xff\"") }), want: ErrInvalidPayload},
		"NUL escape":           {ev: with(func(e *Event) { e.Payload = json.RawMessage(`{"a":"\u0000"}`) }), want: ErrInvalidPayload},
		"lone surrogate":       {ev: with(func(e *Event) { e.Payload = json.RawMessage(`"\udead"`) }), want: ErrInvalidPayload},
		"numeric overflow":     {ev: with(func(e *Event) { e.Payload = json.RawMessage(`[1e200000]`) }), want: ErrInvalidPayload},
		"JSON and bytes":       {ev: with(func(e *Event) { e.PayloadBytes = []byte{1} }), want: ErrInvalidPayload},
		"tombstone with JSON":  {ev: with(func(e *Event) { e.Tombstone = true }), want: ErrInvalidPayload},
		"bytes too large": {ev: with(func(e *Event) {
			e.Payload, e.PayloadBytes = nil, make([]byte, DefaultMaxPayloadBytes+1)
		}), want: ErrPayloadTooLarge},
		"payload too large": {ev: with(func(e *Event) {
			e.Payload = json.RawMessage(`"` + strings.Repeat("x", DefaultMaxPayloadBytes-1) + `"`)
		}), want: ErrPayloadTooLarge},
		"payload at default limit": {ev: with(func(e *Event) {
			e.Payload = json.RawMessage(`"` + strings.Repeat("x", DefaultMaxPayloadBytes-2) + `"`)
		})},
		// {"a":1} is 7 bytes as sent and 8 as stored ({"a": 1}): the limit applies to the latter.
		"stored size at limit":   {ev: with(func(e *Event) { e.Payload = json.RawMessage(`{"a":1}`) }), limit: 8},
		"stored size over limit": {ev: with(func(e *Event) { e.Payload = json.RawMessage(`{"a":1}`) }), limit: 7, want: ErrPayloadTooLarge},
		"exponent over limit":    {ev: with(func(e *Event) { e.Payload = json.RawMessage(`1e20`) }), limit: 20, want: ErrPayloadTooLarge},
		"empty header key":       {ev: with(func(e *Event) { e.Headers = map[string]string{"": "v"} }), want: ErrInvalidHeader},
		"reserved header":        {ev: with(func(e *Event) { e.Headers = map[string]string{"event_id": "x"} }), want: ErrInvalidHeader},
		"NUL in header value":    {ev: with(func(e *Event) { e.Headers = map[string]string{"k": "\x00"} }), want: ErrInvalidHeader},
		"bad UTF-8 header key":   {ev: with(func(e *Event) { e.Headers = map[string]string{"\xff": "v"} }), want: ErrInvalidHeader},
		"huge aggregate id":      {ev: with(func(e *Event) { e.AggregateID = strings.Repeat("a", MaxKeyAndHeadersBytes/2) }), want: ErrMessageTooLarge},
		"huge header":            {ev: with(func(e *Event) { e.Headers = map[string]string{"k": strings.Repeat("v", MaxKeyAndHeadersBytes)} }), want: ErrMessageTooLarge},
		"headers near the limit": {ev: with(func(e *Event) { e.Headers = map[string]string{"k": strings.Repeat("v", MaxKeyAndHeadersBytes-300)} })},
		"event id not a UUID":    {ev: with(func(e *Event) { e.EventID = "order-1" }), want: ErrInvalidEventID},
		"valid":                  {ev: with(func(e *Event) { e.Headers = map[string]string{"traceparent": "00-1-2-01", "x": ""} })},
	}
	for _, k := range ReservedHeaders {
		cases["reserved header "+k] = struct {
			ev    Event
			limit int
			want  error
		}{ev: with(func(e *Event) { e.Headers = map[string]string{"traceparent": "x", k: "v"} }), want: ErrInvalidHeader}
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var opts []Option
			if c.limit > 0 {
				opts = append(opts, WithMaxPayloadBytes(c.limit))
			}
			w := newWriter(t, "outbox", opts...)
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			before := countRows(t, tx, "outbox")

			_, err = w.Append(ctx, tx, c.ev)
			checkValidationError(t, err, c.want, 0)
			// In a batch, the error names the offending event and nothing is written.
			_, berr := w.AppendBatch(ctx, tx, []Event{ok, ok, c.ev, ok})
			checkValidationError(t, berr, c.want, 2)

			wantRows := before
			if c.want == nil {
				wantRows += 5
			}
			if n := countRows(t, tx, "outbox"); n != wantRows { // also proves tx is not aborted
				t.Errorf("%d rows, want %d", n, wantRows)
			}
		})
	}
}

func checkValidationError(t *testing.T, err, want error, index int) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Errorf("unexpected error: %v", err)
		}
		return
	}
	if !errors.Is(err, want) {
		t.Errorf("error %v, want %v", err, want)
	}
	var ie *InvalidEventError
	if !errors.As(err, &ie) || ie.Index != index {
		t.Errorf("error %v is not an *InvalidEventError for index %d", err, index)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("event %d", index)) {
		t.Errorf("error %q does not name event %d", err, index)
	}
}

// lockWaiter reports whether the backend pid waits for an advisory lock.
func lockWaiter(t testing.TB, pool *pgxpool.Pool, pid uint32) bool {
	t.Helper()
	var waiting bool
	if err := pool.QueryRow(ctxT(t), `SELECT EXISTS (SELECT 1 FROM pg_locks
		WHERE pid = $1 AND locktype = 'advisory' AND NOT granted)`, int32(pid)).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	return waiting
}

// The scenario the aggregate lock exists for: T1 appends to an aggregate, T2 appends to the
// same aggregate, and T2 tries to commit before T1. Without the lock, T2 commits first with the
// larger id, so an event with a smaller id appears after the relay may already have passed it:
// id order and commit order disagree. With the lock, T2 waits for T1 (and draws its id only
// after T1 committed), so ids follow commit order.
func TestAggregateLockOrdersIDsByCommit(t *testing.T) {
	for _, lock := range []bool{true, false} {
		t.Run(fmt.Sprintf("lock=%v", lock), func(t *testing.T) {
			url, pool := newDB(t, "outbox")
			ctx := ctxT(t)
			// The observer of commit order is the database, not the clients: each transaction
			// bumps this row just before it commits, and the row's lock holds the next bump
			// until that commit. (Recording the order where Commit returns raced: T2's
			// goroutine could record before the test goroutine, though T1 committed first.)
			if _, err := pool.Exec(ctx, `CREATE TABLE commit_seq (n int NOT NULL);
				INSERT INTO commit_seq VALUES (0)`); err != nil {
				t.Fatal(err)
			}
			type commit struct{ seq, id int64 }
			commitWith := func(tx pgx.Tx, id int64) (commit, error) {
				c := commit{id: id}
				if err := tx.QueryRow(ctx, `UPDATE commit_seq SET n = n + 1 RETURNING n`).Scan(&c.seq); err != nil {
					return c, err
				}
				return c, tx.Commit(ctx)
			}
			w := newWriter(t, "outbox")
			if !lock {
				w.noLock = true
				w.buildSQL()
			}
			c1, c2 := connect(t, url), connect(t, url)
			t1, err := c1.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			a1, err := w.Append(ctx, t1, orderEvent("agg"))
			if err != nil {
				t.Fatal(err)
			}

			done := make(chan error, 1)
			var second commit
			go func() {
				t2, err := c2.Begin(ctx)
				if err != nil {
					done <- err
					return
				}
				a2, err := w.Append(ctx, t2, orderEvent("agg"))
				if err != nil {
					done <- err
					return
				}
				var id2 int64
				if err := t2.QueryRow(ctx, "SELECT id FROM outbox WHERE event_id = $1", a2.EventID).Scan(&id2); err != nil {
					done <- err
					return
				}
				second, err = commitWith(t2, id2)
				done <- err
			}()

			if lock {
				eventually(t, 10*time.Second, "T2 to wait for the aggregate lock", func() bool {
					return lockWaiter(t, pool, c2.PgConn().PID())
				})
				// T2 waits before drawing an id: the sequence has not moved past T1's id.
				var last int64
				if err := pool.QueryRow(ctx, "SELECT last_value FROM public.outbox_id_seq").Scan(&last); err != nil {
					t.Fatal(err)
				}
				if id1 := rowID(t, t1, "outbox", a1.EventID); last != id1 {
					t.Errorf("sequence at %d while T2 waits; T1 has id %d: T2 drew an id before the lock", last, id1)
				}
				select {
				case err := <-done:
					t.Fatalf("T2 finished while T1 holds the aggregate lock: %v", err)
				default:
				}
			} else if err := <-done; err != nil {
				t.Fatal(err)
			}
			first, err := commitWith(t1, rowID(t, t1, "outbox", a1.EventID))
			if err != nil {
				t.Fatal(err)
			}
			if lock {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}

			byCommit := []commit{first, second}
			sort.Slice(byCommit, func(i, j int) bool { return byCommit[i].seq < byCommit[j].seq })
			order := []int64{byCommit[0].id, byCommit[1].id}
			inOrder := order[0] < order[1]
			if lock && !inOrder {
				t.Errorf("commit order of ids %v: not ascending", order)
			}
			if !lock && inOrder {
				t.Errorf("without the lock T2 should commit first with the larger id; commit order %v", order)
			}
		})
	}
}

// commitOrderRun runs writers concurrent writers of perWriter transactions each on aggregate
// "agg" of pool's database: each transaction appends through appendFn (which returns the event
// id), some do a little more work, then bump a per-aggregate counter (whose row lock orders the
// commits) and record the counter value against the event. Counter order is commit order; it
// returns the transactions recorded and how many events' id order differs from it.
func commitOrderRun(t *testing.T, pool *pgxpool.Pool, writers, perWriter int,
	appendFn func(ctx context.Context, tx pgx.Tx, g, i int) (string, error)) (total, outOfOrder int) {
	t.Helper()
	ctx := ctxT(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE counters (aggregate_id text PRIMARY KEY, n int NOT NULL);
		CREATE TABLE commit_seq (event_id bigint PRIMARY KEY, n int NOT NULL);
		INSERT INTO counters VALUES ('agg', 0)`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for g := range writers {
		wg.Go(func() {
			for i := range perWriter {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					id, err := appendFn(ctx, tx, g, i)
					if err != nil {
						return err
					}
					if (g+i)%3 == 0 { // some transactions do a little more work before committing
						if _, err := tx.Exec(ctx, "SELECT pg_sleep(0.001)"); err != nil {
							return err
						}
					}
					_, err = tx.Exec(ctx, `WITH c AS (UPDATE counters SET n = n + 1 WHERE aggregate_id = 'agg' RETURNING n)
						INSERT INTO commit_seq SELECT (SELECT id FROM outbox WHERE event_id = $1::uuid), n FROM c`, id)
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE by_id <> by_commit) FROM (
		SELECT row_number() OVER (ORDER BY event_id) AS by_id, row_number() OVER (ORDER BY n) AS by_commit
		FROM commit_seq) s`).Scan(&total, &outOfOrder); err != nil {
		t.Fatal(err)
	}
	if total != writers*perWriter {
		t.Fatalf("%d transactions recorded, want %d", total, writers*perWriter)
	}
	return total, outOfOrder
}

// Many concurrent writers on one aggregate (commitOrderRun): with the aggregate lock, id order
// must equal commit order.
func TestAggregateLockConcurrentWriters(t *testing.T) {
	const writers, perWriter = 8, 50
	for _, lock := range []bool{true, false} {
		t.Run(fmt.Sprintf("lock=%v", lock), func(t *testing.T) {
			_, pool := newDB(t, "outbox")
			w := newWriter(t, "outbox")
			if !lock {
				w.noLock = true
				w.buildSQL()
			}
			total, outOfOrder := commitOrderRun(t, pool, writers, perWriter, func(ctx context.Context, tx pgx.Tx, _, _ int) (string, error) {
				a, err := w.Append(ctx, tx, orderEvent("agg"))
				return a.EventID, err
			})
			if lock && outOfOrder != 0 {
				t.Errorf("%d of %d events are out of commit order", outOfOrder, total)
			}
			// Without the lock the same workload must show the hazard, or this test proves nothing.
			if !lock && outOfOrder == 0 {
				t.Errorf("without the lock all %d events are in commit order: the test does not exercise the race", total)
			}
			t.Logf("lock=%v: %d of %d events out of commit order", lock, outOfOrder, total)
		})
	}
}

// AppendBatch locks its aggregates in sorted order and never holds one while waiting for an
// earlier one. T0 holds "a"; a batch with events of "b" then "a" must wait on "a" without
// holding "b", so a third transaction can still append to "b". Locking in event order would
// hold "b" while waiting, and the third transaction would block.
func TestAppendBatchLocksInSortedOrder(t *testing.T) {
	url, pool := newDB(t, "outbox")
	ctx := ctxT(t)
	w := newWriter(t, "outbox")
	c0, c1, c2 := connect(t, url), connect(t, url), connect(t, url)

	t0, err := c0.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, t0, orderEvent("a")); err != nil {
		t.Fatal(err)
	}
	batchDone := make(chan error, 1)
	go func() {
		t1, err := c1.Begin(ctx)
		if err == nil {
			_, err = w.AppendBatch(ctx, t1, []Event{orderEvent("b"), orderEvent("a"), orderEvent("b")})
		}
		if err == nil {
			err = t1.Commit(ctx)
		}
		batchDone <- err
	}()
	eventually(t, 10*time.Second, "the batch to wait for aggregate a", func() bool {
		return lockWaiter(t, pool, c1.PgConn().PID())
	})

	appendCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	t2, err := c2.Begin(appendCtx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(appendCtx, t2, orderEvent("b")); err != nil {
		t.Fatalf("append to b while the batch waits for a: %v (the batch holds b)", err)
	}
	if err := t2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := t0.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-batchDone; err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, pool, "outbox"); n != 5 {
		t.Errorf("%d rows, want 5", n)
	}
}

// Appending to two aggregates in opposite orders from two transactions deadlocks, as documented;
// PostgreSQL aborts one of them and Append reports it (IsDeadlock).
func TestOppositeOrderDeadlock(t *testing.T) {
	url, _ := newDB(t, "outbox")
	ctx := ctxT(t)
	w := newWriter(t, "outbox")
	c1, c2 := connect(t, url), connect(t, url)
	for _, c := range []*pgx.Conn{c1, c2} {
		if _, err := c.Exec(ctx, "SET deadlock_timeout = '50ms'"); err != nil {
			t.Fatal(err)
		}
	}
	t1, err := c1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t2, err := c2.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, t1, orderEvent("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, t2, orderEvent("y")); err != nil {
		t.Fatal(err)
	}
	type result struct {
		tx  pgx.Tx
		err error
	}
	results := make(chan result, 2)
	go func() { _, err := w.Append(ctx, t1, orderEvent("y")); results <- result{t1, err} }()
	go func() { _, err := w.Append(ctx, t2, orderEvent("x")); results <- result{t2, err} }()
	// PostgreSQL aborts one transaction, which releases its locks at once (not only at
	// ROLLBACK), so the other one's Append completes.
	r1, r2 := <-results, <-results
	if IsDeadlock(r2.err) {
		r1, r2 = r2, r1
	}
	if !IsDeadlock(r1.err) || r2.err != nil {
		t.Fatalf("results %v and %v, want one deadlock error and one success", r1.err, r2.err)
	}
	if err := r1.tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// The notify trigger wakes a listener once per committed transaction, whatever it inserted, and
// not at all for a rolled-back one.
func TestNotifyOncePerTransaction(t *testing.T) {
	url, pool := newDB(t, "shop.events")
	ctx := ctxT(t)
	w := newWriter(t, "shop.events")
	channel := outboxdb.MustParseTable("shop.events").Channel()
	listener := connect(t, url)
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}

	events := func(n int) []Event {
		evs := make([]Event, n)
		for i := range evs {
			evs[i] = orderEvent(fmt.Sprintf("o-%d", i%7))
		}
		return evs
	}
	cases := map[string]struct {
		run  func(tx pgx.Tx) error
		want int
	}{
		"100 Appends in one transaction": {run: func(tx pgx.Tx) error {
			for _, ev := range events(100) {
				if _, err := w.Append(ctx, tx, ev); err != nil {
					return err
				}
			}
			return nil
		}, want: 1},
		"one AppendBatch of 100": {run: func(tx pgx.Tx) error {
			_, err := w.AppendBatch(ctx, tx, events(100))
			return err
		}, want: 1},
		"batches and Appends mixed": {run: func(tx pgx.Tx) error {
			if _, err := w.AppendBatch(ctx, tx, events(30)); err != nil {
				return err
			}
			if _, err := w.Append(ctx, tx, orderEvent("x")); err != nil {
				return err
			}
			_, err := w.AppendBatch(ctx, tx, events(30))
			return err
		}, want: 1},
		"rolled back": {run: func(tx pgx.Tx) error {
			if _, err := w.AppendBatch(ctx, tx, events(10)); err != nil {
				return err
			}
			return errRollback
		}, want: 0},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			err := pgx.BeginFunc(ctx, pool, c.run)
			if err != nil && !errors.Is(err, errRollback) {
				t.Fatal(err)
			}
			// Notifications arrive in commit order, so once the sentinel sent after the
			// transaction arrives, every notification of the transaction has arrived too.
			if _, err := pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", channel); err != nil {
				t.Fatal(err)
			}
			got := 0
			for {
				waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				n, err := listener.WaitForNotification(waitCtx)
				cancel()
				if err != nil {
					t.Fatalf("waiting for notifications: %v", err)
				}
				if n.Payload == "sentinel" {
					break
				}
				got++
			}
			if got != c.want {
				t.Errorf("%d notifications, want %d", got, c.want)
			}
		})
	}
}

var errRollback = errors.New("roll back")

// WithoutAggregateLock is safe when the application serialises an aggregate's writers itself:
// both transactions lock the aggregate's row (SELECT ... FOR UPDATE) before they append, so T2
// waits on the row lock (seen in pg_locks) before it draws an id, and ids follow commit order.
func TestRowLockReplacesAggregateLock(t *testing.T) {
	url, pool := newDB(t, "outbox")
	ctx := ctxT(t)
	w, err := New("outbox", WithoutAggregateLock())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text); INSERT INTO orders VALUES ('agg', 'new')`); err != nil {
		t.Fatal(err)
	}
	lockRow := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT 1 FROM orders WHERE id = 'agg' FOR UPDATE`)
		return err
	}
	c1, c2 := connect(t, url), connect(t, url)
	t1, err := c1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := lockRow(t1); err != nil {
		t.Fatal(err)
	}
	a1, err := w.Append(ctx, t1, orderEvent("agg"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var a2 Appended
	go func() {
		done <- pgx.BeginFunc(ctx, c2, func(t2 pgx.Tx) error {
			if err := lockRow(t2); err != nil {
				return err
			}
			var err error
			a2, err = w.Append(ctx, t2, orderEvent("agg"))
			return err
		})
	}()
	eventually(t, 10*time.Second, "T2 to wait for the row lock", func() bool {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)`,
			int32(c2.PgConn().PID())).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	if err := t1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if id1, id2 := rowID(t, pool, "outbox", a1.EventID), rowID(t, pool, "outbox", a2.EventID); id2 <= id1 {
		t.Errorf("T1 committed first with id %d, T2 second with id %d: ids do not follow commit order", id1, id2)
	}
}

// rowID returns the id of the row event id eventID was stored in, read through q (a pool for a
// committed event, the appending transaction for one not yet committed).
func rowID(t testing.TB, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table, eventID string) int64 {
	t.Helper()
	var id int64
	if err := q.QueryRow(context.Background(), "SELECT id FROM "+outboxdb.MustParseTable(table).Ident()+" WHERE event_id = $1", eventID).Scan(&id); err != nil {
		t.Fatalf("row of event %s: %v", eventID, err)
	}
	return id
}

// PayloadBytes are stored in payload_bytes byte for byte (not UTF-8, not JSON), a Tombstone with
// neither column, by Append and by AppendBatch mixed with JSON events, in order.
func TestAppendBytesAndTombstones(t *testing.T) {
	_, pool := newDB(t, "outbox")
	ctx := ctxT(t)
	w := newWriter(t, "outbox")
	raw := []byte{0x00, 0xff, 0x80, 0x0a}
	ev := func(id string, f func(*Event)) Event { e := orderEvent(id); e.Payload = nil; f(&e); return e }
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, tx, ev("bytes", func(e *Event) { e.PayloadBytes = raw })); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, tx, ev("tomb", func(e *Event) { e.Tombstone = true })); err != nil {
		t.Fatal(err)
	}
	if _, err := w.AppendBatch(ctx, tx, []Event{
		orderEvent("batch-json"),
		ev("batch-bytes", func(e *Event) { e.PayloadBytes = raw }),
		ev("batch-empty", func(e *Event) { e.PayloadBytes = []byte{} }),
		ev("batch-tomb", func(e *Event) { e.Tombstone = true }),
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT aggregate_id, payload IS NULL, payload_bytes FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var (
			agg    string
			noJSON bool
			b      []byte
		)
		if err := rows.Scan(&agg, &noJSON, &b); err != nil {
			t.Fatal(err)
		}
		bs := "NULL"
		if b != nil {
			bs = fmt.Sprintf("%x", b)
		}
		got = append(got, fmt.Sprintf("%s json:%v bytes:%s", agg, !noJSON, bs))
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	want := []string{"bytes json:false bytes:00ff800a", "tomb json:false bytes:NULL", "batch-json json:true bytes:NULL",
		"batch-bytes json:false bytes:00ff800a", "batch-empty json:false bytes:", "batch-tomb json:false bytes:NULL"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}
