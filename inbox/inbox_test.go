package inbox_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/inbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestMain starts the shared PostgreSQL with an "examples" database before anything runs: the
// runnable examples read DATABASE_URL, as an application would.
func TestMain(m *testing.M) {
	os.Exit(pgtest.RunWithExampleDB(m, outboxdb.MustParseTable("public.outbox")))
}

func applySchema(ctx context.Context, url, outboxTable string) error {
	return pgtest.OutboxSchema(ctx, url, outboxdb.MustParseTable(outboxTable), -1)
}

// newDB returns a pool on a fresh database holding the outbox schema (and so the inbox table) in
// schema, and an effects table the handlers write to.
func newDB(t *testing.T, schema string) *pgxpool.Pool {
	t.Helper()
	url := pgtest.NewDatabase(t)
	ctx := ctxT(t)
	if err := applySchema(ctx, url, schema+".outbox"); err != nil {
		t.Fatalf("apply migrations: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (account text PRIMARY KEY, balance int NOT NULL);
		INSERT INTO effects VALUES ('acc', 0)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newInbox(t *testing.T, table string) *inbox.Inbox {
	t.Helper()
	in, err := inbox.New(table)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// deposit is a handler whose effect is visible: it adds 10 to the account's balance.
func deposit(calls *atomic.Int32) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx) error {
		calls.Add(1)
		_, err := tx.Exec(ctx, "UPDATE effects SET balance = balance + 10 WHERE account = 'acc'")
		return err
	}
}

func balance(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var b int
	if err := pool.QueryRow(ctxT(t), "SELECT balance FROM effects WHERE account = 'acc'").Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

func inboxRows(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctxT(t), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lockWaiters counts the backends of the pool's database waiting for a lock.
func lockWaiters(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctxT(t), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Process runs on a pool, a connection, or in a savepoint of the caller's transaction.
var (
	_ inbox.Beginner = (*pgxpool.Pool)(nil)
	_ inbox.Beginner = (*pgxpool.Conn)(nil)
	_ inbox.Beginner = (*pgx.Conn)(nil)
	_ inbox.Beginner = pgx.Tx(nil)
)

const eventID = "0191f0a4-7e5c-7cc1-9a3e-6b9d2f1c0a11"

func TestNew(t *testing.T) {
	for name, want := range map[string]string{
		"":            "public.inbox",
		"inbox":       "public.inbox",
		"shop.inbox":  "shop.inbox",
		"shop.Inbox":  "",
		"a.b.c":       "",
		"inbox;drop":  "",
		`"inbox"`:     "",
		"shop.":       "",
		".inbox":      "",
		"public.in x": "",
	} {
		in, err := inbox.New(name)
		switch {
		case want == "" && !errors.Is(err, inbox.ErrInvalidTable):
			t.Errorf("New(%q): %v, want ErrInvalidTable", name, err)
		case want != "" && (err != nil || in.Table() != want):
			t.Errorf("New(%q): %v, %v; want %s", name, in, err, want)
		}
	}
}

func TestProcessOnce(t *testing.T) {
	for _, schema := range []string{"public", "shop"} {
		t.Run(schema, func(t *testing.T) {
			pool := newDB(t, schema)
			ctx := ctxT(t)
			in := newInbox(t, schema+".inbox")
			var calls atomic.Int32
			msg := inbox.Message{EventID: eventID, Topic: "orders.events"}

			processed, err := in.Process(ctx, pool, msg, deposit(&calls))
			if err != nil || !processed {
				t.Fatalf("first delivery: processed=%v, %v", processed, err)
			}
			var topic string
			var at time.Time
			if err := pool.QueryRow(ctx, "SELECT topic, processed_at FROM "+schema+".inbox WHERE event_id = $1", eventID).
				Scan(&topic, &at); err != nil || topic != "orders.events" || at.IsZero() {
				t.Errorf("inbox row: %q %v %v", topic, at, err)
			}
			// Redeliveries, in any case of the UUID, are skipped.
			for _, id := range []string{eventID, "0191F0A4-7E5C-7CC1-9A3E-6B9D2F1C0A11"} {
				processed, err = in.Process(ctx, pool, inbox.Message{EventID: id, Topic: "orders.events"}, deposit(&calls))
				if err != nil || processed {
					t.Errorf("redelivery %s: processed=%v, %v", id, processed, err)
				}
			}
			if calls.Load() != 1 || balance(t, pool) != 10 || inboxRows(t, pool, schema+".inbox") != 1 {
				t.Errorf("handler ran %d times, balance %d", calls.Load(), balance(t, pool))
			}
			// Another event is processed.
			processed, err = in.Process(ctx, pool, inbox.Message{EventID: "11111111-1111-1111-1111-111111111111"}, deposit(&calls))
			if err != nil || !processed || balance(t, pool) != 20 {
				t.Errorf("second event: processed=%v, %v, balance %d", processed, err, balance(t, pool))
			}
		})
	}
}

// Five consumers receive the same event at once. The first to insert the inbox row runs the
// handler, which is held open until the four others wait on that row; they must then skip.
func TestProcessConcurrentRedelivery(t *testing.T) {
	pool := newDB(t, "public")
	ctx := ctxT(t)
	in := newInbox(t, "")
	var calls atomic.Int32
	release := make(chan struct{})
	handler := func(ctx context.Context, tx pgx.Tx) error {
		<-release
		return deposit(&calls)(ctx, tx)
	}
	const deliveries = 5
	var processedCount atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, deliveries)
	for range deliveries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			processed, err := in.Process(ctx, pool, inbox.Message{EventID: eventID, Topic: "t"}, handler)
			if err != nil {
				errs <- err
			}
			if processed {
				processedCount.Add(1)
			}
		}()
	}
	eventually(t, 10*time.Second, "four deliveries to wait for the first", func() bool {
		return lockWaiters(t, pool) == deliveries-1
	})
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if processedCount.Load() != 1 || calls.Load() != 1 || balance(t, pool) != 10 {
		t.Errorf("processed %d times, handler ran %d times, balance %d; want 1, 1, 10",
			processedCount.Load(), calls.Load(), balance(t, pool))
	}
}

var errBoom = errors.New("boom")

// A failing handler rolls back its own writes and the inbox row; a redelivery then applies the
// event once.
func TestProcessHandlerErrorThenRedelivery(t *testing.T) {
	pool := newDB(t, "public")
	ctx := ctxT(t)
	in := newInbox(t, "")
	msg := inbox.Message{EventID: eventID, Topic: "t"}
	var calls atomic.Int32

	processed, err := in.Process(ctx, pool, msg, func(ctx context.Context, tx pgx.Tx) error {
		if err := deposit(&calls)(ctx, tx); err != nil {
			return err
		}
		return errBoom // after writing
	})
	if processed || !errors.Is(err, errBoom) {
		t.Fatalf("failing handler: processed=%v, %v; want errBoom", processed, err)
	}
	if balance(t, pool) != 0 || inboxRows(t, pool, "public.inbox") != 0 {
		t.Fatalf("after the failure: balance %d, %d inbox rows; want 0, 0", balance(t, pool), inboxRows(t, pool, "public.inbox"))
	}
	for i, want := range []bool{true, false} {
		processed, err = in.Process(ctx, pool, msg, deposit(&calls))
		if err != nil || processed != want {
			t.Errorf("redelivery %d: processed=%v, %v; want %v", i+1, processed, err, want)
		}
	}
	if balance(t, pool) != 10 {
		t.Errorf("balance %d, want 10", balance(t, pool))
	}
	// A panicking handler is rolled back too, and the pool stays usable.
	func() {
		defer func() { _ = recover() }()
		_, _ = in.Process(ctx, pool, inbox.Message{EventID: "22222222-2222-2222-2222-222222222222"}, func(ctx context.Context, tx pgx.Tx) error {
			_ = deposit(&calls)(ctx, tx)
			panic("handler panic")
		})
	}()
	if balance(t, pool) != 10 || inboxRows(t, pool, "public.inbox") != 1 {
		t.Errorf("after a panic: balance %d, %d inbox rows; want 10, 1", balance(t, pool), inboxRows(t, pool, "public.inbox"))
	}
}

// A delivery that waits behind a failing one processes the event itself once the first rolls
// back.
func TestProcessWaitingDeliveryTakesOverAfterFailure(t *testing.T) {
	pool := newDB(t, "public")
	ctx := ctxT(t)
	in := newInbox(t, "")
	msg := inbox.Message{EventID: eventID}
	var calls atomic.Int32
	entered, fail := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := in.Process(ctx, pool, msg, func(ctx context.Context, tx pgx.Tx) error {
			close(entered)
			<-fail
			return errBoom
		})
		first <- err
	}()
	<-entered
	second := make(chan error, 1)
	var secondProcessed bool
	go func() {
		var err error
		secondProcessed, err = in.Process(ctx, pool, msg, deposit(&calls))
		second <- err
	}()
	eventually(t, 10*time.Second, "the second delivery to wait for the first", func() bool {
		return lockWaiters(t, pool) == 1
	})
	close(fail)
	if err := <-first; !errors.Is(err, errBoom) {
		t.Fatalf("first delivery: %v, want errBoom", err)
	}
	if err := <-second; err != nil || !secondProcessed {
		t.Fatalf("second delivery: processed=%v, %v", secondProcessed, err)
	}
	if calls.Load() != 1 || balance(t, pool) != 10 {
		t.Errorf("handler ran %d times, balance %d", calls.Load(), balance(t, pool))
	}
}

func TestProcessMissingEventID(t *testing.T) {
	pool := newDB(t, "public")
	ctx := ctxT(t)
	in := newInbox(t, "")
	for _, id := range []string{
		"", "order-1", "0191f0a47e5c7cc19a3e6b9d2f1c0a11", "{0191f0a4-7e5c-7cc1-9a3e-6b9d2f1c0a11}",
		"0191f0a4-7e5c-7cc1-9a3e-6b9d2f1c0a1z", " 0191f0a4-7e5c-7cc1-9a3e-6b9d2f1c0a1",
	} {
		called := false
		processed, err := in.Process(ctx, pool, inbox.Message{EventID: id, Topic: "t"}, func(context.Context, pgx.Tx) error {
			called = true
			return nil
		})
		if processed || called || !errors.Is(err, inbox.ErrMissingEventID) {
			t.Errorf("event id %q: processed=%v, handler called=%v, %v; want ErrMissingEventID", id, processed, called, err)
		}
	}
	if n := inboxRows(t, pool, "public.inbox"); n != 0 {
		t.Errorf("%d inbox rows", n)
	}
}

// Given the caller's transaction, Process works in a savepoint: its effect and record stand or
// fall with the caller's transaction.
func TestProcessInCallerTransaction(t *testing.T) {
	pool := newDB(t, "public")
	ctx := ctxT(t)
	in := newInbox(t, "")
	var calls atomic.Int32
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if processed, err := in.Process(ctx, tx, inbox.Message{EventID: eventID}, deposit(&calls)); err != nil || !processed {
		t.Fatalf("processed=%v, %v", processed, err)
	}
	if processed, err := in.Process(ctx, tx, inbox.Message{EventID: eventID}, deposit(&calls)); err != nil || processed {
		t.Fatalf("again in the same transaction: processed=%v, %v", processed, err)
	}
	if _, err := in.Process(ctx, tx, inbox.Message{EventID: "33333333-3333-3333-3333-333333333333"},
		func(context.Context, pgx.Tx) error { return errBoom }); !errors.Is(err, errBoom) {
		t.Fatalf("failing handler: %v", err)
	}
	// The failed savepoint did not abort the caller's transaction.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if balance(t, pool) != 0 || inboxRows(t, pool, "public.inbox") != 0 {
		t.Errorf("after the caller rolled back: balance %d, %d inbox rows", balance(t, pool), inboxRows(t, pool, "public.inbox"))
	}
}

