package plugin

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestStatusCost measures kubectl outbox status (and the reads of events and published) on a
// row-tracked table of 10M events (OUTBOX_STATUS_COST_ROWS) spread over 7 daily partitions, of
// which the newest 200,000 are pending (past the backlog's count limit, so it is estimated) and
// 50 aggregates blocked. A measurement for the record, not a target: it runs only with
// OUTBOX_STATUS_COST=1 and takes a few minutes to write the rows.
//
//	OUTBOX_STATUS_COST=1 hack/test.sh ./plugin -run TestStatusCost -v -timeout 30m
func TestStatusCost(t *testing.T) {
	if os.Getenv("OUTBOX_STATUS_COST") == "" {
		t.Skip("a measurement: set OUTBOX_STATUS_COST=1 to run it")
	}
	rows := 10_000_000
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_STATUS_COST_ROWS")); err == nil && v > 0 {
		rows = v
	}
	const pending = 200_000
	f := newFixture(t, nil)
	ctx := context.Background()
	if _, err := f.db.ExecContext(ctx, `SELECT * FROM outbox_create_partitions(current_date - 7, current_date + 1)`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Oldest first, one aggregate per 10 events, 7 days back to now; all but the newest pending.
	const chunk = 1_000_000
	for lo := 1; lo <= rows; lo += chunk {
		hi := min(lo+chunk-1, rows)
		if _, err := f.db.ExecContext(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, sent_at)
SELECT 'order', 'order-' || (i % ($3::int / 10)), 'OrderPlaced', jsonb_build_object('order', i, 'amount', i % 1000),
  now() - make_interval(secs => 7 * 86400.0 * ($3::int - i) / $3::int),
  CASE WHEN i <= $3::int - $4::int THEN now() END
FROM generate_series($1::int, $2::int) AS i`, lo, hi, rows, pending); err != nil {
			t.Fatal(err)
		}
	}
	// 50 blocked aggregates: their first pending event failed.
	if _, err := f.db.ExecContext(ctx, `UPDATE outbox SET attempts = 4, error = 'publish to orders failed: [10] Message Size Too Large'
WHERE id IN (SELECT min(id) FROM outbox WHERE sent_at IS NULL GROUP BY aggregate_id ORDER BY min(id) LIMIT 50)`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.ExecContext(ctx, `VACUUM ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	var size string
	if err := f.db.QueryRowContext(ctx, `SELECT pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits WHERE inhparent = 'public.outbox'::regclass`).Scan(&size); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d events (%d pending, 50 aggregates blocked; %s) in %s", rows, pending, size, time.Since(start).Round(time.Second))

	var pendingEvent string
	if err := f.db.QueryRowContext(ctx, `SELECT event_id::text FROM outbox WHERE id = $1`, rows-pending/2).Scan(&pendingEvent); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{
		{"status", "orders"},
		{"status", "orders"},
		{"status", "orders"},
		{"events", "orders", "--blocked", "--limit", "50"},
		{"events", "orders", "--pending", "--limit", "50"},
		{"events", "orders", "--aggregate", "order-42", "--since", "1h"},
		{"events", "orders", "--aggregate", "order-42"},
		{"published", "orders", "--event", fmt.Sprint(rows / 2)},
		{"published", "orders", "--event", pendingEvent}, // by event_id: no index, a scan of the table
	} {
		begin := time.Now()
		var out any
		f.runJSON(t, &out, c...)
		took := time.Since(begin)
		measured := ""
		if m, ok := out.(map[string]any); ok && m["measuredIn"] != nil {
			measured = fmt.Sprintf(" (database part %v)", m["measuredIn"])
		}
		t.Logf("kubectl outbox %v: %s%s", c, took.Round(time.Millisecond), measured)
	}
	out, _, _ := f.run(t, "status", "orders")
	t.Logf("status:\n%s", out)
}
