package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// Snapshot tracking marks no row: a drain under it ends when every cursor row's snapshot shows
// the transactions that wrote the backlog as committed (and nothing is parked). The end time is
// the commit time of the last cursor write (track_commit_timestamp), which an idle relay does not
// repeat for several seconds after its last batch; the harness polls every 250 ms.

// snapWatch is what the harness knows of a backlog drained under snapshot tracking: the
// transactions that wrote it.
type snapWatch struct {
	txids []string
}

// watchSnapshot returns the transactions that wrote the rows of r.
func watchSnapshot(ctx context.Context, conn *pgx.Conn, t outboxdb.Table, r idRange) (*snapWatch, error) {
	rows, err := conn.Query(ctx, `SELECT DISTINCT txid::text FROM `+t.Ident()+` WHERE id BETWEEN $1 AND $2 AND txid IS NOT NULL`, r.lo, r.hi)
	if err != nil {
		return nil, fmt.Errorf("transactions of the backlog: %w", err)
	}
	txids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("transactions of the backlog: %w", err)
	}
	return &snapWatch{txids: txids}, nil
}

// pending reports whether a cursor has not passed the backlog yet, or events are parked.
func (w *snapWatch) pending(ctx context.Context, conn *pgx.Conn, t outboxdb.Table) (bool, error) {
	var done bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+t.Derived("relay_cursor")+`)
  AND NOT EXISTS (SELECT 1 FROM `+t.Derived("relay_cursor")+` c, unnest($1::text[]::xid8[]) AS x
                  WHERE c.snap IS NULL OR NOT pg_visible_in_snapshot(x, c.snap))
  AND NOT EXISTS (SELECT 1 FROM `+t.Derived("parked")+`)`, w.txids).Scan(&done)
	return !done, err
}

// progressQuery is a cheap progress signal: the cursor table's row writes.
func (w *snapWatch) progressQuery(t outboxdb.Table) string {
	return `SELECT coalesce(sum(n_tup_upd + n_tup_ins), 0)::bigint FROM pg_stat_user_tables WHERE relid = ` +
		outboxdb.QuoteLiteral(t.Derived("relay_cursor")) + `::regclass AND $1::text IS NOT NULL`
}

// passed counts the rows of r the cursors have passed and returns the commit time of the last
// cursor write.
func (w *snapWatch) passed(ctx context.Context, conn *pgx.Conn, t outboxdb.Table, r idRange) (int64, time.Time, error) {
	var (
		n    int64
		last *time.Time
	)
	bucket := outboxdb.BucketExprOf("o")
	err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+t.Ident()+` o JOIN `+t.Derived("relay_cursor")+` c ON `+bucket+` = ANY(c.buckets)
    WHERE o.id BETWEEN $1 AND $2 AND `+t.Derived("cursor_passed")+`(c.snap, c.next_snap, c.last_id, o.id, o.txid)),
  (SELECT max(pg_xact_commit_timestamp(xmin)) FROM `+t.Derived("relay_cursor")+`)`, r.lo, r.hi).Scan(&n, &last)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("count published rows: %w", err)
	}
	if last == nil {
		return n, time.Time{}, nil
	}
	return n, *last, nil
}

// runSnapshotCeiling is the "PostgreSQL alone" bound of snapshot tracking: one connection reads
// the backlog in id order, ceilingBatch rows per statement with every event column (as the
// relay's first batch does: the unsent rows committed in one snapshot), writes a one-row
// progress table after each batch and commits, and publishes nothing. At the end it records
// the snapshot as a relay's cursor, which ends the drain for the harness.
func runSnapshotCeiling(ctx context.Context, dbURL string, t outboxdb.Table, finished func()) (int64, error) {
	conn, done, err := workerConn(dbURL, finished)
	if err != nil {
		return 0, err
	}
	defer done()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_progress (id int PRIMARY KEY, last_id bigint);
INSERT INTO bench_progress VALUES (1, 0) ON CONFLICT DO NOTHING`); err != nil {
		return 0, err
	}
	var snap string
	if err := conn.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&snap); err != nil {
		return 0, err
	}
	read := fmt.Sprintf(`SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, attempts
FROM %s WHERE sent_at IS NULL AND id > $1 AND (txid IS NULL OR pg_visible_in_snapshot(txid, $2::text::pg_snapshot))
ORDER BY id LIMIT %d`, t.Ident(), ceilingBatch)
	var total, last int64
	for ctx.Err() == nil {
		var b pgx.Batch
		n := 0
		b.Queue(read, last, snap).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				v := rows.RawValues()
				last = int64(uint64(v[0][0])<<56 | uint64(v[0][1])<<48 | uint64(v[0][2])<<40 | uint64(v[0][3])<<32 |
					uint64(v[0][4])<<24 | uint64(v[0][5])<<16 | uint64(v[0][6])<<8 | uint64(v[0][7]))
				n++
			}
			return rows.Err()
		})
		b.Queue(`UPDATE bench_progress SET last_id = $1 WHERE id = 1`, last)
		if err := conn.SendBatch(ctx, &b).Close(); err != nil {
			return total, err
		}
		total += int64(n)
		if n == 0 {
			break
		}
	}
	_, err = conn.Exec(ctx, `INSERT INTO `+t.Derived("relay_cursor")+` (buckets, snap, system_identifier)
SELECT ARRAY(SELECT generate_series(0, 255))::smallint[], $1::text::pg_snapshot, system_identifier FROM pg_control_system()`, snap)
	return total, err
}

// holdXmin opens a REPEATABLE READ transaction that has taken its snapshot (the database's xmin
// stays behind it, so vacuum removes nothing) and returns the function that ends it.
func holdXmin(ctx context.Context, dbURL string) (func(), error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err == nil {
		_, err = tx.Exec(ctx, `SELECT count(*) FROM pg_class`)
	}
	if err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("hold xmin: %w", err)
	}
	return func() {
		_ = tx.Rollback(context.Background())
		conn.Close(context.Background())
	}, nil
}
