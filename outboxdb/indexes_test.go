package outboxdb_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// pendingFixture is a table with daily partitions and events in each, some marked sent.
func pendingFixture(t *testing.T) (context.Context, *sql.DB, string, outboxdb.Table) {
	t.Helper()
	ctx := context.Background()
	db, url := openDB(t)
	tb := outboxdb.MustParseTable("outbox")
	if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	if _, err := outboxdb.EnsurePartitions(ctx, db, tb, now.AddDate(0, 0, -2), now.AddDate(0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	// 200 events a day over four days and the default partition (a far future day), every
	// third marked sent.
	if _, err := db.ExecContext(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, sent_at)
SELECT 'order', 'o-' || g, 'Placed', '{}', now() - (g % 4) * interval '1 day' + CASE WHEN g % 50 = 0 THEN interval '100 days' ELSE interval '0' END,
       CASE WHEN g % 3 = 0 THEN now() END
FROM generate_series(1, 1000) AS g`); err != nil {
		t.Fatal(err)
	}
	return ctx, db, url, tb
}

// pendingIndexFromCatalog is the observer: the partitioned index's validity and its parts, from
// PostgreSQL's catalog.
func pendingIndexFromCatalog(t *testing.T, db *sql.DB) (exists, valid bool, parts int) {
	t.Helper()
	return indexFromCatalog(t, db, "public.outbox_pending_idx")
}

// indexFromCatalog reads a partitioned index's existence, validity and parts from the catalog.
func indexFromCatalog(t *testing.T, db *sql.DB, name string) (exists, valid bool, parts int) {
	t.Helper()
	err := db.QueryRow(`SELECT to_regclass($1) IS NOT NULL,
  coalesce((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)), false),
  (SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass($1))`, name).Scan(&exists, &valid, &parts)
	if err != nil {
		t.Fatal(err)
	}
	return exists, valid, parts
}

// unsentByIndex counts the unsent rows as PostgreSQL reads them through the pending index only
// (every other access path disabled), and by a sequential scan.
func unsentByIndex(t *testing.T, url string) (byIndex, bySeq int64, plan string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, `SET enable_seqscan = off; SET enable_bitmapscan = off`); err != nil {
		t.Fatal(err)
	}
	const q = `SELECT count(*) FROM (SELECT id FROM outbox WHERE sent_at IS NULL ORDER BY id) AS s`
	rows, err := c.Query(ctx, `EXPLAIN (COSTS OFF) `+q)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, q).Scan(&byIndex); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `RESET enable_seqscan; SET enable_indexscan = off; SET enable_indexonlyscan = off`); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`).Scan(&bySeq); err != nil {
		t.Fatal(err)
	}
	return byIndex, bySeq, strings.Join(lines, "\n")
}

// TestPendingIndexDropAndBuild: the pending index is dropped and built again, a partition at a
// time, and PostgreSQL's catalog and planner agree with the state read.
func TestPendingIndexDropAndBuild(t *testing.T) {
	ctx, db, url, tb := pendingFixture(t)
	s, err := outboxdb.ReadPendingIndex(ctx, db, tb)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Exists || !s.Valid || len(s.Missing) != 0 || s.SnapshotStarted {
		t.Fatalf("after the migrations: %+v, want a valid index, no snapshot cursor", s)
	}
	changed, err := outboxdb.DropPendingIndex(ctx, db, tb, time.Second)
	if err != nil || !changed {
		t.Fatalf("drop: %v, %v", changed, err)
	}
	if exists, _, _ := pendingIndexFromCatalog(t, db); exists {
		t.Fatal("the catalog still has the index")
	}
	if changed, err := outboxdb.DropPendingIndex(ctx, db, tb, time.Second); err != nil || changed {
		t.Fatalf("second drop: %v, %v, want nothing to do", changed, err)
	}
	var parts int
	if err := db.QueryRow(`SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass`).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	s, err = outboxdb.BuildPendingIndex(ctx, db, tb, time.Second, 1)
	if err != nil {
		t.Fatal(err)
	}
	exists, valid, attached := pendingIndexFromCatalog(t, db)
	if !exists || valid || attached != 1 || s.Valid || len(s.Missing) != parts-1 {
		t.Fatalf("one partition built: catalog exists %v valid %v parts %d; read %+v; want %d missing", exists, valid, attached, s, parts-1)
	}
	// A partition created during the build gets its part with it.
	if _, err := outboxdb.EnsurePartitions(ctx, db, tb, time.Now().UTC().AddDate(0, 0, 5), time.Now().UTC().AddDate(0, 0, 5)); err != nil {
		t.Fatal(err)
	}
	if s, err = outboxdb.BuildPendingIndex(ctx, db, tb, time.Second, 0); err != nil {
		t.Fatal(err)
	}
	exists, valid, attached = pendingIndexFromCatalog(t, db)
	if !exists || !valid || attached != parts+1 || !s.Valid || len(s.Missing) != 0 {
		t.Fatalf("built: catalog exists %v valid %v parts %d (want %d); read %+v", exists, valid, attached, parts+1, s)
	}
	byIndex, bySeq, plan := unsentByIndex(t, url)
	if !strings.Contains(plan, "pending_idx") || byIndex != bySeq || bySeq != 667 {
		t.Fatalf("unsent rows through the index %d, by a scan %d (want 667); plan:\n%s", byIndex, bySeq, plan)
	}
}

