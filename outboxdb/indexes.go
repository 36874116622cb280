package outboxdb

// The indexes of each tracking mode (docs/architecture.md, "The write path per mode").
//
// Every index of the outbox table costs each insert its entry and its WAL. The pending index
// (<table>_pending_idx ON (id) WHERE sent_at IS NULL) serves row tracking only: its fetch walks
// the unsent rows in id order, and rows marked sent leave it. Under snapshot tracking no row is
// ever marked sent, so it holds every row, a second copy of the primary key's id order, which
// the snapshot fetch reads just as well (a range of ids, in id order). A table tracked by
// snapshot therefore drops it, and gets it back (built without blocking writers) if its relays
// ever run row tracking.
//
// Only the first batch of a snapshot cursor reads unsent rows as such (the lowest unsent id:
// the row-tracking backlog it takes over), so the index is dropped once every cursor row has
// passed its first batch: a table with a long history of sent rows is not walked from its first
// id by the primary key.

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// PendingIndexState is the pending index of a table and what its tracking mode asks of it.
type PendingIndexState struct {
	// Exists: the partitioned index exists (possibly still being built).
	Exists bool
	// Valid: every partition has its part attached, and PostgreSQL uses the index.
	Valid bool
	// Missing are the partitions (schema-qualified, quoted) without their part, while Exists and
	// not Valid: a build in progress or interrupted.
	Missing []string
	// SnapshotStarted: the snapshot cursor has rows, and each has passed its first batch.
	SnapshotStarted bool
}

// pendingIndexName is the partitioned index's name (in the table's schema); partIndexName is
// its part on partition part, cut so that the name fits PostgreSQL's 63 bytes.
func pendingIndexName(t Table) string { return t.Name + "_pending_idx" }

func partIndexName(part string) string {
	const suffix = "_pending_idx"
	if len(part) > 63-len(suffix) {
		part = part[:63-len(suffix)]
	}
	return part + suffix
}

// ReadPendingIndex reads the state of t's pending index in one statement (catalog reads and
// the snapshot cursor's few rows).
func ReadPendingIndex(ctx context.Context, db *sql.DB, t Table) (PendingIndexState, error) {
	var (
		s       PendingIndexState
		missing sql.NullString
	)
	err := db.QueryRowContext(ctx, `WITH idx AS (SELECT to_regclass($2) AS oid)
SELECT (SELECT oid IS NOT NULL FROM idx),
  coalesce((SELECT x.indisvalid FROM pg_index x WHERE x.indexrelid = (SELECT oid FROM idx)), false),
  (SELECT string_agg(format('%I.%I', n.nspname, p.relname), ',' ORDER BY p.relname)
     FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid JOIN pg_namespace n ON n.oid = p.relnamespace
    WHERE i.inhparent = $1::regclass AND (SELECT oid FROM idx) IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM pg_inherits ii JOIN pg_index x ON x.indexrelid = ii.inhrelid
                       WHERE ii.inhparent = (SELECT oid FROM idx) AND x.indrelid = p.oid)),
  (SELECT count(*) > 0 AND count(*) FILTER (WHERE snap IS NULL) = 0 FROM `+t.Derived("relay_cursor")+`)`,
		t.Ident(), pgx.Identifier{t.Schema, pendingIndexName(t)}.Sanitize()).Scan(&s.Exists, &s.Valid, &missing, &s.SnapshotStarted)
	if err != nil {
		return s, fmt.Errorf("reading the pending index of %s: %w", t, err)
	}
	if missing.Valid && missing.String != "" {
		s.Missing = strings.Split(missing.String, ",")
	}
	return s, nil
}

