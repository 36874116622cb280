package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestRelayStatementsPlannedOnce: the statements a relay runs at every batch are planned once
// per session, not at every execution. Left to choose (plan_cache_mode auto), PostgreSQL planned
// snapshot tracking's open statement anew at every call, which cost more than running it (0.8 ms
// a call, most of a snapshot relay's database CPU at 500 events/s). The statements run here as
// the relay runs them, prepared by pgx on a session tuned as the relay tunes its sessions
// (TuneFetchSession), with a writer committing an event between round trips; the observer is the
// server's own count of generic and custom plans per prepared statement (pg_prepared_statements).
// The same round trips on a session left at plan_cache_mode auto are logged beside, to show what
// the setting prevents.
func TestRelayStatementsPlannedOnce(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	insertBacklog(t, url, 20_000, 500, "order")
	if _, err := pool.Exec(ctx, `ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	const rounds = 12
	for _, tuned := range []bool{false, true} {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if tuned {
			err = TuneFetchSession(ctx, conn)
		} else {
			_, err = conn.Exec(ctx, outboxdb.PlanInIDOrder)
		}
		if err != nil {
			t.Fatal(err)
		}
		sq := newSnapQueries(testTable, false, 500)
		rq := newQueries(testTable, 1, 500)
		// The first batch (from no snapshot) reads differently; the loop's batches follow it.
		first, _ := openBatch(ctx, t, conn, sq, snapMark{floor: -1})
		from := first.to
		for i := range rounds {
			if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'Seq', '{}')`,
				"agg-"+string(rune('a'+i))); err != nil {
				t.Fatal(err)
			}
			// Snapshot tracking: open the next batch and read it, while a writer's transaction is
			// open: the next batch reads its event through the transactions open at this one.
			open, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := open.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'open', 'Seq', '{}')`); err != nil {
				t.Fatal(err)
			}
			rng, _ := openBatch(ctx, t, conn, sq, from)
			readBatch(ctx, t, conn, sq, rng)
			from = rng.to
			if err := open.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			// Row tracking: fetch past the rows in flight, and mark a few sent.
			var ids []int64
			var lo, hi time.Time
			if err := conn.QueryRow(ctx, `SELECT array_agg(id), min(created_at), max(created_at) FROM
  (SELECT id, created_at FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT 3) s`).Scan(&ids, &lo, &hi); err != nil {
				t.Fatal(err)
			}
			sql, args, err := FetchSQL(testTable, 1, 0, 500, ids, nil)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := conn.Query(ctx, sql, args...)
			if err != nil {
				t.Fatal(err)
			}
			rows.Close()
			if _, err := conn.Exec(ctx, rq.mark, ids, lo, hi); err != nil {
				t.Fatal(err)
			}
		}
		hot := map[string]string{"open": sq.open, "openKnown": sq.openKnown, "fetch": sq.fetch, "fetchOpen": sq.fetchOpen, "row fetch": "", "mark": rq.mark}
		if sql, _, err := FetchSQL(testTable, 1, 0, 500, []int64{1}, nil); err == nil {
			hot["row fetch"] = sql
		}
		for name, sql := range hot {
			var generic, custom int64
			err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`, sql).
				Scan(&generic, &custom)
			if err != nil {
				t.Fatalf("%s: not among the session's prepared statements (%v): %s", name, err, firstLine(sql))
			}
			if !tuned {
				t.Logf("plan_cache_mode auto: %s planned anew %d times in %d executions", name, custom, generic+custom)
				continue
			}
			if custom > 0 || generic == 0 {
				t.Errorf("%s: %d custom plans and %d uses of a generic plan; want every execution on the one generic plan", name, custom, generic)
			}
		}
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