// TestPendingIndexBuildResumes: a build killed while CREATE INDEX CONCURRENTLY waits (for a
// transaction older than it: the moment a plain CREATE INDEX would hold the partition's SHARE
// lock) leaves an invalid index; writers were not blocked meanwhile, and the next call drops the
// interrupted build and completes.
func TestPendingIndexBuildResumes(t *testing.T) {
	ctx, db, url, tb := pendingFixture(t)
	if _, err := outboxdb.DropPendingIndex(ctx, db, tb, time.Second); err != nil {
		t.Fatal(err)
	}
	// An old transaction with a snapshot (not touching the table, whose lock would hold the
	// build's first step instead): CREATE INDEX CONCURRENTLY waits for it to end.
	old, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close(ctx)
	oldTx, err := old.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oldTx.Exec(ctx, `SELECT count(*) FROM pg_class`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := outboxdb.BuildPendingIndex(ctx, db, tb, time.Second, 0)
		done <- err
	}()
	// Wait until the build waits for the old transaction (pg_stat_activity: the observer).
	deadline := time.Now().Add(30 * time.Second)
	var builder int
	for {
		err := db.QueryRow(`SELECT pid FROM pg_stat_activity WHERE query LIKE 'CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock'`).Scan(&builder)
		if err == nil {
			break
		}
		if !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the build never waited for the old transaction")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A writer is not blocked meanwhile: its insert (into every partition's range) commits
	// within a statement timeout far below the build's wait.
	w, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	if _, err := w.Exec(ctx, `SET statement_timeout = '2s'; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
SELECT 'order', 'w-' || g, 'Placed', '{}', now() - g * interval '1 day' FROM generate_series(0, 3) AS g`); err != nil {
		t.Fatalf("a writer was blocked by the build: %v", err)
	}
	// The interruption: the build's statement is cancelled mid-way (as a statement_timeout or a
	// DBA would; an operator that dies leaves its backend to finish the build, or not).
	if _, err := db.Exec(`SELECT pg_cancel_backend($1)`, builder); err != nil {
		t.Fatal(err)
	}
	err = <-done
	t.Logf("the interrupted build: %v", err)
	if err == nil || !strings.Contains(err.Error(), "canceling statement") {
		t.Fatalf("the interrupted build returned %v", err)
	}
	if err := oldTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var invalid []string
	rows, err := db.Query(`SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid WHERE NOT x.indisvalid AND c.relname LIKE '%pending%' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		_ = rows.Scan(&n)
		invalid = append(invalid, n)
	}
	if rows.Err() != nil || !slices.Contains(invalid, "outbox_pending_idx") || len(invalid) < 2 {
		t.Fatalf("invalid indexes after the interruption: %v (%v), want the partitioned index and an interrupted part", invalid, rows.Err())
	}
	s, err := outboxdb.BuildPendingIndex(ctx, db, tb, time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	exists, valid, _ := pendingIndexFromCatalog(t, db)
	if !exists || !valid || !s.Valid {
		t.Fatalf("after resuming: catalog exists %v valid %v; read %+v", exists, valid, s)
	}
	var left int
	if err := db.QueryRow(`SELECT count(*) FROM pg_index WHERE NOT indisvalid`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d invalid indexes left (%v)", left, err)
	}
	byIndex, bySeq, plan := unsentByIndex(t, url)
	if byIndex != bySeq || bySeq != 667+4 {
		t.Fatalf("unsent rows through the index %d, by a scan %d (want %d); plan:\n%s", byIndex, bySeq, 667+4, plan)
	}
}

// TestPendingIndexDropWaitsBoundedly: a drop behind an insert in progress gives up after its
// lock wait, and the index stays.
func TestPendingIndexDropWaitsBoundedly(t *testing.T) {
	ctx, db, url, tb := pendingFixture(t)
	w, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	tx, err := w.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'open', 'Placed', '{}')`); err != nil {
		t.Fatal(err)
	}
	changed, err := outboxdb.DropPendingIndex(ctx, db, tb, 200*time.Millisecond)
	if err == nil || changed || !strings.Contains(err.Error(), "lock timeout") {
		t.Fatalf("drop behind an open insert: %v, %v; want a lock timeout", changed, err)
	}
	if exists, valid, _ := pendingIndexFromCatalog(t, db); !exists || !valid {
		t.Fatal("the index changed")
	}
}
