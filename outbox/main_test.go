package outbox

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestMain starts the shared PostgreSQL with an "examples" database before anything runs: the
// runnable examples read DATABASE_URL, as an application would.
func TestMain(m *testing.M) {
	os.Exit(pgtest.RunWithExampleDB(m, outboxdb.MustParseTable("public.outbox")))
}

func applySchema(ctx context.Context, url, table string) error {
	return pgtest.OutboxSchema(ctx, url, outboxdb.MustParseTable(table), -1)
}

// newDB returns the URL of a fresh database holding the outbox schema for table, and a pool on it.
func newDB(t testing.TB, table string) (string, *pgxpool.Pool) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := applySchema(ctx, url, table); err != nil {
		t.Fatalf("apply migrations: %v", err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return url, pool
}

// connect opens a dedicated connection, closed when the test ends.
func connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func newWriter(t testing.TB, table string, opts ...Option) *Writer {
	t.Helper()
	w, err := New(table, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
