package outboxdb

import (
	"context"
	"database/sql"
	"time"
)

// NewTableChecks is whether a new table keeps the four CHECKs migration 00001 gives it: it does
// not. relay migrate and the operator (for an OutboxRelay that leaves spec.writers.checks unset)
// drop them right after making the table: every insert is cheaper by what PostgreSQL spends
// reading and planning them (README, "What appending costs your commits"), outbox.Append refuses a
// bad event in the application and the SQL appends in the database (migration 00023), and the
// relays park a bad plain INSERT as poison (reason invalid). An existing table keeps what it has.
const NewTableChecks = false

// SetChecks adds back (enabled) or drops the table's four CHECKs (migration
// 00022_checks_at_the_relay.sql): without them PostgreSQL refuses nothing at insert, and the
// relays park what they would have refused as poison. Adding them back adds them NOT VALID: the
// rows written meanwhile are not scanned (the relays checked them), and every insert is checked
// again from then on. It waits at most lockWait for the table's lock and reports whether it
// changed anything.
func SetChecks(ctx context.Context, db *sql.DB, t Table, enabled bool, lockWait time.Duration) (changed bool, err error) {
	err = inLockWait(ctx, db, lockWait, func(tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, `SELECT `+t.Derived("set_checks")+`($1)`, enabled).Scan(&changed)
	})
	return changed, err
}

// Checks reports whether t has all four of its CHECKs, valid or not.
func Checks(ctx context.Context, db *sql.DB, t Table) (bool, error) {
	var on bool
	err := db.QueryRowContext(ctx, `SELECT `+t.Derived("checks")+`()`).Scan(&on)
	return on, err
}
