package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// Every generated event looks like what a shop service would append: an order event of about
// 150 bytes of JSON, keyed by one of cfg.aggregates order ids, with a W3C traceparent header.
// Payloads and headers come from a pool of 1,024 built once per statement, which makes
// generating millions of rows about 2.5 times cheaper than building each row's JSON.
const eventPool = `WITH p AS MATERIALIZED (
	SELECT i,
		(ARRAY['OrderPlaced', 'OrderPaid', 'OrderShipped'])[1 + i % 3] AS event_type,
		jsonb_build_object(
			'order_id', 'order-' || i,
			'seq', i,
			'customer_id', 'customer-' || (i * 31 % 7919),
			'amount', round((i * 7919 % 100000) / 100.0, 2),
			'currency', 'EUR',
			'lines', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (i % 997), 'qty', 1 + i % 5, 'price', 19.99))) AS payload,
		jsonb_build_object('traceparent', '00-' || md5(i::text) || '-' || left(md5((i + 1)::text), 16) || '-01') AS headers
	FROM generate_series(0, 1023) i)
`

// $1, $2: the generate_series bounds (g); $3: the number of distinct aggregates.
const eventColumns = `aggregate_type, aggregate_id, event_type, payload, headers`
const eventSelect = `'order', 'order-' || (g % $3), p.event_type, p.payload, p.headers`
const eventFrom = `generate_series($1::bigint, $2::bigint) g JOIN p ON p.i = g % 1024`

// execer is a *pgx.Conn or a pgx.Tx.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// insertPending inserts n pending events in one statement on conn (in the caller's transaction
// if there is one).
func insertPending(ctx context.Context, conn execer, t outboxdb.Table, from, n int64, aggregates int) error {
	_, err := conn.Exec(ctx, fmt.Sprintf(`%sINSERT INTO %s (%s) SELECT %s FROM %s`,
		eventPool, t.Ident(), eventColumns, eventSelect, eventFrom), from, from+n-1, aggregates)
	return err
}

// fillPending inserts n pending events in chunks, each committed, reporting progress.
func fillPending(ctx context.Context, dbURL string, t outboxdb.Table, n int64, aggregates int, what string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	const chunk = 250_000
	start := time.Now()
	for done := int64(0); done < n; done += chunk {
		m := min(chunk, n-done)
		if err := insertPending(ctx, conn, t, done+1, m, aggregates); err != nil {
			return fmt.Errorf("insert %s: %w", what, err)
		}
		progress("%s: %d/%d rows (%.0f rows/s)", what, done+m, n, float64(done+m)/time.Since(start).Seconds())
	}
	return nil
}

// fillSent inserts n events that were already sent, their created_at spread evenly over the
// days UTC days before today (so over that many daily partitions), sent 20 ms after creation.
func fillSent(ctx context.Context, dbURL string, t outboxdb.Table, n int64, aggregates, days int) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	// $4: days, $5: today's UTC midnight.
	q := fmt.Sprintf(`%sINSERT INTO %s (%s, created_at, sent_at)
		SELECT %s, c, c + interval '20 ms'
		FROM %s, LATERAL (SELECT $5::timestamptz - make_interval(days => 1 + (g %% $4)::int)
		                         + make_interval(secs => (g / $4) %% 86399) AS c) ts`,
		eventPool, t.Ident(), eventColumns, eventSelect, eventFrom)
	today := time.Now().UTC().Truncate(24 * time.Hour)
	const chunk = 500_000
	start := time.Now()
	for done := int64(0); done < n; done += chunk {
		m := min(chunk, n-done)
		if _, err := conn.Exec(ctx, q, done+1, done+m, aggregates, days, today); err != nil {
			return fmt.Errorf("insert sent rows: %w", err)
		}
		progress("sent rows: %d/%d (%.0f rows/s)", done+m, n, float64(done+m)/time.Since(start).Seconds())
	}
	return nil
}

// vacuumAnalyze brings a freshly loaded table to the state autovacuum would keep it in.
func vacuumAnalyze(ctx context.Context, dbURL string, t outboxdb.Table) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "VACUUM (ANALYZE) "+t.Ident()); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	return nil
}
