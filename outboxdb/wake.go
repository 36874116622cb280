package outboxdb

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// WakeSQL holds the statements of the wake-up protocol of one table (migration
// 00005_wake_on_demand.sql, docs/architecture.md "Wake-ups"): a relay claims a wait before it
// waits for a notification, and only while a claim lives do inserts notify.
type WakeSQL struct {
	// Wait ($1 float8: how many seconds the claim lasts; $2 int8[]: the transactions still watched,
	// NULL for a new claim) claims or renews the calling session's wait and returns, as int8[],
	// the transactions that must end before the session may rely on notifications alone: for a
	// new claim every transaction in progress once the claim took effect, for a renewal those
	// of $2 still in progress. Fetch after it, in the same round trip or later.
	Wait string
	// Woke ends the calling session's claim.
	Woke string
}

// WakeStatements returns the wake-up statements of t.
func WakeStatements(t Table) WakeSQL {
	p := params{t}
	return WakeSQL{
		Wait: `SELECT ` + p.Func("relay_wait") + `(make_interval(secs => $1::float8), $2::int8[])`,
		Woke: `SELECT ` + p.Func("relay_woke") + `()`,
	}
}

// WakeClaim is how long a relay's claim to wait lasts for a poll interval: longer than any
// wait of the relay, which claims again when it waits again, and short enough that a relay
// that died leaves writers notifying for a few seconds at most.
func WakeClaim(pollInterval time.Duration) time.Duration { return 2*pollInterval + time.Second }

// SetNotify creates (enabled) or drops the table's insert trigger (migration
// 00010_wake_by_polling.sql): a table whose relays poll (--notify=false) needs none, and its
// writers then pay nothing for wake-ups. It waits at most lockWait for the table's lock (the
// change takes SHARE ROW EXCLUSIVE for a moment, behind the inserts in progress) and reports
// whether it changed anything.
func SetNotify(ctx context.Context, db *sql.DB, t Table, enabled bool, lockWait time.Duration) (changed bool, err error) {
	err = inLockWait(ctx, db, lockWait, func(tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, `SELECT `+t.Derived("set_notify")+`($1)`, enabled).Scan(&changed)
	})
	return changed, err
}

// inLockWait runs fn in a transaction whose lock waits last at most lockWait (lock_timeout),
// and commits it if fn succeeds: a change of the table's DDL that waits behind the inserts in
// progress, and holds new ones while it waits, waits that long at most.
func inLockWait(ctx context.Context, db *sql.DB, lockWait time.Duration, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT set_config('lock_timeout', $1, true)`, fmt.Sprintf("%dms", max(lockWait.Milliseconds(), 1))); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// SetLockedInserts creates (enabled) or drops the table's lock trigger (migration
// 00019_locked_inserts.sql): with it, a plain INSERT takes the aggregate's advisory lock and
// draws its id after it, as the writer libraries and <table>_append do. It waits at most
// lockWait for the table's lock and reports whether it changed anything.
func SetLockedInserts(ctx context.Context, db *sql.DB, t Table, enabled bool, lockWait time.Duration) (changed bool, err error) {
	err = inLockWait(ctx, db, lockWait, func(tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, `SELECT `+t.Derived("set_locked_inserts")+`($1)`, enabled).Scan(&changed)
	})
	return changed, err
}

// LockedInserts reports whether plain inserts into t take the aggregate's lock (its lock trigger
// exists).
func LockedInserts(ctx context.Context, db *sql.DB, t Table) (bool, error) {
	var on bool
	err := db.QueryRowContext(ctx, `SELECT `+t.Derived("locked_inserts")+`()`).Scan(&on)
	return on, err
}

// Notifies reports whether inserts into t can notify a waiting relay (its insert trigger exists).
func Notifies(ctx context.Context, db *sql.DB, t Table) (bool, error) {
	var on bool
	err := db.QueryRowContext(ctx, `SELECT `+t.Derived("notifies")+`()`).Scan(&on)
	return on, err
}
