package outboxdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// CursorRow is one row of a table's snapshot-tracking cursor (migration 00007).
type CursorRow struct {
	Buckets []int16
	// Snap is the snapshot whose events are all published ("" before the first batch); Next and
	// LastID the batch in progress ("" between batches).
	Snap, Next string
	LastID     int64
	// SameSystem: the cursor belongs to this database cluster.
	SameSystem bool
	UpdatedAt  time.Time
}

// ReadCursor returns the cursor rows of t, none when the table is tracked by row.
func ReadCursor(ctx context.Context, db *sql.DB, t Table) ([]CursorRow, error) {
	rows, err := db.QueryContext(ctx, `SELECT c.buckets::text, coalesce(c.snap::text, ''), coalesce(c.next_snap::text, ''), c.last_id,
  c.system_identifier = s.system_identifier, c.updated_at
FROM `+t.Derived("relay_cursor")+` AS c, pg_control_system() AS s ORDER BY c.id`)
	if err != nil {
		return nil, fmt.Errorf("read the cursor of %s: %w", t, err)
	}
	defer rows.Close()
	var out []CursorRow
	for rows.Next() {
		var (
			c       CursorRow
			buckets string
		)
		if err := rows.Scan(&buckets, &c.Snap, &c.Next, &c.LastID, &c.SameSystem, &c.UpdatedAt); err != nil {
			return nil, err
		}
		for _, f := range strings.Split(strings.Trim(buckets, "{}"), ",") {
			var b int16
			if _, err := fmt.Sscan(f, &b); err == nil {
				c.Buckets = append(c.Buckets, b)
			}
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Where a cursor reset puts the cursor.
const (
	// ResetToNow skips every event committed before the reset: only later ones are published.
	ResetToNow = "now"
	// ResetToOldest publishes every retained event again (as the first batch of a new table).
	ResetToOldest = "oldest"
)

// ErrRelaysRunning is returned by ResetCursor while a relay holds buckets of the table.
var ErrRelaysRunning = errors.New("relays hold buckets of the table: stop them first (spec.paused: true, or scale the relays to zero)")

// ResetCursor replaces the snapshot cursor of t by one row for every bucket, at to (ResetToNow
// or ResetToOldest), for this database, and records the reset with reason. It refuses while a
// relay holds any bucket. It returns the number of events skipped (ResetToNow: those no cursor
// had passed; they stay in the table but will not be published).
func ResetCursor(ctx context.Context, db *sql.DB, t Table, to, reason string) (skipped int64, err error) {
	if to != ResetToNow && to != ResetToOldest {
		return 0, fmt.Errorf("reset the cursor to %q: want %q or %q", to, ResetToNow, ResetToOldest)
	}
	if strings.TrimSpace(reason) == "" {
		return 0, errors.New("a cursor reset needs a reason: it is recorded")
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `LOCK TABLE `+t.Derived("relay_cursor")+` IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return 0, err
	}
	var free bool
	if err := tx.QueryRowContext(ctx, `SELECT bool_and(pg_try_advisory_xact_lock($1::int4, b)) FROM generate_series(0, $2::int4 - 1) AS b`,
		t.LockKey(), Buckets).Scan(&free); err != nil {
		return 0, err
	}
	if !free {
		return 0, ErrRelaysRunning
	}
	if to == ResetToNow {
		var cursors int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM `+t.Derived("relay_cursor")).Scan(&cursors); err != nil {
			return 0, err
		}
		if cursors > 0 {
			err = tx.QueryRowContext(ctx, `SELECT `+t.Derived("pending")+`()`).Scan(&skipped)
		} else {
			err = tx.QueryRowContext(ctx, `SELECT count(*) FROM `+t.Ident()+` WHERE sent_at IS NULL`).Scan(&skipped)
		}
		if err != nil {
			return 0, err
		}
	}
	snap := "NULL"
	if to == ResetToNow {
		snap = "pg_current_snapshot()"
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM `+t.Derived("relay_cursor")); err != nil {
		return 0, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+t.Derived("relay_cursor")+` (buckets, snap, next_snap, last_id, system_identifier)
SELECT ARRAY(SELECT generate_series(0, `+fmt.Sprint(Buckets-1)+`))::smallint[], `+snap+`, NULL, 0, system_identifier FROM pg_control_system()`); err != nil {
		return 0, err
	}
	if to == ResetToOldest {
		// Parked events would be published twice: once from the parked table, once again.
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+t.Derived("parked")); err != nil {
			return 0, err
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+t.Derived("relay_cursor_resets")+` (reset_to, reason, skipped) VALUES ($1, $2, $3)`,
		to, reason, skipped); err != nil {
		return 0, err
	}
	return skipped, tx.Commit()
}