// DropPendingIndex drops t's pending index, if it exists, and reports whether it did. PostgreSQL
// drops a partitioned index only with the table's ACCESS EXCLUSIVE lock (not CONCURRENTLY): the
// drop is a catalog change of a moment, but it waits behind the inserts in progress and blocks
// new ones while it waits, so it waits at most lockWait, and fails then (nothing changed; try
// again later).
func DropPendingIndex(ctx context.Context, db *sql.DB, t Table, lockWait time.Duration) (dropped bool, err error) {
	name := pgx.Identifier{t.Schema, pendingIndexName(t)}.Sanitize()
	err = inLockWait(ctx, db, lockWait, func(tx *sql.Tx) error {
		var exists bool
		if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil || !exists {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DROP INDEX IF EXISTS `+name); err != nil {
			return fmt.Errorf("dropping %s: %w", name, err)
		}
		dropped = true
		return nil
	})
	return dropped && err == nil, err
}

// BuildPendingIndex builds t's pending index without blocking writers, at most maxParts
// partitions per call (0: all), and returns the index's state after. It is resumable: each call
// goes on where the last one stopped, whether it returned, failed or was killed.
//
//  1. The partitioned index is created ON ONLY the table: invalid, with no part (a catalog
//     change of a moment, taken within lockWait). From then on, a partition created or attached
//     gets its part with it.
//  2. Each partition without its part gets one, built CONCURRENTLY (writers go on; a build
//     interrupted leaves an invalid index, dropped CONCURRENTLY and built again), then attached
//     (within lockWait).
//  3. PostgreSQL marks the partitioned index valid when its last part is attached.
func BuildPendingIndex(ctx context.Context, db *sql.DB, t Table, lockWait time.Duration, maxParts int) (PendingIndexState, error) {
	// One session: CREATE INDEX CONCURRENTLY runs outside a transaction, and lock_timeout is
	// the session's (reset before the session goes back to the pool).
	conn, err := db.Conn(ctx)
	if err != nil {
		return PendingIndexState{}, err
	}
	defer conn.Close()
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), `RESET lock_timeout`) }()
	if _, err := conn.ExecContext(ctx, `SELECT set_config('lock_timeout', $1, false)`, fmt.Sprintf("%dms", max(lockWait.Milliseconds(), 1))); err != nil {
		return PendingIndexState{}, err
	}
	parent := pgx.Identifier{t.Schema, pendingIndexName(t)}.Sanitize()
	if _, err := conn.ExecContext(ctx, `CREATE INDEX IF NOT EXISTS `+pgx.Identifier{pendingIndexName(t)}.Sanitize()+
		` ON ONLY `+t.Ident()+` (id) WHERE sent_at IS NULL`); err != nil {
		return PendingIndexState{}, fmt.Errorf("creating %s: %w", parent, err)
	}
	s, err := ReadPendingIndex(ctx, db, t)
	if err != nil {
		return s, err
	}
	for i, part := range s.Missing {
		if maxParts > 0 && i >= maxParts {
			break
		}
		if err := buildPart(ctx, conn, t, parent, part); err != nil {
			return s, err
		}
	}
	return ReadPendingIndex(ctx, db, t)
}

// buildPart builds and attaches the pending index's part on partition part (schema-qualified,
// quoted).
func buildPart(ctx context.Context, conn *sql.Conn, t Table, parent, part string) error {
	var relname string
	if err := conn.QueryRowContext(ctx, `SELECT relname FROM pg_class WHERE oid = $1::regclass`, part).Scan(&relname); err != nil {
		return fmt.Errorf("reading partition %s: %w", part, err)
	}
	idx := pgx.Identifier{t.Schema, partIndexName(relname)}.Sanitize()
	var exists, valid bool
	if err := conn.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL,
  coalesce((SELECT indisvalid AND indisready FROM pg_index WHERE indexrelid = to_regclass($1)), false)`, idx).Scan(&exists, &valid); err != nil {
		return err
	}
	if exists && !valid { // an interrupted build
		if _, err := conn.ExecContext(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+idx); err != nil {
			return fmt.Errorf("dropping the interrupted build %s: %w", idx, err)
		}
	}
	if _, err := conn.ExecContext(ctx, `CREATE INDEX CONCURRENTLY IF NOT EXISTS `+pgx.Identifier{partIndexName(relname)}.Sanitize()+
		` ON `+part+` (id) WHERE sent_at IS NULL`); err != nil {
		return fmt.Errorf("building %s: %w", idx, err)
	}
	if _, err := conn.ExecContext(ctx, `ALTER INDEX `+parent+` ATTACH PARTITION `+idx); err != nil {
		var already bool
		// Attached already (a call that stopped right after the attach): nothing to do.
		if qerr := conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = $1::regclass AND inhparent = $2::regclass)`,
			idx, parent).Scan(&already); qerr == nil && already {
			return nil
		}
		return fmt.Errorf("attaching %s to %s: %w", idx, parent, err)
	}
	return nil
}
