package outboxdb_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

func TestResolveTracking(t *testing.T) {
	for name, c := range map[string]struct {
		s    outboxdb.TrackingState
		want contract.Tracking
	}{
		"never published":          {outboxdb.TrackingState{}, contract.TrackSnapshot},
		"a row relay published":    {outboxdb.TrackingState{Sent: true}, contract.TrackRow},
		"a snapshot relay tracks":  {outboxdb.TrackingState{Cursor: true}, contract.TrackSnapshot},
		"row, then snapshot (set)": {outboxdb.TrackingState{Cursor: true, Sent: true}, contract.TrackSnapshot},
	} {
		if got, why := outboxdb.ResolveTracking(c.s); got != c.want || why == "" {
			t.Errorf("%s: ResolveTracking(%+v) = %s (%q), want %s", name, c.s, got, why, c.want)
		}
	}
}

// ReadTrackingState reads what the table says, checked on a real table at each state: fresh,
// with unsent events only, with an event marked sent as a row relay marks it, and with a cursor
// row as a snapshot relay writes it (the cursor decides: the sent rows are not read then).
func TestReadTrackingState(t *testing.T) {
	db, _ := openDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tb := outboxdb.Table{Schema: "public", Name: "outbox"}
	if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
		t.Fatal(err)
	}
	check := func(when string, want outboxdb.TrackingState) {
		t.Helper()
		got, err := outboxdb.ReadTrackingState(ctx, db, tb)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: %+v, want %+v", when, got, want)
		}
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	check("fresh", outboxdb.TrackingState{})
	exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'order', 'a' || g, 'E', '{}' FROM generate_series(1, 100) g`)
	check("unsent events", outboxdb.TrackingState{})
	exec(`UPDATE outbox SET sent_at = now() WHERE id = (SELECT max(id) FROM outbox)`)
	check("an event marked sent", outboxdb.TrackingState{Sent: true})
	exec(`INSERT INTO outbox_relay_cursor (buckets, snap, next_snap, last_id, system_identifier)
SELECT '{0}', NULL, NULL, 0, system_identifier FROM pg_control_system()`)
	check("a cursor row", outboxdb.TrackingState{Cursor: true})
}
