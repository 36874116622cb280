package outboxdb

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// TrackingState is what a table's rows say of the tracking mode its relays ran: whether its
// snapshot-tracking cursor has rows (a snapshot relay took it, and a row relay refuses it), and
// whether a row relay marked an event sent. Sent is read only where the cursor has no rows (the
// cursor decides then).
type TrackingState struct {
	Cursor, Sent bool
}

// ReadTrackingState reads t's TrackingState. The read of a sent row stops at the first one, and
// is not made where the cursor has rows (a table tracked by snapshot has none to find, and would
// be read to its end); a table never published from is read to its end once (bound it with ctx).
func ReadTrackingState(ctx context.Context, db *sql.DB, t Table) (TrackingState, error) {
	var s TrackingState
	// The sent read is an initplan, run only where the CASE reaches it.
	err := db.QueryRowContext(ctx, `SELECT c.cursor, CASE WHEN c.cursor THEN false
  ELSE EXISTS (SELECT 1 FROM `+t.Ident()+` WHERE sent_at IS NOT NULL) END
FROM (SELECT EXISTS (SELECT 1 FROM `+t.Derived("relay_cursor")+`) AS cursor) AS c`).Scan(&s.Cursor, &s.Sent)
	if err != nil {
		return s, fmt.Errorf("read the tracking state of %s: %w", t, err)
	}
	return s, nil
}

// ResolveTracking is the tracking mode for relays whose mode is not set, from their table's
// state, and why: Snapshot, the default, for a table no relay has published from or one a
// snapshot relay tracks; Row for a table whose events a row relay marked sent (its relays ran
// Row, the default before Snapshot: they keep it until their owner changes it).
func ResolveTracking(s TrackingState) (contract.Tracking, string) {
	switch {
	case s.Cursor:
		return contract.TrackSnapshot, "a snapshot relay tracks the table (its cursor has rows)"
	case s.Sent:
		return contract.TrackRow, "a row relay published from the table (events are marked sent)"
	}
	return contract.TrackSnapshot, "no relay has published from the table: the default"
}
