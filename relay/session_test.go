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
