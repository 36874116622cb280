package relay

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func runMain(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Main(context.Background(), args, envOf(env), &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestCLI runs the subcommands of the relay command line against a real PostgreSQL.
func TestCLI(t *testing.T) {
	url := pgtest.NewDatabase(t)
	env := map[string]string{EnvDatabaseURL: url, "OUTBOX_TABLE": "shop.events", "OUTBOX_LOG_FORMAT": "text"}
	table := outboxdb.MustParseTable("shop.events")

	if code, out, _ := runMain(t, nil, "version"); code != 0 || strings.TrimSpace(out) != Version {
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
	// A new table gets the relays' default wake-ups: polling, no insert trigger.
	if code, out, errOut := runMain(t, env, "wakeups"); code != 0 || !strings.Contains(out, "shop.events: poll") {
		t.Errorf("wakeups of a new table: %d %q %q", code, out, errOut)
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

	code, _, errOut = runMain(t, map[string]string{EnvDatabaseURL: "postgres://relay:Sup3rS3cret@db.example/x"}, "run", "--batch-size", "0")
	if code != 2 || !strings.Contains(errOut, "--batch-size 0 out of range") || !strings.Contains(errOut, "--brokers (OUTBOX_KAFKA_BROKERS) is required") {
		t.Errorf("run with a bad configuration: %d %q", code, errOut)
	}
	if strings.Contains(errOut, "Sup3rS3cret") {
		t.Errorf("the configuration error leaks the password: %q", errOut)
	}
}

// TestLayoutCommand shows and sets the shard layout with relays running: the switch waits for
// them to stand down, and the new layout's relays take every bucket.
func TestLayoutCommand(t *testing.T) {
	url := pgtest.NewDatabase(t)
	newOutboxDB(t, url)
	env := map[string]string{EnvDatabaseURL: url, "OUTBOX_LOG_FORMAT": "text"}
	if code, out, errOut := runMain(t, env, "layout"); code != 0 || !strings.Contains(out, "public.outbox: no shard layout yet") {
		t.Fatalf("layout of a fresh table: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := runMain(t, env, "layout", "set", "--shards", "0"); code != 2 || !strings.Contains(errOut, "--shards 0 out of range") {
		t.Fatalf("layout set --shards 0: %d %q", code, errOut)
	}
	if code, out, errOut := runMain(t, env, "layout", "set", "--shards", "1"); code != 0 || !strings.Contains(out, "public.outbox: 1 shards (generation 1)") {
		t.Fatalf("first layout: %d %q %q", code, out, errOut)
	}
	k := kafkatest.NewKfake(t)
	var relays []*running
	for i := range 2 {
		cfg := testConfig(url, k.Brokers, "cli.layout")
		cfg.ShardCount, cfg.ShardIndex = 0, i
		relays = append(relays, startRelay(t, cfg, fmt.Sprintf("follower %d", i)))
	}
	waitFor(t, 30*time.Second, "shard 0 of 1 ready", relays[0].Ready)
	code, out, errOut := runMain(t, env, "layout", "set", "--shards", "2")
	if code != 0 || !strings.Contains(out, "public.outbox: 2 shards (generation 2)") || !strings.Contains(out, "last change: 1 -> 2 shards") ||
		!strings.Contains(out, "publishing paused") || !strings.Contains(out, "relays running: shards [0 1]; buckets held: 256 of 256") {
		t.Fatalf("layout set --shards 2 with relays running: %d %q %q", code, out, errOut)
	}
	t.Logf("%s", out)
	waitFor(t, 10*time.Second, "both relays ready", func() bool { return relays[0].Ready() && relays[1].Ready() })
}

// TestSecretsNotLogged runs the relay binary against a database it cannot reach, with a
// password in the URL and a SASL password: while it retries, its logs name the database host,
// never the passwords.
func TestSecretsNotLogged(t *testing.T) {
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	url := "postgres://relay:Sup3rS3cret-pg@127.0.0.1:" + itoa(port) + "/shop?sslmode=disable"
	p := startProcEnv(t, url, map[string]string{
		"OUTBOX_KAFKA_SASL_MECHANISM": "plain", EnvSASLUsername: "relay", EnvSASLPassword: "Sup3rS3cret-kafka",
	}, "--brokers", "127.0.0.1:1", "--default-topic", "t")
	waitFor(t, 20*time.Second, "a retry to be logged", func() bool {
		return strings.Contains(p.log(), "cannot connect to the database")
	})
	p.terminate(10 * time.Second)
	log := p.log()
	for _, secret := range []string{"Sup3rS3cret", url} {
		if strings.Contains(log, secret) {
			t.Errorf("the log holds %q:\n%s", secret, log)
		}
	}
	if !strings.Contains(log, "127.0.0.1:"+itoa(port)+"/shop") {
		t.Errorf("the log does not name the database host:\n%s", log)
	}
}
