// Package writers runs the SQL append (<table>_append, migration 00018) from the languages whose
// services write outboxes besides Go: Python (psycopg), Node.js (pg), PHP (PDO) and Java (JDBC),
// the scripts of this directory, which the README quotes. Their clients come from
// hack/writers.sh fetch (make setup); the interpreters from Debian's packages.
package writers

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/relay"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// clients is where hack/writers.sh put the clients.
func clients(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("../../hack/writers.sh", "dir").Output()
	if err != nil {
		t.Fatalf("hack/writers.sh dir: %v", err)
	}
	dir := string(out[:len(out)-1])
	for _, f := range []string{"python/.complete", "node/.complete", "postgresql.jar"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("%s: the clients of the SQL append's tests are missing: run make setup (hack/writers.sh fetch)", filepath.Join(dir, f))
		}
	}
	return dir
}

// writer is one language's writer: the command that runs its script.
type writer struct {
	name string
	cmd  func(dir string, args ...string) *exec.Cmd
}

var writers = []writer{
	{"python", func(dir string, args ...string) *exec.Cmd {
		c := exec.Command("python3", append([]string{"append.py"}, args...)...)
		c.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(dir, "python"))
		return c
	}},
	{"node", func(dir string, args ...string) *exec.Cmd {
		c := exec.Command("node", append([]string{"append.js"}, args...)...)
		c.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node", "node_modules"))
		return c
	}},
	{"php", func(_ string, args ...string) *exec.Cmd {
		c := exec.Command("php", append([]string{"append.php"}, args...)...)
		c.Env = os.Environ()
		return c
	}},
	{"java", func(dir string, args ...string) *exec.Cmd {
		c := exec.Command("java", append([]string{"-cp", filepath.Join(dir, "postgresql.jar"), "Append.java"}, args...)...)
		c.Env = os.Environ()
		return c
	}},
}

// TestSQLAppendFromEveryLanguage: the four writers append concurrently to the same few
// aggregates, each transaction appending first and then recording its place in its aggregate's
// commit order (a counter whose row lock orders the commits). A snapshot relay publishes; an
// independent consumer checks that every event arrived and that each aggregate's events arrived
// in commit order, the order the SQL append's lock gives ids in.
func TestSQLAppendFromEveryLanguage(t *testing.T) {
	dir := clients(t)
	const aggregates, transactions = 5, 150
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url := pgtest.NewDatabase(t)
	table := outboxdb.MustParseTable("public.outbox")
	if err := pgtest.OutboxSchema(ctx, url, table, 1); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE counters (aggregate_id text PRIMARY KEY, n int NOT NULL);
CREATE TABLE commit_seq (event_id uuid PRIMARY KEY, aggregate_id text NOT NULL, n int NOT NULL);
INSERT INTO counters SELECT 'agg-' || g, 0 FROM generate_series(0, %d) AS g`, aggregates-1)); err != nil {
		t.Fatal(err)
	}
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("writers")
	k.CreateTopic(t, topic, 3)

	cfg := relay.DefaultConfig()
	cfg.DatabaseURL, cfg.Kafka.Brokers, cfg.DefaultTopic, cfg.HTTPAddr = url, k.Brokers, topic, ""
	cfg.Tracking = relay.TrackSnapshot
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()

	// The writers, all at once, while the relay publishes. They start at different speeds (a JVM
	// takes a second; PHP was done in a third of one): a gate holds every writer's first append
	// (the outbox locked) until all four wait at it, as pg_stat_activity shows, so that they
	// overlap whatever the machine is doing.
	gate, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Rollback(ctx) // committed below; a rollback after that is a no-op
	if _, err := gate.Exec(ctx, `LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, w := range writers {
		wg.Go(func() {
			c := w.cmd(dir, w.name, fmt.Sprint(aggregates), fmt.Sprint(transactions))
			c.Env = append(c.Env, "OUTBOX_DATABASE_URL="+url)
			start := time.Now()
			if out, err := c.CombinedOutput(); err != nil {
				t.Errorf("%s writer: %v\n%s", w.name, err, out)
				return
			}
			t.Logf("%s writer: %d transactions, done %s after it started (the gate included)", w.name, transactions, time.Since(start).Round(time.Millisecond))
		})
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var waiting int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
  WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%outbox_append%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= len(writers) {
			break
		}
		if time.Now().After(deadline) || t.Failed() {
			t.Errorf("%d of %d writers reached the gate", waiting, len(writers))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := gate.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// The database's record: each event's place in its aggregate's commit order, and the writer.
	order := map[string]int{} // event id -> its place
	rows, err := pool.Query(ctx, `SELECT c.event_id::text, c.n, o.payload->>'writer' FROM commit_seq c JOIN outbox o ON o.event_id = c.event_id`)
	if err != nil {
		t.Fatal(err)
	}
	byWriter := map[string]int{}
	for rows.Next() {
		var id, w string
		var n int
		if err := rows.Scan(&id, &n, &w); err != nil {
			t.Fatal(err)
		}
		order[id] = n
		byWriter[w]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := len(writers) * transactions
	if len(order) != want {
		t.Fatalf("%d events recorded with their commit order, want %d (by writer: %v)", len(order), want, byWriter)
	}

	// The writers overlapped: within an aggregate, consecutive commits by different languages (or
	// the test shows nothing about concurrent writers).
	var switches int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE w <> prev) FROM (
  SELECT o.payload->>'writer' AS w, lag(o.payload->>'writer') OVER (PARTITION BY c.aggregate_id ORDER BY c.n) AS prev
  FROM commit_seq c JOIN outbox o ON o.event_id = c.event_id) s`).Scan(&switches); err != nil {
		t.Fatal(err)
	}
	if switches < want/10 {
		t.Fatalf("only %d of %d commits follow another language's commit of the same aggregate: the writers hardly overlapped", switches, want)
	}

	// The independent consumer: every event, each aggregate's in commit order.
	cons := k.NewConsumer(t, topic)
	seen := map[string]bool{}
	last := map[string]int{}
	deadline = time.Now().Add(2 * time.Minute)
	for len(seen) < want && time.Now().Before(deadline) {
		recs, err := cons.Poll(ctx, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			id := rec.Headers["event_id"]
			n, ok := order[id]
			if !ok {
				t.Fatalf("a record with event id %q that no writer recorded", id)
			}
			if seen[id] {
				continue // at least once: a duplicate is dropped by event id, as an inbox does
			}
			seen[id] = true
			var p struct{ Writer string }
			_ = json.Unmarshal(rec.Value, &p)
			agg := rec.Key
			if n < last[agg] {
				t.Errorf("aggregate %s: event %s (commit %d, %s writer) arrived after commit %d", agg, id, n, p.Writer, last[agg])
			}
			last[agg] = max(last[agg], n)
		}
	}
	if len(seen) != want {
		t.Fatalf("the consumer received %d of %d events", len(seen), want)
	}
	t.Logf("%d events from %d languages over %d aggregates (%d commits after another language's on the same aggregate) reached the consumer in commit order per aggregate (%v)",
		want, len(writers), aggregates, switches, byWriter)
}
