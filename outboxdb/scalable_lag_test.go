package outboxdb_test

import (
	"context"
	"database/sql"
	"math"
	"testing"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// TestScalableLag checks the lag more shards can fix (<table>_scalable_lag, what the autoscaler
// acts on) against events whose ages the test sets: in row tracking a failed event (attempts > 0)
// and the later events of its aggregate are left out, the others' oldest counts; in snapshot
// tracking the parked events are left out.
func TestScalableLag(t *testing.T) {
	db, _ := openDB(t)
	ctx := context.Background()
	tb := outboxdb.Table{Schema: "public", Name: "outbox"}
	if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
		t.Fatal(err)
	}
	add := func(agg string, ageSeconds, attempts int) {
		t.Helper()
		if _, err := db.ExecContext(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, attempts)
			VALUES ('order', $1, 'E', '{}', now() - make_interval(secs => $2), $3)`, agg, ageSeconds, attempts); err != nil {
			t.Fatal(err)
		}
	}
	lag := func() float64 {
		t.Helper()
		var v sql.NullFloat64
		if err := db.QueryRowContext(ctx, outboxdb.ScalableLagSQL(tb), 10_000).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if !v.Valid {
			return -1
		}
		return math.Round(v.Float64)
	}
	if got := lag(); got != -1 {
		t.Errorf("empty table: %v, want NULL", got)
	}
	add("poison", 100, 3) // failed: holds back its aggregate
	add("poison", 90, 0)
	if got := lag(); got != -1 {
		t.Errorf("only a failed aggregate: %v, want NULL", got)
	}
	add("ok", 50, 0)
	add("poison", 10, 0)
	if got := lag(); got != 50 {
		t.Errorf("row tracking: %v s, want 50 (the oldest event no failed event holds back)", got)
	}
	if _, err := db.ExecContext(ctx, `UPDATE outbox SET sent_at = now() WHERE aggregate_id = 'ok'`); err != nil {
		t.Fatal(err)
	}
	add("late", 20, 0)
	if got := lag(); got != 20 {
		t.Errorf("row tracking after a send: %v s, want 20", got)
	}

	// Snapshot tracking: a cursor row before its first batch (every unsent row pending), and an
	// older event parked.
	if _, err := db.ExecContext(ctx, `UPDATE outbox SET attempts = 0`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO outbox_relay_cursor (buckets, system_identifier)
		SELECT array_agg(b::smallint), (SELECT system_identifier FROM pg_control_system()) FROM generate_series(0, 255) b`); err != nil {
		t.Fatal(err)
	}
	if got := lag(); got != 100 {
		t.Errorf("snapshot tracking: %v s, want 100 (attempts do not hold events back there)", got)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO outbox_parked (id, created_at, event_id, aggregate_type, aggregate_id, event_type, payload, headers, bucket, attempts)
		VALUES (0, now() - interval '1000 seconds', gen_random_uuid(), 'order', 'parked', 'E', '{}', '{}', 7, 5)`); err != nil {
		t.Fatal(err)
	}
	if got := lag(); got != 100 {
		t.Errorf("snapshot tracking with a parked event: %v s, want 100 (parked events left out)", got)
	}
}
