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

// IndexState is the state of one of the table's optional indexes (the pending index, the
// bucket index).
type IndexState struct {
	// Exists: the partitioned index exists (possibly still being built).
	Exists bool
	// Valid: every partition has its part attached, and PostgreSQL uses the index.
	Valid bool
	// Missing are the partitions (schema-qualified, quoted) without their part, while Exists and
	// not Valid: a build in progress or interrupted.
	Missing []string
}

// PendingIndexState is the pending index of a table and what its tracking mode asks of it.
type PendingIndexState struct {
	IndexState
	// SnapshotStarted: the snapshot cursor has rows, and each has passed its first batch.
	SnapshotStarted bool
}

// optionalIndex is an index of the outbox table that only some configurations read, which the
// operator drops where none reads it and builds back, without blocking writers, where one does.
type optionalIndex struct {
	// suffix names the partitioned index (<table><suffix>) and each part (<partition><suffix>).
	suffix string
	// def is the index's columns and predicate, as CREATE INDEX takes them after ON <table>.
	def string
}

var (
	// pendingIndex: row tracking's fetch order over unsent rows.
	pendingIndex = optionalIndex{suffix: "_pending_idx", def: "(id) WHERE sent_at IS NULL"}
	// bucketIndex: a shard of several reads its own buckets through it (migration 00008).
	bucketIndex = optionalIndex{suffix: "_bucket_idx", def: "((" + BucketExpr + "), id) WHERE sent_at IS NULL"}
)

// name is the partitioned index's name (in the table's schema); partName is its part on
// partition part, cut so that the name fits PostgreSQL's 63 bytes.
func (ix optionalIndex) name(t Table) string { return t.Name + ix.suffix }

func (ix optionalIndex) partName(part string) string {
	if len(part) > 63-len(ix.suffix) {
		part = part[:63-len(ix.suffix)]
	}
	return part + ix.suffix
}

// ident is the partitioned index's schema-qualified, quoted name.
func (ix optionalIndex) ident(t Table) string { return pgx.Identifier{t.Schema, ix.name(t)}.Sanitize() }

// ReadPendingIndex reads the state of t's pending index in one statement (catalog reads and
// the snapshot cursor's few rows).
func ReadPendingIndex(ctx context.Context, db *sql.DB, t Table) (PendingIndexState, error) {
	var s PendingIndexState
	err := readIndex(ctx, db, t, pendingIndex, `(SELECT count(*) > 0 AND count(*) FILTER (WHERE snap IS NULL) = 0 FROM `+t.Derived("relay_cursor")+`)`,
		&s.IndexState, &s.SnapshotStarted)
	return s, err
}

// readIndex reads the state of t's index ix into s, and the value of the expression extra (if
// not empty) into dest, in one statement.
func readIndex(ctx context.Context, db *sql.DB, t Table, ix optionalIndex, extra string, s *IndexState, dest ...any) error {
	var missing sql.NullString
	q := `WITH idx AS (SELECT to_regclass($2) AS oid)
SELECT (SELECT oid IS NOT NULL FROM idx),
  coalesce((SELECT x.indisvalid FROM pg_index x WHERE x.indexrelid = (SELECT oid FROM idx)), false),
  (SELECT string_agg(format('%I.%I', n.nspname, p.relname), ',' ORDER BY p.relname)
     FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid JOIN pg_namespace n ON n.oid = p.relnamespace
    WHERE i.inhparent = $1::regclass AND (SELECT oid FROM idx) IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM pg_inherits ii JOIN pg_index x ON x.indexrelid = ii.inhrelid
                       WHERE ii.inhparent = (SELECT oid FROM idx) AND x.indrelid = p.oid))`
	if extra != "" {
		q += ",\n  " + extra
	}
	*s = IndexState{}
	err := db.QueryRowContext(ctx, q, t.Ident(), ix.ident(t)).Scan(append([]any{&s.Exists, &s.Valid, &missing}, dest...)...)
	if err != nil {
		return fmt.Errorf("reading the index %s of %s: %w", ix.name(t), t, err)
	}
	if missing.Valid && missing.String != "" {
		s.Missing = strings.Split(missing.String, ",")
	}
	return nil
}

