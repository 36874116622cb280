package outboxdb_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// TestSnapshotBacklog checks the backlog of snapshot tracking (<table>_snapshot_backlog, as the
// operator and the relays measure it, and <table>_pending) against what the database says
// directly: the events whose transaction a cursor row's snapshot does not show committed (or,
// within its batch in progress, that lie past its last id). Among them are the events of a
// transaction that drew its ids before the snapshot's floor was read and was still in progress
// at the snapshot. Past the count limit, with two cursor rows (two shards), the whole table's
// estimate must cover both: migration 00007 extrapolated it from the first row alone (2,778 of
// 4,689 here).
func TestSnapshotBacklog(t *testing.T) {
	db, _ := openDB(t)
	ctx := context.Background()
	tb := outboxdb.Table{Schema: "public", Name: "outbox"}
	if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
		t.Fatal(err)
	}
	// Measured in a session with the relay's and the operator's settings.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, outboxdb.PlanInIDOrder); err != nil {
		t.Fatal(err)
	}
	insertN := func(q interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}, prefix string, n int) {
		t.Helper()
		_, err := q.ExecContext(ctx, `INSERT INTO `+tb.Ident()+` (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'order', $1 || g, 'E', '{}' FROM generate_series(1, $2::int) AS g`, prefix, n)
		if err != nil {
			t.Fatal(err)
		}
	}
	insertN(db, "before-", 300) // committed before the snapshot: passed

	open, err := db.BeginTx(ctx, nil) // in progress at the snapshot, its ids below the floor
	if err != nil {
		t.Fatal(err)
	}
	insertN(open, "open-", 50)
	// As a relay takes a snapshot: the floor first, then a transaction id of its own, then the
	// snapshot, widened to list every transaction from its xmax up to that id as in progress
	// (PostgreSQL lists only those below the latest that ended: here, none).
	var floor int64
	var snap string
	if err := db.QueryRow(`SELECT pg_sequence_last_value($1::regclass)`, tb.Derived("id_seq")).Scan(&floor); err != nil {
		t.Fatal(err)
	}
	taker, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := taker.Exec(`SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	if err := taker.QueryRow(`SELECT pg_snapshot_xmin(s)::text || ':' || own::text || ':' || array_to_string(ARRAY(
		SELECT x::text::int8 FROM pg_snapshot_xip(s) AS x
		UNION SELECT generate_series(pg_snapshot_xmax(s)::text::int8, own::text::int8 - 1) ORDER BY 1), ',')
		FROM (SELECT pg_current_snapshot() AS s, pg_current_xact_id() AS own) AS w`).Scan(&snap); err != nil {
		t.Fatal(err)
	}
	if err := taker.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := open.Commit(); err != nil {
		t.Fatal(err)
	}
	insertN(db, "after-", 5000)
	var next string
	if err := db.QueryRow(`SELECT pg_current_snapshot()::text`).Scan(&next); err != nil {
		t.Fatal(err)
	}
	insertN(db, "later-", 700)

	// Before any snapshot relay started: every unsent row of the buckets is pending.
	for _, buckets := range []string{"NULL", "ARRAY(SELECT generate_series(0, 127))::smallint[]"} {
		var got, want int64
		if err := conn.QueryRowContext(ctx, `SELECT counted FROM `+tb.Derived("snapshot_backlog")+`(`+buckets+`, 100000)`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(`SELECT count(*) FROM ` + tb.Ident() + ` WHERE sent_at IS NULL AND (` + buckets + ` IS NULL OR ` +
			outboxdb.BucketExpr + ` = ANY(` + buckets + `))`).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("no cursor yet, buckets %s: %d pending, want %d", buckets, got, want)
		}
	}

	// Two cursor rows, as two shards leave them: one between batches, one halfway through the
	// batch from snap to next.
	var lastID int64
	if err := db.QueryRow(`SELECT min(id) + 2000 FROM ` + tb.Ident() + ` WHERE aggregate_id LIKE 'after-%'`).Scan(&lastID); err != nil {
		t.Fatal(err)
	}
	lowHalf, highHalf := "ARRAY(SELECT generate_series(0, 127))::smallint[]", "ARRAY(SELECT generate_series(128, 255))::smallint[]"
	cursor := tb.Derived("relay_cursor")
	if _, err := db.Exec(`INSERT INTO `+cursor+` (buckets, snap, next_snap, last_id, system_identifier, snap_floor)
		SELECT `+lowHalf+`, $1::pg_snapshot, NULL, 0, system_identifier, $3::int8 FROM pg_control_system()
		UNION ALL SELECT `+highHalf+`, $1::pg_snapshot, $2::pg_snapshot, $4::int8, system_identifier, $3::int8 FROM pg_control_system()`,
		snap, next, floor, lastID); err != nil {
		t.Fatal(err)
	}

	bucket := outboxdb.BucketExpr
	truth := func(buckets string) int64 {
		t.Helper()
		var n int64
		err := db.QueryRow(fmt.Sprintf(`SELECT count(*) FROM %s o JOIN %s c ON %s = ANY(c.buckets)
			WHERE %s = ANY(%s) AND NOT coalesce(pg_visible_in_snapshot(o.txid, c.snap), false)
			  AND NOT (c.next_snap IS NOT NULL AND pg_visible_in_snapshot(o.txid, c.next_snap) AND o.id <= c.last_id)`,
			tb.Ident(), cursor, bucket, bucket, buckets)).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	measure := func(buckets string, limit int) outboxdb.Backlog {
		t.Helper()
		b := outboxdb.Backlog{Limit: limit}
		var err error
		if buckets == "" {
			err = conn.QueryRowContext(ctx, outboxdb.SnapshotBacklogSQL(tb, false), limit).Scan(b.Dest()...)
		} else {
			err = conn.QueryRowContext(ctx, `SELECT * FROM `+tb.Derived("snapshot_backlog")+`(`+buckets+`, $1::int)`, limit).Scan(b.Dest()...)
		}
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	all := "ARRAY(SELECT generate_series(0, 255))::smallint[]"
	wantAll, wantLow, wantHigh := truth(all), truth(lowHalf), truth(highHalf)
	if wantLow+wantHigh != wantAll || wantLow == 0 || wantHigh == 0 {
		t.Fatalf("fixture: %d + %d pending, %d in all", wantLow, wantHigh, wantAll)
	}
	var openBelowFloor int64
	if err := db.QueryRow(`SELECT count(*) FROM `+tb.Ident()+` WHERE aggregate_id LIKE 'open-%' AND id <= $1`, floor).Scan(&openBelowFloor); err != nil {
		t.Fatal(err)
	}
	if openBelowFloor != 50 {
		t.Fatalf("fixture: %d of the open transaction's events below the floor, want 50", openBelowFloor)
	}

	for _, c := range []struct {
		name, buckets string
		want          int64
	}{{"whole table", "", wantAll}, {"low half", lowHalf, wantLow}, {"high half", highHalf, wantHigh}} {
		if b := measure(c.buckets, 100_000); b.Pending() != c.want || b.FirstID == nil {
			t.Errorf("%s, counted in full: pending %d (counted %d), want %d", c.name, b.Pending(), b.Counted, c.want)
		} else if b.OldestAgeSeconds <= 0 {
			t.Errorf("%s: oldest age %v", c.name, b.OldestAgeSeconds)
		}
		// A limit well below the backlog: each bucket counts its share and the rest is
		// extrapolated from its density.
		b := measure(c.buckets, 1000)
		if got := b.Pending(); float64(got) < 0.75*float64(c.want) || float64(got) > 1.25*float64(c.want) {
			t.Errorf("%s, limit 1000: pending %d (counted %d), want about %d", c.name, got, b.Counted, c.want)
		} else {
			t.Logf("%s, limit 1000: estimated %d of %d", c.name, got, c.want)
		}
	}
	var exact int64
	if err := conn.QueryRowContext(ctx, `SELECT `+tb.Derived("pending")+`()`).Scan(&exact); err != nil {
		t.Fatal(err)
	}
	if exact != wantAll {
		t.Errorf("%s() = %d, want %d", tb.Derived("pending"), exact, wantAll)
	}
	t.Logf("pending %d (%d + %d), %d of them below the floor in a transaction open at the snapshot", wantAll, wantLow, wantHigh, openBelowFloor)

	// A row before its first batch ended (no snapshot yet): it has passed the events of that
	// batch up to its last id.
	if _, err := db.Exec(`UPDATE `+cursor+` SET snap = NULL, snap_floor = NULL, next_snap = $1::pg_snapshot, last_id = $2::int8
		WHERE buckets[1] = 0`, next, lastID); err != nil {
		t.Fatal(err)
	}
	wantLow = truth(lowHalf)
	if b := measure(lowHalf, 100_000); b.Pending() != wantLow {
		t.Errorf("low half in its first batch: pending %d, want %d", b.Pending(), wantLow)
	}
	if err := conn.QueryRowContext(ctx, `SELECT `+tb.Derived("pending")+`()`).Scan(&exact); err != nil {
		t.Fatal(err)
	}
	if exact != wantLow+wantHigh {
		t.Errorf("low half in its first batch: %s() = %d, want %d", tb.Derived("pending"), exact, wantLow+wantHigh)
	}
}
