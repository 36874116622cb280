package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// sqlAppend is the SQL append a writer in another language runs: one statement.
const sqlAppend = `SELECT public.outbox_append('order', $1, 'OrderCreated', $2::jsonb)::text`

// The SQL append and the Go library lock one aggregate with the same key: a SQL append waits, as
// pg_locks shows, while a Go transaction holds the aggregate, before it draws its id; another
// aggregate's does not.
func TestSQLAppendTakesTheLibrarysLock(t *testing.T) {
	url, pool := newDB(t, "outbox")
	ctx := ctxT(t)
	w := newWriter(t, "outbox")
	c1, c2 := connect(t, url), connect(t, url)
	t1, err := c1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a1, err := w.Append(ctx, t1, orderEvent("agg"))
	if err != nil {
		t.Fatal(err)
	}
	var other string
	if err := pool.QueryRow(ctx, sqlAppend, "another", `{}`).Scan(&other); err != nil {
		t.Fatalf("the SQL append of another aggregate: %v", err)
	}
	seq := func() int64 {
		t.Helper()
		var last int64
		if err := pool.QueryRow(ctx, "SELECT last_value FROM public.outbox_id_seq").Scan(&last); err != nil {
			t.Fatal(err)
		}
		return last
	}
	before := seq()
	done := make(chan error, 1)
	go func() {
		var id string
		done <- pgx.BeginFunc(ctx, c2, func(tx pgx.Tx) error { return tx.QueryRow(ctx, sqlAppend, "agg", `{}`).Scan(&id) })
	}()
	eventually(t, 10*time.Second, "the SQL append to wait for the aggregate lock", func() bool {
		return lockWaiter(t, pool, c2.PgConn().PID())
	})
	if last := seq(); last != before {
		t.Errorf("sequence at %d while the SQL append waits, %d before it: it drew an id before the lock", last, before)
	}
	if id1 := rowID(t, t1, "outbox", a1.EventID); id1 >= before {
		t.Fatalf("the Go transaction's id %d, the sequence at %d", id1, before)
	}
	if err := t1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Concurrent writers on one aggregate (commitOrderRun), half through the Go library and half
// through the SQL append (and, to show the hazard, plain INSERTs): through the aggregate lock id
// order equals commit order, the order the relays publish in.
func TestSQLAppendConcurrentWriters(t *testing.T) {
	const writers, perWriter = 8, 50
	for _, how := range []string{"sql+go", "plain insert"} {
		t.Run(how, func(t *testing.T) {
			_, pool := newDB(t, "outbox")
			w := newWriter(t, "outbox")
			total, outOfOrder := commitOrderRun(t, pool, writers, perWriter, func(ctx context.Context, tx pgx.Tx, g, i int) (string, error) {
				var id string
				switch {
				case how == "plain insert":
					err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
						VALUES ('order', 'agg', 'OrderCreated', '{}') RETURNING event_id::text`).Scan(&id)
					return id, err
				case g%2 == 0:
					err := tx.QueryRow(ctx, sqlAppend, "agg", fmt.Sprintf(`{"writer": %d, "i": %d}`, g, i)).Scan(&id)
					return id, err
				}
				a, err := w.Append(ctx, tx, orderEvent("agg"))
				return a.EventID, err
			})
			locked := how != "plain insert"
			if locked && outOfOrder != 0 {
				t.Errorf("%d of %d events are out of commit order", outOfOrder, total)
			}
			if !locked && outOfOrder == 0 { // or this test proves nothing
				t.Errorf("plain INSERTs: all %d events in commit order: the test does not exercise the race", total)
			}
			t.Logf("%s: %d of %d events out of commit order", how, outOfOrder, total)
		})
	}
}

// Bad input to the SQL append is an error, never a silent nothing, whether or not the table keeps
// its CHECKs (a new table has none: outboxdb.NewTableChecks; the SQL appends refuse it themselves,
// migration 00023) and with the same SQLSTATE and constraint name either way; the event id is the
// given one or one PostgreSQL makes. What was refused is not in the table (a count by the database).
func TestSQLAppendInput(t *testing.T) {
	for _, checks := range []bool{true, false} {
		t.Run(fmt.Sprintf("checks=%v", checks), func(t *testing.T) { testSQLAppendInput(t, checks) })
	}
}

func testSQLAppendInput(t *testing.T, checks bool) {
	url, pool := newDB(t, "outbox")
	ctx := ctxT(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := outboxdb.SetChecks(ctx, db, outboxdb.MustParseTable("public.outbox"), checks, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE conrelid = 'public.outbox'::regclass AND contype = 'c'`).Scan(&n); err != nil || (n == 4) != checks {
		t.Fatalf("%d CHECKs (%v), want them %v", n, err, checks)
	}
	const given = "0f9c1b3e-2a4d-4c5e-8f70-1a2b3c4d5e6f"
	var id string
	if err := pool.QueryRow(ctx, `SELECT public.outbox_append('order', 'o-1', 'OrderCreated', '{"a": 1}', '{"traceparent": "00-x"}', $1)::text`, given).Scan(&id); err != nil || id != given {
		t.Fatalf("with an event id: %q, %v", id, err)
	}
	if err := pool.QueryRow(ctx, `SELECT public.outbox_append('order', 'o-1', 'OrderCreated', '{"a": 2}')::text`).Scan(&id); err != nil || len(id) != 36 || id == given {
		t.Fatalf("without an event id: %q, %v", id, err)
	}
	for name, c := range map[string]struct{ call, want, constraint string }{
		"null aggregate id":        {`SELECT public.outbox_append('order', NULL, 'OrderCreated', '{}')`, `column "aggregate_id"`, ""},
		"empty aggregate id":       {`SELECT public.outbox_append('order', '', 'OrderCreated', '{}')`, `outbox_aggregate_id_check`, "outbox_aggregate_id_check"},
		"empty type":               {`SELECT public.outbox_append('', 'o-1', 'OrderCreated', '{}')`, `outbox_aggregate_type_check`, "outbox_aggregate_type_check"},
		"empty event type":         {`SELECT public.outbox_append('order', 'o-1', '', '{}')`, `outbox_event_type_check`, "outbox_event_type_check"},
		"null payload":             {`SELECT public.outbox_append('order', 'o-1', 'OrderCreated', NULL)`, ``, ""}, // no value (migration 00020)
		"headers not object":       {`SELECT public.outbox_append('order', 'o-1', 'OrderCreated', '{}', '[1]')`, `outbox_headers_check`, "outbox_headers_check"},
		"payload not json":         {`SELECT public.outbox_append('order', 'o-1', 'OrderCreated', 'not json')`, `invalid input syntax for type json`, ""},
		"null event type":          {`SELECT public.outbox_append('order', 'o-1', NULL, '{}')`, `column "event_type"`, ""},
		"null headers":             {`SELECT public.outbox_append('order', 'o-1', 'OrderCreated', '{}', NULL)::text`, ``, ""},
		"bytes, empty event type":  {`SELECT public.outbox_append_bytes('order', 'o-1', '', '\x01'::bytea)`, `outbox_event_type_check`, "outbox_event_type_check"},
		"bytes, headers a string":  {`SELECT public.outbox_append_bytes('order', 'o-1', 'OrderCreated', '\x01'::bytea, '"x"')`, `outbox_headers_check`, "outbox_headers_check"},
		"bytes, empty aggregate":   {`SELECT public.outbox_append_bytes('order', '', 'OrderCreated', NULL)`, `outbox_aggregate_id_check`, "outbox_aggregate_id_check"},
		"bytes, null aggregate id": {`SELECT public.outbox_append_bytes('order', NULL, 'OrderCreated', NULL)`, `column "aggregate_id"`, ""},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := pool.Exec(context.Background(), c.call)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("%v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
			var pgErr *pgconn.PgError
			if c.constraint != "" && (!errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != c.constraint) {
				t.Errorf("error %#v, want SQLSTATE 23514 (check_violation) of constraint %s", err, c.constraint)
			}
		})
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&rows); err != nil || rows != 4 {
		t.Errorf("%d rows (%v), want the 4 valid appends", rows, err)
	}
}

// The SQL append of bytes (migration 00020) stores the value in payload_bytes, byte for byte, and
// NULL as an event without a value; it takes the aggregate's lock as outbox_append does.
func TestSQLAppendBytes(t *testing.T) {
	_, pool := newDB(t, "outbox")
	ctx := ctxT(t)
	var id string
	if err := pool.QueryRow(ctx, `SELECT public.outbox_append_bytes('order', 'o-1', 'OrderCreated', '\x00ff80'::bytea, '{"content-type": "application/x-protobuf"}')::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	var tomb string
	if err := pool.QueryRow(ctx, `SELECT public.outbox_append_bytes('order', 'o-1', 'OrderDeleted', NULL)::text`).Scan(&tomb); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id        string
		wantBytes []byte
	}{{id, []byte{0x00, 0xff, 0x80}}, {tomb, nil}} {
		var (
			payload *string
			b       []byte
		)
		if err := pool.QueryRow(ctx, `SELECT payload::text, payload_bytes FROM outbox WHERE event_id = $1::uuid`, c.id).Scan(&payload, &b); err != nil {
			t.Fatal(err)
		}
		if payload != nil || string(b) != string(c.wantBytes) || (b == nil) != (c.wantBytes == nil) {
			t.Errorf("event %s: payload %v payload_bytes %x, want NULL and %x", c.id, payload, b, c.wantBytes)
		}
	}
	// The lock: while a Go transaction holds aggregate agg, the bytes append of agg waits on it.
	url := pool.Config().ConnConfig.ConnString()
	c1, c2 := connect(t, url), connect(t, url)
	t1, err := c1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newWriter(t, "outbox").Append(ctx, t1, orderEvent("agg")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c2.Exec(ctx, `SELECT public.outbox_append_bytes('order', 'agg', 'OrderCreated', '\x01'::bytea)`)
		done <- err
	}()
	eventually(t, 10*time.Second, "the bytes append to wait for the aggregate lock", func() bool {
		return lockWaiter(t, pool, c2.PgConn().PID())
	})
	if err := t1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// With the table's lock trigger (outboxdb.SetLockedInserts, migration 00019), plain INSERTs,
// mixed with Go appends, keep id order = commit order too; without it they do not (above).
func TestLockedPlainInserts(t *testing.T) {
	url, pool := newDB(t, "outbox")
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := ctxT(t)
	tb := outboxdb.MustParseTable("public.outbox")
	for _, want := range []bool{true, true} { // the second call changes nothing
		changed, err := outboxdb.SetLockedInserts(ctx, db, tb, want, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if on, err := outboxdb.LockedInserts(ctx, db, tb); err != nil || !on {
			t.Fatalf("locked inserts %v (%v) after setting them (changed %v)", on, err, changed)
		}
	}
	w := newWriter(t, "outbox")
	const writers, perWriter = 8, 50
	total, outOfOrder := commitOrderRun(t, pool, writers, perWriter, func(ctx context.Context, tx pgx.Tx, g, _ int) (string, error) {
		if g%4 == 0 {
			a, err := w.Append(ctx, tx, orderEvent("agg"))
			return a.EventID, err
		}
		var id string
		err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', 'agg', 'OrderCreated', '{}') RETURNING event_id::text`).Scan(&id)
		return id, err
	})
	if outOfOrder != 0 {
		t.Errorf("%d of %d events are out of commit order with the lock trigger", outOfOrder, total)
	}
	if changed, err := outboxdb.SetLockedInserts(ctx, db, tb, false, 5*time.Second); err != nil || !changed {
		t.Fatalf("dropping the lock trigger: %v, %v", changed, err)
	}
	if on, err := outboxdb.LockedInserts(ctx, db, tb); err != nil || on {
		t.Errorf("locked inserts %v (%v) after dropping the trigger", on, err)
	}
	t.Logf("plain INSERTs with the lock trigger: %d of %d events out of commit order", outOfOrder, total)
}