// DropPendingIndex drops t's pending index, if it exists, and reports whether it did. PostgreSQL
// drops a partitioned index only with the table's ACCESS EXCLUSIVE lock (not CONCURRENTLY): the
// drop is a catalog change of a moment, but it waits behind the inserts in progress and blocks
// new ones while it waits, so it waits at most lockWait, and fails then (nothing changed; try
// again later).
func DropPendingIndex(ctx context.Context, db *sql.DB, t Table, lockWait time.Duration) (dropped bool, err error) {
	return dropIndex(ctx, db, t, pendingIndex, lockWait, "")
}

// dropIndex drops t's index ix within lockWait (see DropPendingIndex), if it exists and, where
// guard is not empty, if that boolean expression, read in the dropping transaction first, is
// true. It reports whether it dropped the index.
func dropIndex(ctx context.Context, db *sql.DB, t Table, ix optionalIndex, lockWait time.Duration, guard string) (dropped bool, err error) {
	name := ix.ident(t)
	err = inLockWait(ctx, db, lockWait, func(tx *sql.Tx) error {
		ok := true
		if guard != "" {
			if err := tx.QueryRowContext(ctx, guard).Scan(&ok); err != nil {
				return err
			}
		}
		var exists bool
		if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil || !exists || !ok {
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
	if err := buildIndex(ctx, db, t, pendingIndex, lockWait, maxParts); err != nil {
		return PendingIndexState{}, err
	}
	return ReadPendingIndex(ctx, db, t)
}

// buildIndex builds t's index ix as BuildPendingIndex describes, at most maxParts partitions.
func buildIndex(ctx context.Context, db *sql.DB, t Table, ix optionalIndex, lockWait time.Duration, maxParts int) error {
	// One session: CREATE INDEX CONCURRENTLY runs outside a transaction, and lock_timeout is
	// the session's (reset before the session goes back to the pool).
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), `RESET lock_timeout`) }()
	if _, err := conn.ExecContext(ctx, `SELECT set_config('lock_timeout', $1, false)`, fmt.Sprintf("%dms", max(lockWait.Milliseconds(), 1))); err != nil {
		return err
	}
	parent := ix.ident(t)
	if _, err := conn.ExecContext(ctx, `CREATE INDEX IF NOT EXISTS `+pgx.Identifier{ix.name(t)}.Sanitize()+
		` ON ONLY `+t.Ident()+` `+ix.def); err != nil {
		return fmt.Errorf("creating %s: %w", parent, err)
	}
	var s IndexState
	if err := readIndex(ctx, db, t, ix, "", &s); err != nil {
		return err
	}
	for i, part := range s.Missing {
		if maxParts > 0 && i >= maxParts {
			break
		}
		if err := buildPart(ctx, conn, t, ix, parent, part); err != nil {
			return err
		}
	}
	return nil
}

// buildPart builds and attaches the part of index ix on partition part (schema-qualified,
// quoted).
func buildPart(ctx context.Context, conn *sql.Conn, t Table, ix optionalIndex, parent, part string) error {
	var relname string
	if err := conn.QueryRowContext(ctx, `SELECT relname FROM pg_class WHERE oid = $1::regclass`, part).Scan(&relname); err != nil {
		return fmt.Errorf("reading partition %s: %w", part, err)
	}
	idx := pgx.Identifier{t.Schema, ix.partName(relname)}.Sanitize()
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
	if _, err := conn.ExecContext(ctx, `CREATE INDEX CONCURRENTLY IF NOT EXISTS `+pgx.Identifier{ix.partName(relname)}.Sanitize()+
		` ON `+part+` `+ix.def); err != nil {
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
