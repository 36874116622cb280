package main

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/relay"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/logtest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	kafkatest.StopShared()
	os.Exit(code)
}

// runMain runs the command line in this process, as the binary's main does, with env as its
// environment.
func runMain(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = command(context.Background(), args, envOf(env), &out, &errOut)
	return code, out.String(), errOut.String()
}

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testLogger logs warnings and errors to t, each line after prefix, until the test ends.
func testLogger(t testing.TB, prefix string) *slog.Logger {
	w := logtest.Writer(t, prefix)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// syncBuffer is a bytes.Buffer that a running command writes and a test reads at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCLI runs the subcommands of the relay command line against a real PostgreSQL.
func TestCLI(t *testing.T) {
	url := pgtest.NewDatabase(t)
	env := map[string]string{relay.EnvDatabaseURL: url, "OUTBOX_TABLE": "shop.events", "OUTBOX_LOG_FORMAT": "text"}
	table := outboxdb.MustParseTable("shop.events")

	if code, out, _ := runMain(t, nil, "version"); code != 0 || strings.TrimSpace(out) != relayVersion() {
		t.Errorf("version: %d %q", code, out)
	}
	if code, _, errOut := runMain(t, nil, "frobnicate"); code != 2 || !strings.Contains(errOut, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: %d %q", code, errOut)
	}
	if code, _, errOut := runMain(t, nil, "migrate"); code != 2 || !strings.Contains(errOut, "OUTBOX_DATABASE_URL is required") {
		t.Errorf("migrate without a URL: %d %q", code, errOut)
	}

	code, out, errOut := runMain(t, env, "migrate")
	if code != 0 || !strings.Contains(out, "shop.events: schema version") {
		t.Fatalf("migrate: %d %q %q", code, out, errOut)
	}
	if strings.Contains(errOut, url) {
		t.Errorf("migrate logged the database URL: %q", errOut)
	}
	// A new table gets the relays' default wake-ups: polling, no insert trigger; and no CHECKs
	// (outboxdb.NewTableChecks), as pg_constraint shows.
	if code, out, errOut := runMain(t, env, "wakeups"); code != 0 || !strings.Contains(out, "shop.events: poll") {
		t.Errorf("wakeups of a new table: %d %q %q", code, out, errOut)
	}
	countChecks := func() int {
		t.Helper()
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pg_constraint WHERE conrelid = 'shop.events'::regclass AND contype = 'c'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := countChecks(); n != 0 {
		t.Errorf("a new table has %d CHECKs, want none", n)
	}
	if code, _, errOut := runMain(t, env, "migrate", "--table", "shop.strict", "--checks", "maybe"); code != 2 || !strings.Contains(errOut, `want "table" or "relay"`) {
		t.Errorf("migrate --checks maybe: %d %q, want it refused", code, errOut)
	}
	if code, out, errOut := runMain(t, env, "migrate", "--table", "shop.strict", "--checks", "table"); code != 0 {
		t.Errorf("migrate --checks table: %d %q %q", code, out, errOut)
	} else if code, out, errOut := runMain(t, env, "checks", "--table", "shop.strict"); code != 0 || !strings.Contains(out, "shop.strict: table") {
		t.Errorf("checks of a new table made with --checks table: %d %q %q", code, out, errOut)
	}
	if code, out, errOut = runMain(t, env, "wakeups", "set", "notify"); code != 0 {
		t.Fatalf("wakeups set notify: %d %q %q", code, out, errOut)
	}
	if code, out, errOut = runMain(t, env, "migrate"); code != 0 {
		t.Fatalf("migrate again: %d %q %q", code, out, errOut)
	}
	// An existing table keeps what was chosen for it.
	if code, out, errOut := runMain(t, env, "wakeups"); code != 0 || !strings.Contains(out, "shop.events: notify") {
		t.Errorf("wakeups after migrating again: %d %q %q", code, out, errOut)
	}
	if n := countChecks(); n != 0 {
		t.Errorf("after migrating again: %d CHECKs, want none", n)
	}

	code, out, errOut = runMain(t, env, "partitions", "ensure", "--days", "2")
	if code != 0 || strings.Count(out, "created ") != 3 {
		t.Fatalf("partitions ensure --days 2: %d %q %q", code, out, errOut)
	}
	if code, out, _ = runMain(t, env, "partitions", "ensure", "--days", "2"); code != 0 || out != "" {
		t.Errorf("partitions ensure again: %d %q", code, out)
	}

	// Two old days: one all sent (dropped), one with a pending row (kept).
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	// The pending index per tracking mode: snapshot drops it only once the cursor has passed its
	// first batch; row builds it back.
	if code, out, errOut := runMain(t, env, "indexes"); code != 0 || !strings.Contains(out, "shop.events: pending index (row") ||
		!strings.Contains(out, "shop.events: bucket index (the shards") {
		t.Errorf("indexes of a new table: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := runMain(t, env, "indexes", "set", "row", "--shards", "1"); code != 1 || !strings.Contains(errOut, "bucket index stays") {
		t.Errorf("indexes set row --shards 1 without a layout: %d %q, want it refused", code, errOut)
	}
	if code, _, errOut := runMain(t, env, "indexes", "set", "snapshot"); code != 1 || !strings.Contains(errOut, "first batch") {
		t.Errorf("indexes set snapshot before a snapshot relay ran: %d %q, want it refused", code, errOut)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO shop.events_relay_cursor (buckets, snap, system_identifier)
VALUES (ARRAY(SELECT generate_series(0, 255))::smallint[], pg_current_snapshot(), 1)`); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runMain(t, env, "indexes", "set", "snapshot"); code != 0 || !strings.Contains(out, "shop.events: no pending index") {
		t.Errorf("indexes set snapshot: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := runMain(t, env, "indexes", "set", "row"); code != 0 || !strings.Contains(out, "shop.events: pending index (row") {
		t.Errorf("indexes set row: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := runMain(t, env, "inserts", "set", "locked"); code != 0 || !strings.Contains(out, "shop.events: locked") {
		t.Errorf("inserts set locked: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := runMain(t, env, "inserts", "set", "plain"); code != 0 || !strings.Contains(out, "shop.events: plain") {
		t.Errorf("inserts set plain: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := runMain(t, env, "checks"); code != 0 || !strings.Contains(out, "shop.events: relay") {
		t.Errorf("checks of a new table: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := runMain(t, env, "checks", "set", "table"); code != 0 || !strings.Contains(out, "shop.events: table") {
		t.Errorf("checks set table: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := runMain(t, env, "checks", "set", "relay"); code != 0 || !strings.Contains(out, "shop.events: relay") {
		t.Errorf("checks set relay: %d %q %q", code, out, errOut)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO shop.events (aggregate_type, aggregate_id, event_type, payload) VALUES ('o', '', 'e', '{}')`); err != nil {
		t.Errorf("an empty aggregate id without the CHECKs: %v, want it accepted", err)
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM shop.events WHERE aggregate_id = ''`); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runMain(t, env, "checks", "set", "table"); code != 0 || !strings.Contains(out, "shop.events: table") {
		t.Errorf("checks set table: %d %q %q", code, out, errOut)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO shop.events (aggregate_type, aggregate_id, event_type, payload) VALUES ('o', '', 'e', '{}')`); err == nil {
		t.Error("an empty aggregate id with the CHECKs back was accepted")
	}
	if code, _, errOut := runMain(t, env, "indexes", "set", "both"); code != 2 || !strings.Contains(errOut, `want "snapshot" or "row"`) {
		t.Errorf("indexes set both: %d %q", code, errOut)
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM shop.events_relay_cursor`); err != nil {
		t.Fatal(err)
	}

	old := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -20)
	if _, err := outboxdb.EnsurePartitions(ctx, db, table, old, old.AddDate(0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO shop.events (aggregate_type, aggregate_id, event_type, payload, created_at, sent_at)
VALUES ('o', 'a', 'e', '{}', $1, now()), ('o', 'b', 'e', '{}', $2, NULL)`, old.Add(time.Hour), old.Add(25*time.Hour)); err != nil {
		t.Fatal(err)
	}
	// A transaction that appended an event and stays open: the drop would need the table's lock
	// and queue every insert behind it, so it is deferred, and the exit status says so.
	open, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open.ExecContext(ctx, `INSERT INTO shop.events (aggregate_type, aggregate_id, event_type, payload) VALUES ('o', 'c', 'e', '{}')`); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runMain(t, env, "partitions", "prune", "--retention", "168h"); code != exitDeferred || out != "" || !strings.Contains(errOut, "run prune again later") {
		t.Errorf("partitions prune behind an open transaction: %d %q %q, want exit status %d", code, out, errOut, exitDeferred)
	}
	if err := open.Rollback(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runMain(t, env, "partitions", "prune", "--retention", "168h")
	if code != 0 || strings.TrimSpace(out) != "dropped events_p"+old.Format("20060102") {
		t.Fatalf("partitions prune: %d %q %q", code, out, errOut)
	}
	parts, err := outboxdb.ListPartitions(ctx, db, table)
	if err != nil {
		t.Fatal(err)
	}
	kept := false
	for _, p := range parts {
		if p.Name == "events_p"+old.AddDate(0, 0, 1).Format("20060102") {
			kept = true
		}
	}
	if !kept {
		t.Errorf("the partition with a pending row was dropped: %v", parts)
	}
	if code, _, errOut = runMain(t, env, "partitions", "prune", "--retention", "0s"); code != 2 || !strings.Contains(errOut, "--retention must be positive") {
		t.Errorf("prune --retention 0s: %d %q", code, errOut)
	}
	if code, _, errOut = runMain(t, env, "partitions", "rotate"); code != 2 {
		t.Errorf("partitions rotate: %d %q", code, errOut)
	}

	code, _, errOut = runMain(t, map[string]string{relay.EnvDatabaseURL: "postgres://relay:Sup3rS3cret@db.example/x"}, "run", "--batch-size", "0")
	if code != 2 || !strings.Contains(errOut, "--batch-size 0 out of range") || !strings.Contains(errOut, "--brokers (OUTBOX_KAFKA_BROKERS) is required") {
		t.Errorf("run with a bad configuration: %d %q", code, errOut)
	}
	if strings.Contains(errOut, "Sup3rS3cret") {
		t.Errorf("the configuration error leaks the password: %q", errOut)
	}
}
