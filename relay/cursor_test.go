package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// TestCursorIdentity: a snapshot cursor that belongs to another database (a restore from a
// dump into another cluster: another system identifier) or to a point in this database's past
// (transaction ids behind the cursor's) stops the relay with the reason and the command that
// fixes it, publishing nothing; `relay cursor reset` (refused while a relay holds the buckets,
// recorded with its reason) lets it go on.
func TestCursorIdentity(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.cursor", 3)
	c := newCollector(t, k, topic)
	ctx := context.Background()
	env := map[string]string{EnvDatabaseURL: url, "OUTBOX_LOG_FORMAT": "text"}
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	if code, out, _ := runMain(t, env, "cursor"); code != 0 || !strings.Contains(out, "tracked by row") {
		t.Fatalf("cursor of a fresh table: %d %q", code, out)
	}

	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
	r := startRelay(t, cfg, "snapshot")
	if err := seqtest.Append(ctx, pool, w, "order", []seqEvent{{Agg: "a", Seq: 1}}); err != nil {
		t.Fatal(err)
	}
	c.waitDistinct(t, 1, 30*time.Second)
	code, out, errOut := runMain(t, env, "cursor", "reset", "--to", "now", "--reason", "test")
	if code != 1 || !strings.Contains(errOut, "relays hold buckets of the table") {
		t.Fatalf("reset while a relay runs: %d %q %q", code, out, errOut)
	}
	r.stop(t)

	for _, tc := range []struct{ name, corrupt string }{
		{"another database", `UPDATE outbox_relay_cursor SET system_identifier = system_identifier + 1`},
		{"the database's past", `UPDATE outbox_relay_cursor SET snap = '4000000000:4000000000:'`},
	} {
		if _, err := pool.Exec(ctx, tc.corrupt); err != nil {
			t.Fatal(err)
		}
		if err := seqtest.Append(ctx, pool, w, "order", []seqEvent{{Agg: "a", Seq: 2}}); err != nil {
			t.Fatal(err)
		}
		r := startRelay(t, cfg, "snapshot "+tc.name)
		waitFor(t, 10*time.Second, "the relay to refuse the cursor", func() bool {
			return strings.Contains(r.notReadyReason(), "relay cursor reset")
		})
		c.poll(t, 500*time.Millisecond)
		if r.Ready() || len(c.byEvent) != 1 {
			t.Fatalf("%s: the relay publishes (ready %v, %d events on the topic)", tc.name, r.Ready(), len(c.byEvent))
		}
		t.Logf("%s: %s", tc.name, r.notReadyReason())
		r.stop(t)
		code, out, errOut := runMain(t, env, "cursor", "reset", "--to", "oldest", "--reason", "restored from a dump")
		if code != 0 || !strings.Contains(out, "cursor reset to oldest") || !strings.Contains(out, "before the first batch") {
			t.Fatalf("reset: %d %q %q", code, out, errOut)
		}
		if _, err := pool.Exec(ctx, `DELETE FROM outbox WHERE (payload->>'seq')::int = 2`); err != nil {
			t.Fatal(err)
		}
	}
	var resets int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_relay_cursor_resets WHERE reason = 'restored from a dump' AND reset_by = current_user`).Scan(&resets); err != nil {
		t.Fatal(err)
	}
	if resets != 2 {
		t.Errorf("%d resets recorded, want 2", resets)
	}
	// After the reset to oldest the relay publishes again (the retained event again too).
	startRelay(t, cfg, "snapshot after the reset")
	if err := seqtest.Append(ctx, pool, w, "order", []seqEvent{{Agg: "b", Seq: 1}}); err != nil {
		t.Fatal(err)
	}
	c.waitDistinct(t, 2, 30*time.Second)
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
}

// TestCursorWithoutBounds (snapshot tracking): cursor rows written before migration 8 carry no
// id bounds (snap_floor, next_floor, next_ceil NULL). A relay resumes from them exactly: in the
// middle of a first batch (the rows after last_id, committed in next_snap, are published; those
// up to it are not published again) and between batches (the bounds come from the
// transaction-id index once). Checked by the consumer against the database's ids.
func TestCursorWithoutBounds(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.bounds", 3)
	c := newCollector(t, k, topic)
	ctx := context.Background()
	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
	insertBacklog(t, url, 100, 10, "order")
	var snap string
	var last int64
	if err := pool.QueryRow(ctx, `SELECT pg_current_snapshot()::text, (SELECT id FROM outbox ORDER BY id OFFSET 49 LIMIT 1)`).Scan(&snap, &last); err != nil {
		t.Fatal(err)
	}
	// A first batch in progress, as a relay before migration 8 left it: published up to last.
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_relay_cursor (buckets, snap, next_snap, last_id, system_identifier)
SELECT ARRAY(SELECT generate_series(0, 255))::smallint[], NULL, $1::pg_snapshot, $2, system_identifier FROM pg_control_system()`, snap, last); err != nil {
		t.Fatal(err)
	}
	insertBacklog(t, url, 50, 10, "order")
	published := func(n int) map[int64]int {
		t.Helper()
		c.waitDistinct(t, n, time.Minute)
		c.poll(t, 500*time.Millisecond) // duplicates, if any, arrive meanwhile
		ids := map[int64]int{}
		for ev, count := range c.byEvent {
			var id int64
			if err := pool.QueryRow(ctx, `SELECT id FROM outbox WHERE event_id = $1::uuid`, ev).Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids[id] = count
		}
		return ids
	}
	r := startRelay(t, cfg, "snapshot, mid first batch")
	ids := published(100)
	for id, n := range ids {
		if id <= last || n != 1 {
			t.Fatalf("event %d published %d times; the cursor had passed every id up to %d", id, n, last)
		}
	}
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	r.stop(t)

	// Between batches, with no floor: the next batch's bounds come from the txid index.
	if _, err := pool.Exec(ctx, `UPDATE outbox_relay_cursor SET snap_floor = NULL, next_floor = NULL, next_ceil = NULL`); err != nil {
		t.Fatal(err)
	}
	insertBacklog(t, url, 30, 10, "order")
	startRelay(t, cfg, "snapshot, no floor")
	ids = published(130)
	for id, n := range ids {
		if id <= last || n != 1 {
			t.Fatalf("event %d published %d times after a restart without bounds", id, n)
		}
	}
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	t.Logf("resumed without bounds: events after id %d published once each, %d in all", last, len(ids))
}
