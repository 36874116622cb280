package main

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/relay"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestSecretsNotLogged runs `relay run` against a database it cannot reach, with a password in
// the URL and a SASL password: while it retries, its logs name the database host, never the
// passwords. Twice: with --tracking given (the relay's own retries to connect) and without (the
// retries to read the table that resolves it).
func TestSecretsNotLogged(t *testing.T) {
	for _, c := range []struct {
		args  []string
		retry string // what the retry's log line says
	}{
		{[]string{"--tracking", "row"}, "cannot connect to the database"},
		{nil, "to resolve --tracking"},
	} {
		port, err := pgtest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		url := "postgres://relay:Sup3rS3cret-pg@127.0.0.1:" + strconv.Itoa(port) + "/shop?sslmode=disable"
		env := map[string]string{
			relay.EnvDatabaseURL: url, "OUTBOX_KAFKA_SASL_MECHANISM": "plain",
			relay.EnvSASLUsername: "relay", relay.EnvSASLPassword: "Sup3rS3cret-kafka",
		}
		var logs syncBuffer
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		go func() {
			done <- command(ctx, append([]string{"run", "--http-addr", "", "--log-format", "text",
				"--brokers", "127.0.0.1:1", "--default-topic", "t"}, c.args...), envOf(env), &logs, &logs)
		}()
		waitFor(t, 20*time.Second, "a retry to be logged ("+c.retry+")", func() bool {
			return strings.Contains(logs.String(), c.retry)
		})
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("%q: relay run stopped with exit code %d, want 0", c.retry, code)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q: relay run did not stop within 10s of its context ending", c.retry)
		}
		log := logs.String()
		for _, secret := range []string{"Sup3rS3cret", url} {
			if strings.Contains(log, secret) {
				t.Errorf("%q: the log holds %q:\n%s", c.retry, secret, log)
			}
		}
		if !strings.Contains(log, "127.0.0.1:"+strconv.Itoa(port)+"/shop") {
			t.Errorf("%q: the log does not name the database host:\n%s", c.retry, log)
		}
	}
}

// TestRunResolvesTracking: relay run without --tracking resolves the mode from the table, as the
// operator resolves an unset spec.publish.tracking: a new table gets snapshot tracking, a table
// whose events a row relay marked sent gets row tracking. The database is the observer: a
// snapshot relay's tenure writes the table's cursor row; a row relay holds the shard's bucket
// locks (pg_locks) and writes none.
func TestRunResolvesTracking(t *testing.T) {
	k := kafkatest.SharedApache(t)
	for _, c := range []struct {
		name    string
		sent    bool
		want    string
		cursors bool
	}{
		{"a new table", false, "snapshot", true},
		{"a table a row relay published from", true, "row", false},
	} {
		url := pgtest.NewDatabase(t)
		env := map[string]string{relay.EnvDatabaseURL: url}
		if code, out, errOut := runMain(t, env, "migrate"); code != 0 {
			t.Fatalf("%s: migrate: %d %q %q", c.name, code, out, errOut)
		}
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
VALUES ('order', 'o-1', 'E', '{}', CASE WHEN $1 THEN now() END)`, c.sent); err != nil {
			t.Fatal(err)
		}
		var logs syncBuffer
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		go func() {
			done <- command(ctx, []string{"run", "--http-addr", "", "--log-format", "text",
				"--brokers", strings.Join(k.Brokers, ","), "--default-topic", "resolve.tracking"}, envOf(env), &logs, &logs)
		}()
		query := func(sql string) int {
			t.Helper()
			var n int
			if err := db.QueryRow(sql).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		waitFor(t, 30*time.Second, c.name+": the relay holding the shard's bucket locks", func() bool {
			return query(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) >= 256
		})
		if c.cursors {
			waitFor(t, 30*time.Second, c.name+": the cursor row", func() bool { return query(`SELECT count(*) FROM outbox_relay_cursor`) > 0 })
		}
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("%s: relay run exited %d", c.name, code)
		}
		if n := query(`SELECT count(*) FROM outbox_relay_cursor`); (n > 0) != c.cursors {
			t.Errorf("%s: %d cursor rows, want cursor rows %v", c.name, n, c.cursors)
		}
		if !strings.Contains(logs.String(), "tracking="+c.want) {
			t.Errorf("%s: the log does not say tracking=%s:\n%s", c.name, c.want, logs.String())
		}
	}
}
