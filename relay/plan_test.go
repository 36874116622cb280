package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// planNode is a node of EXPLAIN (FORMAT JSON).
type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	Loops        float64    `json:"Actual Loops"` // EXPLAIN ANALYZE only
	Plans        []planNode `json:"Plans"`
}

func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// explainJSON returns the plan PostgreSQL chooses for sql on conn, and EXPLAIN's raw output.
func explainJSON(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string, args ...any) (planNode, string) {
	t.Helper()
	var raw []byte
	if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		t.Fatalf("explain %s: %v", sql, err)
	}
	var out []struct{ Plan planNode }
	if err := json.Unmarshal(raw, &out); err != nil || len(out) != 1 {
		t.Fatalf("explain output %s: %v", raw, err)
	}
	return out[0].Plan, string(raw)
}

// TestFetchPlan checks, with a million sent rows and a few thousand pending ones in today's
// partition (and more in yesterday's and the default partition), that the exact statements the
// relay runs read pending rows through the pending partial index (a shard of several: the
// bucket index) and never scan a partition with rows sequentially: the fetch (every variant,
// one shard and four, custom and generic plans), the mark, the outcome record and the
// statistics.
func TestFetchPlan(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	if _, err := pool.Exec(ctx, `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
SELECT 'order', 'a' || (g % 50000), 'Seq', '{}', now() FROM generate_series(1, 1000000) AS g`); err != nil {
		t.Fatal(err)
	}
	// Yesterday's partition and the default partition hold rows too, sent and pending.
	if _, err := pool.Exec(ctx, `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, sent_at)
SELECT 'order', 'a' || (g % 50000), 'Seq', '{}', now() - interval '1 day', CASE WHEN g % 100 <> 0 THEN now() END
FROM generate_series(1, 100000) AS g;
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, sent_at)
SELECT 'order', 'a' || (g % 50000), 'Seq', '{}', now() + interval '30 days', CASE WHEN g % 100 <> 0 THEN now() END
FROM generate_series(1, 50000) AS g`); err != nil {
		t.Fatal(err)
	}
	insertBacklog(t, url, 5000, 500, "order")
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	t.Logf("1,150,000 sent and 6,500 pending rows inserted in %s", time.Since(start).Round(time.Millisecond))
	withRows := map[string]bool{}
	rows0, err := pool.Query(ctx, `SELECT c.relname FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
WHERE h.inhparent = 'public.outbox'::regclass AND c.reltuples > 0`)
	if err != nil {
		t.Fatal(err)
	}
	for rows0.Next() {
		var n string
		if err := rows0.Scan(&n); err != nil {
			t.Fatal(err)
		}
		withRows[n] = true
	}
	if len(withRows) != 3 {
		t.Fatalf("partitions with rows: %v, want today's, yesterday's and the default", withRows)
	}

	// The pending index and the bucket index of each partition.
	partIndexes := func(parent string) map[string]string {
		out := map[string]string{} // partition -> its partial index
		rows, err := pool.Query(ctx, `
SELECT c.relname, i.relname FROM pg_inherits h
JOIN pg_class c ON c.oid = h.inhrelid
JOIN pg_index x ON x.indrelid = c.oid AND x.indpred IS NOT NULL
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_inherits ih ON ih.inhrelid = i.oid AND ih.inhparent = $1::regclass
WHERE h.inhparent = 'public.outbox'::regclass`, parent)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var part, idx string
			if err := rows.Scan(&part, &idx); err != nil {
				t.Fatal(err)
			}
			out[part] = idx
		}
		if len(out) < 4 {
			t.Fatalf("indexes of %s: %v", parent, out)
		}
		return out
	}
	pending, bucketIdx := partIndexes("public.outbox_pending_idx"), partIndexes("public.outbox_bucket_idx")
	today := "outbox_p" + time.Now().UTC().Format("20060102")
	var big int64
	if err := pool.QueryRow(ctx, `SELECT reltuples::bigint FROM pg_class WHERE relname = $1`, today).Scan(&big); err != nil || big < 1_000_000 {
		t.Fatalf("today's partition %s holds %d rows (%v)", today, big, err)
	}

	var inflight []int64
	if err := pool.QueryRow(ctx, `SELECT array_agg(id) FROM (SELECT id FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT 500) s`).Scan(&inflight); err != nil {
		t.Fatal(err)
	}
	blocked := []string{"agg-1", "agg-7", "agg-42"}

	// check: no partition with rows is scanned sequentially and, with want, every index read of
	// one is through its index in want (the pending or the bucket index), today's included.
	check := func(t *testing.T, what string, plan planNode, want map[string]string) {
		t.Helper()
		usedWanted := false
		plan.walk(func(n planNode) {
			if strings.Contains(n.NodeType, "Seq Scan") && withRows[n.RelationName] {
				t.Errorf("%s: Seq Scan on %s, a partition with rows", what, n.RelationName)
			}
			// The rows below the floors are read through the (txid, id) index (row_resume.go).
			below := strings.HasSuffix(n.IndexName, "_txid_id_idx")
			if withRows[n.RelationName] && strings.Contains(n.NodeType, "Index") && want != nil && n.IndexName != want[n.RelationName] && !below {
				t.Errorf("%s: %s read through %s, not its index %s", what, n.RelationName, n.IndexName, want[n.RelationName])
			}
			if n.RelationName == today && strings.Contains(n.NodeType, "Index") && n.IndexName == want[today] {
				usedWanted = true
			}
		})
		if want != nil && !usedWanted {
			b, _ := json.MarshalIndent(plan, "", " ")
			t.Errorf("%s: today's partition is not read through its index %s:\n%s", what, want[today], b)
		}
	}
	explain := func(t *testing.T, conn *pgx.Conn, sql string, args ...any) planNode {
		t.Helper()
		plan, _ := explainJSON(ctx, t, conn, sql, args...)
		return plan
	}

	for _, shards := range []int{1, 4} {
		for _, variant := range []struct {
			name              string
			inflight, blocked bool
		}{{"plain", false, false}, {"inflight", true, false}, {"blocked", false, true}, {"both", true, true}} {
			for _, mode := range []string{"custom", "generic"} {
				name := fmt.Sprintf("fetch/%d shards/%s/%s", shards, variant.name, mode)
				t.Run(name, func(t *testing.T) {
					var inf []int64
					var blk []string
					if variant.inflight {
						inf = inflight
					}
					if variant.blocked {
						blk = blocked
					}
					sql, args, err := FetchSQL(testTable, shards, 0, 500, inf, blk)
					if err != nil {
						t.Fatal(err)
					}
					// The relay's own statement, as it runs it.
					q := newQueries(testTable, shards, 500)
					buckets, _ := OwnedBuckets(shards, 0)
					if got, _ := q.fetchArgs(&resume{sharded: shards > 1}, buckets, inf, blk, ""); got != sql {
						t.Fatalf("FetchSQL is not the relay's statement:\n%s\n%s", got, sql)
					}
					conn, err := pgx.Connect(ctx, url)
					if err != nil {
						t.Fatal(err)
					}
					defer conn.Close(ctx)
					want := pending
					if shards > 1 {
						// A shard of several reads its buckets through the bucket index, on the
						// relay's session.
						want = bucketIdx
						if err := TuneFetchSession(ctx, conn); err != nil {
							t.Fatal(err)
						}
					}
					if mode == "generic" {
						if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
							t.Fatal(err)
						}
						if _, err := conn.Prepare(ctx, "relay_fetch", sql); err != nil {
							t.Fatal(err)
						}
						exec := "EXECUTE relay_fetch"
						if len(args) > 0 {
							lits := make([]string, len(args))
							for i, a := range args {
								lits[i] = arrayLiteral(a)
							}
							exec += "(" + strings.Join(lits, ", ") + ")"
						}
						check(t, name, explain(t, conn, exec), want)
						return
					}
					check(t, name, explain(t, conn, sql, args...), want)
				})
			}
		}
	}
	t.Run("mark", func(t *testing.T) {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		q := newQueries(testTable, 1, 500)
		now := time.Now()
		check(t, "mark", explain(t, conn, q.mark, inflight, now.Add(-time.Minute), now), nil)
		check(t, "record", explain(t, conn, q.record, inflight[:2], []time.Time{now, now}, []int32{1, 1},
			[]string{"e", "e"}, []bool{false, false}, now.Add(-time.Minute), now), nil)
		check(t, "stats", explain(t, conn, q.stats, 100000), pending)
		q4 := newQueries(testTable, 4, 500)
		b, _ := OwnedBuckets(4, 1)
		// A shard's, on the relay's session, bucket by bucket.
		if err := TuneFetchSession(ctx, conn); err != nil {
			t.Fatal(err)
		}
		check(t, "stats 4 shards", explain(t, conn, q4.stats, b, 100000), bucketIdx)
	})
}

