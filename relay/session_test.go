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

// TestSnapshotOpenChecksTheSession: under snapshot tracking the open statement, first in a round
// trip that opens a batch, also answers the check of the session's mark (snapRoundTrip): false on
// a session that carries no mark or another relay's, true on the relay's own, for the unsharded
// and the sharded statement (the token is their last parameter); and the new snapshot's floor is
// the id sequence's value, read before the statement took the transaction's id, or else the
// floor statement's.
func TestSnapshotOpenChecksTheSession(t *testing.T) {
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
	buckets, err := OwnedBuckets(2, 0)
	if err != nil {
		t.Fatal(err)
	}
	check := func(sharded bool) (same bool, floor *int64, seq int64) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := tx.QueryRow(ctx, `SELECT pg_sequence_last_value('outbox_id_seq')`).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		args := []any{nil, nil, nil, nil, nil}
		if sharded {
			args = append(args, buckets)
		}
		var rng *snapRange
		if rng, err = scanRange(tx.QueryRow(ctx, newSnapQueries(testTable, sharded, 100).open, append(args, "mine")...),
			&cursorGroup{}, unmarked(""), 0, false, &same); err != nil {
			t.Fatal(err)
		}
		if rng.to.floor >= 0 {
			floor = &rng.to.floor
		}
		return same, floor, seq
	}
	mark := func(token string) {
		t.Helper()
		if _, err := conn.Exec(ctx, `SELECT set_config('outbox.relay_session', $1, false)`, token); err != nil {
			t.Fatal(err)
		}
	}
	for _, sharded := range []bool{false, true} {
		mark("")
		if same, _, _ := check(sharded); same {
			t.Errorf("sharded %v: a session without a mark passed the check", sharded)
		}
		mark("theirs")
		if same, _, _ := check(sharded); same {
			t.Errorf("sharded %v: a session marked by another relay passed the check", sharded)
		}
		mark("mine")
		same, floor, seq := check(sharded)
		if !same {
			t.Errorf("sharded %v: the relay's own session failed the check", sharded)
		}
		if floor == nil || *floor != seq {
			t.Errorf("sharded %v: the open statement answered the floor %v, want the id sequence's value %d", sharded, floor, seq)
		}
	}

	// A round trip where something takes the transaction's id before the open statement (a
	// claim to be woken): the floor is the one the floor statement read first, not the ceiling,
	// which a writer's id drawn in between passed; without the floor statement, not known.
	q := newSnapQueries(testTable, false, 100)
	for _, withFloor := range []bool{true, false} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var seq int64
		if err := tx.QueryRow(ctx, `SELECT pg_sequence_last_value('outbox_id_seq')`).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		if withFloor {
			if _, err := tx.Exec(ctx, q.floor); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'b', 'E', '{}')`); err != nil {
			t.Fatal(err)
		}
		var same bool
		rng, err := scanRange(tx.QueryRow(ctx, q.open, nil, nil, nil, nil, nil, "mine"), &cursorGroup{}, unmarked(""), 0, false, &same)
		if err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		switch {
		case withFloor && rng.to.floor != seq:
			t.Errorf("after the floor statement and an id taken: floor %d, want the value it read, %d (ceiling %d)", rng.to.floor, seq, rng.to.ceil)
		case !withFloor && rng.to.floor != -1:
			t.Errorf("an id taken before the open statement, no floor statement: floor %d, want none (not known)", rng.to.floor)
		}
	}
}