func TestEventIDFromHeaders(t *testing.T) {
	cases := map[string]struct {
		headers map[string][]string // key -> values, in order
		order   []string
		want    string
	}{
		"lower case":  {order: []string{"event_type", "event_id"}, headers: map[string][]string{"event_type": {"X"}, "event_id": {eventID}}, want: eventID},
		"upper case":  {order: []string{"event_id"}, headers: map[string][]string{"event_id": {"0191F0A4-7E5C-7CC1-9A3E-6B9D2F1C0A11"}}, want: eventID},
		"first wins":  {order: []string{"event_id"}, headers: map[string][]string{"event_id": {eventID, "11111111-1111-1111-1111-111111111111"}}, want: eventID},
		"missing":     {order: []string{"Event_ID"}, headers: map[string][]string{"Event_ID": {eventID}}},
		"not a UUID":  {order: []string{"event_id"}, headers: map[string][]string{"event_id": {"42"}}},
		"empty value": {order: []string{"event_id"}, headers: map[string][]string{"event_id": {""}}},
		"no headers":  {},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var kg []kafka.Header
			var fr []kgo.RecordHeader
			for _, k := range c.order {
				for _, v := range c.headers[k] {
					kg = append(kg, kafka.Header{Key: k, Value: []byte(v)})
					fr = append(fr, kgo.RecordHeader{Key: k, Value: []byte(v)})
				}
			}
			for client, get := range map[string]func() (string, error){
				"kafka-go": func() (string, error) { return inbox.EventIDFromHeaders(kg) },
				"franz-go": func() (string, error) { return inbox.EventIDFromHeaders(fr) },
			} {
				got, err := get()
				if c.want == "" {
					if !errors.Is(err, inbox.ErrMissingEventID) {
						t.Errorf("%s: %q, %v; want ErrMissingEventID", client, got, err)
					}
				} else if got != c.want || err != nil {
					t.Errorf("%s: %q, %v; want %s", client, got, err, c.want)
				}
			}
		})
	}
}

