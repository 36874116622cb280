package outboxdb_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// previousRelease is the newest migration of the release before this one: the schema the
// e2e test's upgrade starts from (hack/e2e.sh), created unlogged wake-up objects.
const previousRelease = 14

// TestUpgradeFromPreviousRelease migrates a table at the previous release's schema (its wake-up
// sequence and table unlogged, where the server has unlogged sequences), with events pending,
// to this release, and checks what the relays and the operator read of it afterwards in both
// tracking modes: the pending count, the partitions' retention check with a snapshot cursor
// (which used min(xid8), missing before PostgreSQL 15), the wake-up claim and its opt-out.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, _ := openDB(t)
	tb := outboxdb.MustParseTable("outbox")
	if v, err := outboxdb.ApplyTo(ctx, db, tb, previousRelease); err != nil || v != previousRelease {
		t.Fatalf("the previous release's schema: version %d, %v", v, err)
	}
	var unloggedSequences bool
	if err := db.QueryRowContext(ctx, `SELECT current_setting('server_version_num')::int >= 150000`).Scan(&unloggedSequences); err != nil {
		t.Fatal(err)
	}
	if unloggedSequences {
		for _, q := range []string{`ALTER SEQUENCE outbox_wake_until SET UNLOGGED`, `ALTER TABLE outbox_relay_waiting SET UNLOGGED`} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	const n = 100
	if _, err := db.ExecContext(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'o-' || (i % 7), 'Created', jsonb_build_object('i', i) FROM generate_series(1, $1) AS i`, n); err != nil {
		t.Fatal(err)
	}

	v, err := outboxdb.Apply(ctx, db, tb)
	if err != nil || v != outboxdb.LatestVersion() {
		t.Fatalf("upgrade: version %d, %v; want %d", v, err, outboxdb.LatestVersion())
	}
	var unlogged int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_class
WHERE relname IN ('outbox_wake_until', 'outbox_relay_waiting') AND relpersistence <> 'p'`).Scan(&unlogged); err != nil {
		t.Fatal(err)
	}
	if unlogged != 0 {
		t.Errorf("%d wake-up relations still unlogged after the upgrade", unlogged)
	}
	// An existing table keeps its CHECKs (a new one made by relay migrate or the operator has
	// none: outboxdb.NewTableChecks).
	if on, err := outboxdb.Checks(ctx, db, tb); err != nil || !on {
		t.Errorf("the CHECKs after the upgrade: %v, %v; want all four kept", on, err)
	}
	pending := func(mode string) {
		t.Helper()
		var got int
		if err := db.QueryRowContext(ctx, `SELECT outbox_pending()`).Scan(&got); err != nil || got != n {
			t.Errorf("%s: outbox_pending() = %d, %v; want %d", mode, got, err, n)
		}
		parts, err := outboxdb.ListPartitions(ctx, db, tb)
		if err != nil {
			t.Fatalf("%s: partitions: %v", mode, err)
		}
		held := false
		for _, p := range parts {
			held = held || p.HasPending
		}
		if !held {
			t.Errorf("%s: no partition holds the %d pending events: %+v", mode, n, parts)
		}
	}
	pending("row tracking")
	// Snapshot tracking from the oldest retained event: nothing passed yet.
	if _, err := outboxdb.ResetCursor(ctx, db, tb, outboxdb.ResetToOldest, "upgrade test"); err != nil {
		t.Fatal(err)
	}
	pending("snapshot tracking")

	// The wake-up protocol on the upgraded objects, and the opt-out of migration 00016.
	w := outboxdb.WakeStatements(tb)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var watch string
	if err := conn.QueryRowContext(ctx, w.Wait, 5.0, nil).Scan(&watch); err != nil {
		t.Fatalf("claim after the upgrade: %v", err)
	}
	var wanted, optedOut bool
	if err := conn.QueryRowContext(ctx, `SELECT outbox_wake_wanted()`).Scan(&wanted); err != nil || !wanted {
		t.Errorf("wake_wanted under a claim: %v, %v", wanted, err)
	}
	if err := conn.QueryRowContext(ctx, `SELECT set_config('outbox.notify', 'off', false) = 'off' AND NOT outbox_wake_wanted()`).Scan(&optedOut); err != nil || !optedOut {
		t.Errorf("wake_wanted with outbox.notify = off: opted out %v, %v", optedOut, err)
	}
	if v, err := outboxdb.Apply(ctx, db, tb); err != nil || v != outboxdb.LatestVersion() {
		t.Errorf("applying again: %d, %v", v, err)
	}
}

// TestBytesPayloadsMigration: migration 00020 adds payload_bytes to a table with events without
// rewriting any partition (each keeps its relfilenode) and, behind a writer's open transaction,
// gives up after its 2 s lock_timeout (the version stays at 19; the operator's next pass retries)
// instead of queueing every later writer behind it; once the writer commits it applies.
func TestBytesPayloadsMigration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, _ := openDB(t)
	tb := outboxdb.MustParseTable("outbox")
	if _, err := outboxdb.ApplyTo(ctx, db, tb, 19); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'o-' || i, 'Created', '{}' FROM generate_series(1, 1000) AS i`); err != nil {
		t.Fatal(err)
	}
	files := func() map[string]int64 {
		t.Helper()
		rows, err := db.QueryContext(ctx, `SELECT c.relname, pg_relation_filenode(c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'outbox'::regclass`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]int64{}
		for rows.Next() {
			var name string
			var node int64
			if err := rows.Scan(&name, &node); err != nil {
				t.Fatal(err)
			}
			out[name] = node
		}
		return out
	}
	before := files()
	writer, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writer.ExecContext(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'w', 'Created', '{}')`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := outboxdb.Apply(ctx, db, tb); err == nil || !strings.Contains(err.Error(), "lock timeout") {
		t.Fatalf("behind an open writer: %v, want a lock timeout", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("gave up after %s", d)
	}
	var v int64
	if err := db.QueryRowContext(ctx, `SELECT max(version_id) FROM outbox_schema_version WHERE is_applied`).Scan(&v); err != nil || v != 19 {
		t.Fatalf("version after the timeout: %d, %v", v, err)
	}
	if err := writer.Commit(); err != nil {
		t.Fatal(err)
	}
	if v, err := outboxdb.Apply(ctx, db, tb); err != nil || v != outboxdb.LatestVersion() {
		t.Fatalf("after the writer committed: %d, %v", v, err)
	}
	after := files()
	if len(before) == 0 || len(after) != len(before) {
		t.Fatalf("partitions %v before, %v after", before, after)
	}
	for name, node := range before {
		if after[name] != node {
			t.Errorf("partition %s rewritten: file %d, then %d", name, node, after[name])
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM outbox WHERE payload_bytes IS NULL AND payload IS NOT NULL`).Scan(&n); err != nil || n != 1001 {
		t.Errorf("%d events kept their payload (%v), want 1001", n, err)
	}
}