// arrayLiteral writes an argument of the fetch as a SQL array literal (test values only).
func arrayLiteral(a any) string {
	var parts []string
	typ := ""
	switch v := a.(type) {
	case []int16:
		typ = "smallint[]"
		for _, x := range v {
			parts = append(parts, fmt.Sprint(x))
		}
	case []int64:
		typ = "bigint[]"
		for _, x := range v {
			parts = append(parts, fmt.Sprint(x))
		}
	case []string:
		typ = "text[]"
		for _, x := range v {
			parts = append(parts, `"`+x+`"`)
		}
	case int64:
		return fmt.Sprint(v)
	case string:
		return "'" + strings.ReplaceAll(v, "'", "''") + "'"
	case *string:
		if v == nil {
			return "NULL"
		}
		return "'" + *v + "'"
	}
	return "'{" + strings.Join(parts, ",") + "}'::" + typ
}

// TestFetchPlanAfterBurst: a backlog committed in one burst after a quiet spell meets the
// statistics of the quiet table, in which no row is pending. Planned with them, the fetch would
// read and sort the whole backlog for every batch; on the relay's session it still walks the
// pending index in id order, reading one batch.
func TestFetchPlanAfterBurst(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
SELECT 'order', 'a' || (g % 5000), 'Seq', '{}', now() FROM generate_series(1, 200000) AS g`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	// The burst: far more pending rows than the statistics know of, committed at once.
	if _, err := pool.Exec(ctx, `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'a' || (g % 5000), 'Seq', '{}' FROM generate_series(1, 100000) AS g`); err != nil {
		t.Fatal(err)
	}
	explain := func(conn *pgx.Conn) (planNode, string) {
		t.Helper()
		sql, args, err := FetchSQL(testTable, 1, 0, 500, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return explainJSON(ctx, t, conn, sql, args...)
	}
	shape := func(p planNode) (sorted, indexed bool) {
		p.walk(func(n planNode) {
			sorted = sorted || n.NodeType == "Sort" || n.NodeType == "Incremental Sort"
			// The partitions' indexes of outbox_pending_idx are named <partition>_id_idx.
			indexed = indexed || strings.HasSuffix(n.IndexName, "_id_idx") && !strings.HasSuffix(n.IndexName, "_txid_id_idx")
		})
		return sorted, indexed
	}

	plain, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)
	p, _ := explain(plain)
	sorted, _ := shape(p)
	t.Logf("on a plain session the planner sorts the backlog: %v", sorted)

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := TuneFetchSession(ctx, conn); err != nil {
		t.Fatal(err)
	}
	p, raw := explain(conn)
	if sorted, indexed := shape(p); sorted || !indexed {
		t.Fatalf("on the relay's session the fetch sorts (%v) or misses the pending index (%v):\n%s", sorted, !indexed, raw)
	}
}

// TestMarkPlanAfterBurst: the statistics of a quiet table (every row sent, analyzed) and then a
// burst of pending rows committed at once, before autovacuum analyzes again. The planner then
// believes the partial indexes (WHERE sent_at IS NULL) empty; with the mark spelled "sent_at IS
// NULL" it chose to scan a whole partial index of today's partition and filter on id, for every
// batch (make bench: a 2M burst drained at tens of events a second). The mark and the record
// must find their rows through the primary key, custom and generic plans alike.
func TestMarkPlanAfterBurst(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	today := "outbox_p" + time.Now().UTC().Format("20060102")
	if _, err := pool.Exec(ctx, `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
SELECT 'order', 'a' || (g % 5000), 'Seq', '{}', now() FROM generate_series(1, 20000) AS g;
ALTER TABLE `+today+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	insertBacklog(t, url, 300_000, 5000, "order") // the burst, not analyzed
	var inflight []int64
	if err := pool.QueryRow(ctx, `SELECT array_agg(id) FROM (SELECT id FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT 500) s`).Scan(&inflight); err != nil {
		t.Fatal(err)
	}
	var pkey string
	if err := pool.QueryRow(ctx, `SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = $1::regclass AND x.indisprimary`, today).Scan(&pkey); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	q := newQueries(testTable, 1, 500)
	now := time.Now()
	from, to := now.Add(-time.Minute), now.Add(time.Minute)
	lit := func(ts time.Time) string { return "'" + ts.UTC().Format(time.RFC3339Nano) + "'::timestamptz" }
	stmts := map[string]struct {
		sql  string
		args []any
		exec string // EXECUTE arguments for the generic plan
	}{
		"mark": {q.mark, []any{inflight, from, to}, arrayLiteral(inflight) + ", " + lit(from) + ", " + lit(to)},
		"record": {q.record, []any{inflight[:2], []time.Time{now, now}, []int32{1, 1}, []string{"e", "e"}, []bool{false, false}, from, to},
			"'{" + fmt.Sprint(inflight[0]) + "," + fmt.Sprint(inflight[1]) + "}'::bigint[], ARRAY[" + lit(now) + "," + lit(now) +
				"], '{1,1}'::int[], '{e,e}'::text[], '{f,f}'::bool[], " + lit(from) + ", " + lit(to)},
	}
	for name, st := range stmts {
		for _, mode := range []string{"custom", "generic"} {
			t.Run(name+"/"+mode, func(t *testing.T) {
				var plan planNode
				var raw string
				if mode == "custom" {
					plan, raw = explainJSON(ctx, t, conn, st.sql, st.args...)
				} else {
					if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
						t.Fatal(err)
					}
					defer conn.Exec(ctx, `RESET plan_cache_mode`) //nolint:errcheck
					if _, err := conn.Exec(ctx, `PREPARE s_`+name+` AS `+st.sql); err != nil {
						t.Fatal(err)
					}
					defer conn.Exec(ctx, `DEALLOCATE s_`+name) //nolint:errcheck
					plan, raw = explainJSON(ctx, t, conn, `EXECUTE s_`+name+`(`+st.exec+`)`)
				}
				viaPkey := false
				plan.walk(func(n planNode) {
					if n.RelationName != today {
						return
					}
					if n.IndexName == pkey {
						viaPkey = true
					} else if n.NodeType != "ModifyTable" {
						t.Errorf("%s reads today's partition with a %s (index %q), not its primary key", name, n.NodeType, n.IndexName)
					}
				})
				if !viaPkey {
					t.Errorf("%s does not read today's partition through %s:\n%s", name, pkey, raw)
				}
			})
		}
	}
}

// TestShardFetchIgnoresOtherShards: one shard of 8 stopped with 100,000 events pending that are
// older than everything else; another shard has 400. What the live shard's statements read must
// not grow with the stopped shard's backlog: its fetch and backlog measurement read their buckets
// only. The walk of the
// pending index in id order that the fetch used before is measured beside them, to show the
// stopped backlog is in its way. The observer is PostgreSQL's own count of the rows each
// statement's scans visited (EXPLAIN ANALYZE).
func TestShardFetchIgnoresOtherShards(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const shards, stoppedRows = 8, 100_000
	// The stopped shard 0's events first, then shard 1's: aggregates by their bucket.
	ins := `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', a, 'Seq', jsonb_build_object('pad', repeat('x', 150))
FROM generate_series(0, 40000000) AS g, LATERAL (SELECT 'agg-' || (g % 5000) AS a) x
WHERE ` + outboxdb.BucketOf("a") + ` % 8 = $1 LIMIT $2`
	if _, err := pool.Exec(ctx, ins, 0, stoppedRows); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, ins, 1, 400); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := TuneFetchSession(ctx, conn); err != nil {
		t.Fatal(err)
	}
	// analyze runs sql under EXPLAIN (ANALYZE, BUFFERS) in a transaction it rolls back and
	// returns EXPLAIN's output.
	analyze := func(what, sql string, args ...any) []byte {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		var raw []byte
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return raw
	}
	// visits returns, by PostgreSQL's account (analyze), the rows sql's scans visited (returned
	// or removed by a filter), the buffers the statement touched and the rows it returned.
	visits := func(what, sql string, args ...any) (visited, buffers int64, rows float64) {
		t.Helper()
		raw := analyze(what, sql, args...)
		type node struct {
			Type    string  `json:"Node Type"`
			Hit     int64   `json:"Shared Hit Blocks"`
			Read    int64   `json:"Shared Read Blocks"`
			Rows    float64 `json:"Actual Rows"`
			Loops   float64 `json:"Actual Loops"`
			Removed float64 `json:"Rows Removed by Filter"`
			Plans   []node  `json:"Plans"`
		}
		var out []struct{ Plan node }
		if err := json.Unmarshal(raw, &out); err != nil || len(out) != 1 {
			t.Fatalf("%s: explain output %s: %v", what, raw, err)
		}
		var walk func(n node)
		walk = func(n node) {
			if strings.HasSuffix(n.Type, "Scan") && n.Type != "Function Scan" && n.Type != "Subquery Scan" && n.Type != "CTE Scan" {
				// Actual Rows is per loop (rounded); the removed rows are the total.
				visited += int64(n.Rows*n.Loops + n.Removed)
			}
			for _, c := range n.Plans {
				walk(c)
			}
		}
		walk(out[0].Plan)
		return visited, out[0].Plan.Hit + out[0].Plan.Read, out[0].Plan.Rows
	}
	buckets, _ := OwnedBuckets(shards, 1)
	q := newQueries(testTable, shards, 500)
	fetch, args := q.fetchArgs(&resume{sharded: true}, buckets, nil, nil, "")
	fv, fb, rows := visits("fetch", fetch, args...)
	sv, sb, _ := visits("backlog", q.stats, buckets, 100000)
	walk := `SELECT ` + fetchColumns + ` FROM outbox WHERE sent_at IS NULL AND ` + outboxdb.BucketExpr +
		` = ANY($1::smallint[]) ORDER BY id LIMIT 400 FOR UPDATE`
	wv, wb, _ := visits("walk", walk, buckets)
	t.Logf("shard 1 of 8, 400 pending behind shard 0's %d: fetch visited %d rows (%d buffers, %v rows returned), "+
		"backlog %d (%d buffers), walk in id order %d (%d buffers)", stoppedRows, fv, fb, rows, sv, sb, wv, wb)
	if rows != 400+1 {
		t.Errorf("the fetch returned %v rows, want shard 1's 400 and its position row", rows)
	}
	// Shard 1's fetch and backlog visit its 400 rows (the backlog twice: the count and the
	// newest row of each bucket); the walk passes the stopped shard's 100,000.
	if fv > 400 || sv > 1000 {
		t.Errorf("shard 1's fetch visited %d rows and its backlog %d: they depend on shard 0's backlog", fv, sv)
	}
	if wv < stoppedRows {
		t.Errorf("the walk in id order visited %d rows, fewer than the stopped shard's %d: the test proves nothing", wv, stoppedRows)
	}
	var n int64
	var age float64
	var first, lastCounted, last *int64
	if err := conn.QueryRow(ctx, q.stats, buckets, 100000).Scan(&n, &first, &lastCounted, &last, &age); err != nil {
		t.Fatal(err)
	}
	if n != 400 || last == nil || age <= 0 {
		t.Errorf("shard 1's backlog: %d pending, last id %v, oldest %.3fs; want 400", n, last, age)
	}
	// Past its limit a shard's count is extrapolated bucket by bucket: shard 0, 100 rows a bucket.
	stopped, _ := OwnedBuckets(shards, 0)
	if err := conn.QueryRow(ctx, q.stats, stopped, 3200).Scan(&n, &first, &lastCounted, &last, &age); err != nil {
		t.Fatal(err)
	}
	b := outboxdb.Backlog{Counted: n, FirstID: first, LastCountedID: lastCounted, LastID: last, Limit: 3200}
	if p := b.Pending(); p < stoppedRows*9/10 || p > stoppedRows*11/10 {
		t.Errorf("shard 0's backlog counted up to 3,200: estimated %d, want %d within 10%%", p, stoppedRows)
	}

	// An idle poll: every floor at the id sequence's value, as after a fetch that read its buckets
	// to their end with nothing committed since. It reads no bucket's index (withPosition); with
	// the floors one below that value it must read every bucket's.
	var seq int64
	if err := conn.QueryRow(ctx, `SELECT pg_sequence_last_value('outbox_id_seq')`).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	scans := func(floor int64) int64 {
		t.Helper()
		pos := &resume{sharded: true}
		for i := range pos.floors {
			pos.floors[i] = floor
		}
		xmax := strconv.FormatInt(1<<40, 10) // a watch with nothing open: no row has such a txid
		pos.xmax, pos.xip = &xmax, []string{}
		sql, args := q.fetchArgs(pos, buckets, nil, nil, "")
		raw := analyze("idle poll", sql, args...)
		var out []struct{ Plan planNode }
		if err := json.Unmarshal(raw, &out); err != nil || len(out) != 1 {
			t.Fatalf("explain output %s: %v", raw, err)
		}
		var loops int64
		out[0].Plan.walk(func(n planNode) {
			// Every index scan but the watch's, through the (txid, id) index.
			if n.IndexName != "" && !strings.Contains(n.IndexName, "txid") {
				loops += int64(n.Loops)
			}
		})
		return loops
	}
	idle, below := scans(seq), scans(seq-1)
	t.Logf("an idle poll of shard 1 of 8 (%d buckets): %d index scans; with the floors one below the sequence, %d", len(buckets), idle, below)
	if below < int64(len(buckets)) {
		t.Errorf("with the floors below the sequence's value the fetch ran %d index scans, want one per bucket (%d) at least: the test proves nothing", below, len(buckets))
	}
	if idle != 0 {
		t.Errorf("an idle poll ran %d index scans besides the watch's, want none", idle)
	}
}
