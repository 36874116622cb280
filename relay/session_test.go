package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestTuneSession: the relay's sessions commit without waiting for the WAL flush and ask the
// server to watch the client; another session on the same server keeps the server's settings.
func TestTuneSession(t *testing.T) {
	url := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	show := func(conn *pgx.Conn, name string) string {
		t.Helper()
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	relay, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close(ctx)
	app, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	server := show(app, "synchronous_commit")
	tuneSession(ctx, relay)
	if got := show(relay, "synchronous_commit"); got != "off" {
		t.Errorf("the relay's session: synchronous_commit %s, want off", got)
	}
	if got := show(relay, "tcp_keepalives_idle"); got != "10" {
		t.Errorf("the relay's session: tcp_keepalives_idle %s, want 10", got)
	}
	if got := show(app, "synchronous_commit"); got != server {
		t.Errorf("another session: synchronous_commit %s, want the server's %s", got, server)
	}
}

// TestSnapshotFloorChecksTheSession: under snapshot tracking the first statement of a round trip
// that opens a batch, the floor, also answers the check of the session's mark (snapRoundTrip):
// false on a session that carries no mark or another relay's, true on the relay's own; and it
// still sets the floor, the id sequence's value, for the rest of the round trip's transaction.
func TestSnapshotFloorChecksTheSession(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', 'a', 'E', '{}')`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	q := newSnapQueries(testTable, false, 100)
	check := func() (same bool, floor, seq string) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var set string
		if err := tx.QueryRow(ctx, q.floor, "mine").Scan(&set, &same); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, `SELECT current_setting('outbox.floor'), pg_sequence_last_value('outbox_id_seq')::text`).Scan(&floor, &seq); err != nil {
			t.Fatal(err)
		}
		return same, floor, seq
	}
	mark := func(token string) {
		t.Helper()
		if _, err := conn.Exec(ctx, `SELECT set_config('outbox.relay_session', $1, false)`, token); err != nil {
			t.Fatal(err)
		}
	}
	if same, _, _ := check(); same {
		t.Error("a session without a mark passed the check")
	}
	mark("theirs")
	if same, _, _ := check(); same {
		t.Error("a session marked by another relay passed the check")
	}
	mark("mine")
	same, floor, seq := check()
	if !same {
		t.Error("the relay's own session failed the check")
	}
	if floor != seq || floor == "" {
		t.Errorf("the floor statement set outbox.floor to %q, want the id sequence's value %q", floor, seq)
	}
}