// Prune deletes the rows processed before the retention, in statements of at most batch rows
// (PostgreSQL's statistics count them), keeps the newer ones, and an event pruned and delivered
// again is processed again: what the retention must rule out (package documentation).
func TestPrune(t *testing.T) {
	pool := newDB(t, "public")
	ctx := ctxT(t)
	in := newInbox(t, "public.inbox")
	// 2,500 rows processed 10 days ago, 300 an hour ago.
	if _, err := pool.Exec(ctx, `INSERT INTO public.inbox (event_id, topic, processed_at)
SELECT gen_random_uuid(), 't', now() - CASE WHEN g <= 2500 THEN interval '10 days' ELSE interval '1 hour' END
FROM generate_series(1, 2800) AS g`); err != nil {
		t.Fatal(err)
	}
	var oldID string
	if err := pool.QueryRow(ctx, `SELECT event_id::text FROM public.inbox WHERE processed_at < now() - interval '9 days' LIMIT 1`).Scan(&oldID); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Prune(ctx, pool, 0, 100); !errors.Is(err, inbox.ErrInvalidRetention) {
		t.Errorf("zero retention: %v", err)
	}
	counted := &countingExec{pool: pool}
	deleted, err := in.Prune(ctx, counted, 7*24*time.Hour, 1000)
	if err != nil || deleted != 2500 {
		t.Fatalf("pruned %d (%v), want the 2,500 older than 7 days", deleted, err)
	}
	if counted.rows[0] != 1000 || counted.rows[1] != 1000 || counted.rows[2] != 500 || len(counted.rows) != 3 {
		t.Errorf("rows deleted per statement %v, want 1000, 1000, 500", counted.rows)
	}
	var left, old int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE processed_at < now() - interval '7 days') FROM public.inbox`).Scan(&left, &old); err != nil {
		t.Fatal(err)
	}
	if left != 300 || old != 0 {
		t.Errorf("%d rows left, %d of them old; want the 300 newer ones", left, old)
	}
	if deleted, err := in.Prune(ctx, pool, 7*24*time.Hour, 1000); err != nil || deleted != 0 {
		t.Errorf("again: pruned %d (%v)", deleted, err)
	}
	// A delivery of a pruned event runs the handler again.
	var calls atomic.Int32
	processed, err := in.Process(ctx, pool, inbox.Message{EventID: oldID, Topic: "t"}, deposit(&calls))
	if err != nil || !processed || calls.Load() != 1 {
		t.Errorf("a pruned event delivered again: processed %v, %v, %d calls", processed, err, calls.Load())
	}
}

// countingExec records the rows each statement affected, as PostgreSQL reported them.
type countingExec struct {
	pool *pgxpool.Pool
	rows []int64
}

func (c *countingExec) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := c.pool.Exec(ctx, sql, args...)
	c.rows = append(c.rows, tag.RowsAffected())
	return tag, err
}
