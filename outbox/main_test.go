package outbox

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/migrations"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// server is the test binary's PostgreSQL. TestMain starts it (rather than pgtest.Run) because
// the package's runnable examples need a database before they run: they read DATABASE_URL, as
// an application would.
var server *pgtest.Server

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	srv, err := pgtest.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "outbox tests: cannot start PostgreSQL: %v\n", err)
		return 1
	}
	defer srv.Close()
	server = srv
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url, err := srv.CreateDatabase(ctx, "examples")
	if err == nil {
		err = applySchema(ctx, url, "public.outbox")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "outbox tests: %v\n", err)
		return 1
	}
	os.Setenv("DATABASE_URL", url)
	return m.Run()
}

func applySchema(ctx context.Context, url, table string) error {
	return pgtest.OutboxSchema(ctx, url, migrations.MustParseTable(table), -1)
}

// newDB returns the URL of a fresh database holding the outbox schema for table, and a pool on it.
func newDB(t testing.TB, table string) (string, *pgxpool.Pool) {
	t.Helper()
	url := server.NewDatabase(t)
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
