package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// openBatch runs a round trip as the relay does: the open statement first (it takes the
// transaction's id), then the statements after (writes, as the outcome of earlier batches).
func openBatch(ctx context.Context, t *testing.T, conn *pgx.Conn, q snapQueries, from snapMark, after ...string) (*snapRange, string) {
	t.Helper()
	var pb pgx.Batch
	var raw string
	pb.Queue(`SELECT pg_current_snapshot()::text`).QueryRow(func(r pgx.Row) error { return r.Scan(&raw) })
	var rng *snapRange
	var same bool // the check of the session's mark, not read here
	pb.Queue(q.openFor(from, false), nullable(from.text), nil, nullableMark(from.floor), nil, nil, "").QueryRow(func(r pgx.Row) error {
		var err error
		rng, err = scanRange(r, &cursorGroup{}, from, 0, false, &same)
		return err
	})
	for _, sql := range after {
		pb.Queue(sql)
	}
	if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
		t.Fatal(err)
	}
	return rng, raw
}

// readBatch reads every row of rng as the relay's fetches do (unsharded, a fetch larger than
// these tests' batches), and returns their ids.
func readBatch(ctx context.Context, t *testing.T, conn *pgx.Conn, q snapQueries, rng *snapRange) []int64 {
	t.Helper()
	var ids []int64
	read := func(sql string, args ...any) {
		b := &batch{}
		rows, err := conn.Query(ctx, sql, args...)
		if err == nil {
			err = scanInto(rows, b)
		}
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(b.rows, func(x, y row) int { return int(x.id - y.id) })
		for _, r := range b.rows {
			ids = append(ids, r.id)
		}
	}
	if !rng.done && rng.last < rng.bound {
		read(q.fetchOpen, rng.to.text, rng.last, rng.xip, rng.bound)
		rng.last = rng.bound
	}
	if !rng.done && rng.last < rng.hi {
		read(q.fetch, rng.to.text, rng.last, rng.bound, rng.hi, rng.from.text)
		rng.last = rng.hi
	}
	return ids
}

// boundsFixture is a fresh outbox database, the snapshot statements of an unsharded relay
// (fetches of 100), and a connection of the relay's to run them on; closed by the test's end,
// whose context bounds them to a minute.
func boundsFixture(t *testing.T) (context.Context, *pgxpool.Pool, snapQueries, *pgx.Conn) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	relayConn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relayConn.Close(context.Background()) })
	return ctx, pool, newSnapQueries(testTable, false, 100), relayConn
}

// TestSnapshotBoundsWidenedToNextTransaction (snapshot tracking): the event of a transaction
// that took its id before the relay's snapshot and is still in progress, with no transaction
// ended after it, lies below the snapshot's floor, yet the snapshot does not list it (PostgreSQL
// lists only transactions below its xmax, the latest ended one plus one). The relay widens the
// snapshot to list every transaction up to the next id to be assigned, so the batch after it
// finds the event by its transaction id. Without the widening the event would be skipped for
// good: checked here on the statements the relay runs, with the dangerous case shown to have
// happened.
func TestSnapshotBoundsWidenedToNextTransaction(t *testing.T) {
	ctx, pool, q, relayConn := boundsFixture(t)
	insert := `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'Seq', '{}') RETURNING id, txid::text`

	// Published already: a batch from the start.
	first, _ := openBatch(ctx, t, relayConn, q, unmarked(""))
	if !first.done {
		t.Fatalf("first batch of an empty table not empty: %+v", first)
	}
	writer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = writer.Rollback(ctx) }()
	var early int64
	var xid string
	if err := writer.QueryRow(ctx, insert).Scan(&early, &xid); err != nil {
		t.Fatal(err)
	}
	// The relay's round trip opens (it reads the next id, above the writer's), then writes (its
	// transaction takes that id): nothing ended after the writer took its id.
	s1, raw := openBatch(ctx, t, relayConn, q, first.to, `SELECT pg_current_xact_id()`)
	rawXmax, _, err := parseSnapshot(raw)
	if err != nil {
		t.Fatal(err)
	}
	var above, listed bool
	if err := pool.QueryRow(ctx, `SELECT $1::xid8 >= $2::xid8, NOT pg_visible_in_snapshot($1::xid8, $3::pg_snapshot)
  AND $1::xid8 = ANY(ARRAY(SELECT pg_snapshot_xip($3::pg_snapshot)))`, xid, rawXmax, s1.to.text).Scan(&above, &listed); err != nil {
		t.Fatal(err)
	}
	if !above {
		t.Fatalf("precondition: the writer's transaction %s is below the raw snapshot's xmax %s (a transaction ended after it)", xid, rawXmax)
	}
	if !listed || early > s1.to.floor {
		t.Fatalf("the widened snapshot %s does not list the writer's transaction %s (event %d, floor %d)", s1.to.text, xid, early, s1.to.floor)
	}
	if got := readBatch(ctx, t, relayConn, q, s1); len(got) > 0 {
		t.Fatalf("the batch up to the writer's snapshot has events %v", got)
	}
	var late int64
	if err := writer.QueryRow(ctx, insert).Scan(&late, &xid); err != nil {
		t.Fatal(err)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	s2, _ := openBatch(ctx, t, relayConn, q, s1.to)
	got := readBatch(ctx, t, relayConn, q, s2)
	if want := []int64{early, late}; !slices.Equal(got, want) {
		t.Fatalf("batch after the writer committed: events %v, want %v (snapshots %s -> %s, floor %d, bound %d, ceiling %d)",
			got, want, s1.to.text, s2.to.text, s1.to.floor, s2.bound, s2.hi)
	}
	t.Logf("transaction %s, at or above the raw xmax %s, listed by the widened snapshot %s; its events %v found after it committed",
		xid, rawXmax, s1.to.text, got)
}

// TestOpenTakesNoTransactionID (snapshot tracking): the open statement reads the next
// transaction id instead of taking one, so a round trip that only opens and fetches leaves its
// transaction without an id (asked of PostgreSQL in the same transaction), the new snapshot's
// floor is its ceiling, and it lists every transaction in progress up to the next id, that of a
// writer which took its id after the relay's statement included (its event above the floor). A
// second open statement in the same transaction would read the counter its first one read
// (age() keeps it for the transaction), older than its own ceiling: its floor is not known.
func TestOpenTakesNoTransactionID(t *testing.T) {
	ctx, pool, q, relayConn := boundsFixture(t)
	insert := `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'Seq', '{}') RETURNING id, txid::text::int8`
	// begin starts a writer that appends an event and stays open (rolled back at the test's end
	// unless committed), returning the event's id and its transaction's.
	begin := func() (tx pgx.Tx, id, xid int64) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		if err := tx.QueryRow(ctx, insert).Scan(&id, &xid); err != nil {
			t.Fatal(err)
		}
		return tx, id, xid
	}
	first, _ := openBatch(ctx, t, relayConn, q, unmarked(""))
	writer, early, earlyXid := begin()

	open := func(from snapMark, twice bool) (rngs []*snapRange, ownXid *int64) {
		var pb pgx.Batch
		var same bool
		n := 1
		if twice {
			n = 2
		}
		for range n {
			pb.Queue(q.openFor(from, false), nullable(from.text), nil, nullableMark(from.floor), nil, nil, "").QueryRow(func(r pgx.Row) error {
				rng, err := scanRange(r, &cursorGroup{}, from, 0, false, &same)
				rngs = append(rngs, rng)
				return err
			})
		}
		pb.Queue(`SELECT pg_current_xact_id_if_assigned()::text::int8`).QueryRow(func(r pgx.Row) error { return r.Scan(&ownXid) })
		if err := relayConn.SendBatch(ctx, &pb).Close(); err != nil {
			t.Fatal(err)
		}
		return rngs, ownXid
	}
	rngs, own := open(first.to, false)
	s1 := rngs[0]
	if own != nil {
		t.Fatalf("the open statement's transaction took transaction id %d", *own)
	}
	if s1.to.floor < 0 || s1.to.floor != s1.to.ceil {
		t.Fatalf("a fresh open statement's floor %d is not its ceiling %d", s1.to.floor, s1.to.ceil)
	}
	_, xip, err := parseSnapshot(s1.to.text)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(xip, strconv.FormatInt(earlyXid, 10)) {
		t.Fatalf("the snapshot %s does not list the writer's transaction %d in progress", s1.to.text, earlyXid)
	}
	// A writer that takes its id now takes the widened xmax or one above it, and draws its
	// event's id above the floor.
	late, lateID, lateXid := begin()
	var atOrAbove bool
	if err := pool.QueryRow(ctx, `SELECT $1::int8::text::xid8 >= pg_snapshot_xmax($2::text::pg_snapshot)`, lateXid, s1.to.text).Scan(&atOrAbove); err != nil {
		t.Fatal(err)
	}
	if !atOrAbove || lateID <= s1.to.floor {
		t.Fatalf("a writer after the open statement: transaction %d (at or above the widened xmax of %s: %v), event %d against the floor %d",
			lateXid, s1.to.text, atOrAbove, lateID, s1.to.floor)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rngs, own = open(s1.to, true)
	if own != nil {
		t.Fatalf("two open statements' transaction took transaction id %d", *own)
	}
	if rngs[0].to.floor != rngs[0].to.ceil || rngs[1].to.floor >= 0 {
		t.Fatalf("two open statements in one transaction: floors %d and %d, ceilings %d and %d (want the first's floor at its ceiling, the second's not known)",
			rngs[0].to.floor, rngs[1].to.floor, rngs[0].to.ceil, rngs[1].to.ceil)
	}
	if got := readBatch(ctx, t, relayConn, q, rngs[0]); !slices.Equal(got, []int64{early, lateID}) {
		t.Fatalf("the batch after both writers committed: events %v, want %v", got, []int64{early, lateID})
	}
	t.Logf("snapshot %s (floor %d) took no transaction id; writers %d (event %d) listed and %d (event %d) above the floor",
		s1.to.text, s1.to.floor, earlyXid, early, lateXid, lateID)
}

// TestSnapshotShardReadsOwnRows (snapshot tracking): with four shards' events interleaved, a
// shard's fetch reads its own buckets' rows only, through the bucket index: every row the
// index scans hand to the executor is one it returns, none is filtered out (EXPLAIN ANALYZE), so its cost does not
// grow with the other shards' events. Before, each shard walked the id index over every
// shard's rows and filtered them (four rows read per row published with four shards).
func TestSnapshotShardReadsOwnRows(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn := relaySession(ctx, t, url)
	const size = 2000
	q := newSnapQueries(testTable, true, size)
	buckets, err := OwnedBuckets(4, 0)
	if err != nil {
		t.Fatal(err)
	}
	from, _ := openBatch(ctx, t, conn, newSnapQueries(testTable, false, size), unmarked(""))
	// No ANALYZE: a backlog written just now has no statistics yet.
	insertBacklog(t, url, 100_000, 5_000, "order")
	var pb pgx.Batch
	var rng *snapRange
	var same bool // the check of the session's mark, not read here
	pb.Queue(q.openFor(from.to, false), from.to.text, nil, from.to.floor, nil, nil, buckets, "").QueryRow(func(r pgx.Row) error {
		var err error
		rng, err = scanRange(r, &cursorGroup{}, from.to, 0, false, &same)
		return err
	})
	if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
		t.Fatal(err)
	}
	var own int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE `+outboxdb.BucketExpr+` = ANY($1)`, buckets).Scan(&own); err != nil {
		t.Fatal(err)
	}
	// A window of about a fetch of this shard's rows, as the relay adapts it.
	upTo := rng.last + size*outboxdb.Buckets/int64(len(buckets))
	var raw []byte
	if err := conn.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+q.fetch,
		rng.to.text, rng.last, rng.bound, upTo, rng.from.text, buckets).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var out []struct {
		Plan analyzedNode
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out) != 1 {
		t.Fatalf("explain output %s: %v", raw, err)
	}
	var scanned, removed, returned float64
	var indexes []string
	var walk func(n analyzedNode)
	walk = func(n analyzedNode) {
		if n.IndexName != "" {
			indexes = append(indexes, n.IndexName)
			scanned += n.ActualRows * n.ActualLoops
			removed += (n.RemovedByFilter + n.RemovedByRecheck) * n.ActualLoops
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(out[0].Plan)
	returned = out[0].Plan.ActualRows
	others := indexesNotOf(ctx, t, pool, indexes, "outbox_bucket_idx")
	if len(indexes) == 0 || len(others) > 0 {
		t.Fatalf("the sharded fetch reads indexes %v; want the bucket index's partitions only. Plan: %s", others, raw)
	}
	// EXPLAIN gives a scan's rows per loop, rounded: the sum is approximate, filtered rows are not.
	if returned == 0 || removed != 0 || scanned > returned*1.1 {
		t.Fatalf("the sharded fetch returned %.0f rows, its index scans produced about %.0f and filtered out %.0f: it reads other shards' rows. Plan: %s",
			returned, scanned, removed, raw)
	}
	t.Logf("shard 0 of 4 (%d of 100,000 events): a window of %d ids read %.0f rows, all its own, through %s; %d shared buffers touched",
		own, upTo-rng.last, returned, fmt.Sprint(slices.Compact(slices.Sorted(slices.Values(indexes)))), out[0].Plan.SharedHit+out[0].Plan.SharedRead)
}

// analyzedNode is a node of EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON).
type analyzedNode struct {
	NodeType         string         `json:"Node Type"`
	IndexName        string         `json:"Index Name"`
	ActualRows       float64        `json:"Actual Rows"`
	ActualLoops      float64        `json:"Actual Loops"`
	RemovedByFilter  float64        `json:"Rows Removed by Filter"`
	RemovedByRecheck float64        `json:"Rows Removed by Index Recheck"`
	SharedHit        int64          `json:"Shared Hit Blocks"`
	SharedRead       int64          `json:"Shared Read Blocks"`
	Plans            []analyzedNode `json:"Plans"`
}

// TestSnapshotOpenTransactionsByTxid checks that the events of the transactions in progress at a
// batch's older snapshot are read through the (txid, id) index, whatever the statistics say. A
// backlog written by one transaction and analyzed has statistics in which every row shares one
// txid, so any txid looks common; with txid equated to the looked-up one, the planner walked the
// id index filtering every row by txid instead (a 4-shard drain spent 5 s of PostgreSQL time
// reading 580k pages for no row). Checked sharded and not, with custom and generic plans, for an
// id the table does not hold and for the backlog's own.
func TestSnapshotOpenTransactionsByTxid(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var txid string
	if err := pool.QueryRow(ctx, `WITH ins AS (INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'a' || (g % 5000), 'Seq', '{}' FROM generate_series(1, 100000) AS g RETURNING txid)
SELECT min(txid)::text FROM ins`).Scan(&txid); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	conn := relaySession(ctx, t, url)
	var snap string
	if err := conn.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&snap); err != nil {
		t.Fatal(err)
	}
	buckets, err := OwnedBuckets(4, 0)
	if err != nil {
		t.Fatal(err)
	}
	const size = 2000
	for _, mode := range []string{"auto", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, false)`, mode); err != nil {
			t.Fatal(err)
		}
		for _, sharded := range []bool{false, true} {
			q := newSnapQueries(testTable, sharded, size)
			for _, xip := range [][]string{{"1"}, {txid}} {
				args := []any{snap, int64(0), xip, int64(1 << 40)}
				if sharded {
					args = append(args, buckets)
				}
				var raw []byte
				if err := conn.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+q.fetchOpen, args...).Scan(&raw); err != nil {
					t.Fatal(err)
				}
				var out []struct{ Plan analyzedNode }
				if err := json.Unmarshal(raw, &out); err != nil || len(out) != 1 {
					t.Fatalf("explain output %s: %v", raw, err)
				}
				var indexes []string
				var removed float64
				var walk func(n analyzedNode)
				walk = func(n analyzedNode) {
					if n.IndexName != "" {
						indexes = append(indexes, n.IndexName)
						removed += n.RemovedByFilter * n.ActualLoops
					}
					for _, c := range n.Plans {
						walk(c)
					}
				}
				walk(out[0].Plan)
				others := indexesNotOf(ctx, t, pool, indexes, "outbox_txid_idx")
				what := fmt.Sprintf("plan_cache_mode %s, sharded %v, xip %v", mode, sharded, xip)
				if len(indexes) == 0 || len(others) > 0 {
					t.Fatalf("%s: the fetch reads indexes %v; want the txid index's partitions only. Plan: %s", what, others, raw)
				}
				// Sharded, the other shards' rows among the transaction's first are filtered out
				// (about 3 for each of the shard's): a bounded read, not a walk of the table.
				if limit := map[bool]float64{false: 0, true: 4 * size}[sharded]; removed > limit {
					t.Fatalf("%s: %.0f rows filtered out, want at most %.0f. Plan: %s", what, removed, limit, raw)
				}
				t.Logf("%s: %.0f rows returned through the txid index, %.0f filtered out", what, out[0].Plan.ActualRows, removed)
			}
		}
	}
}

// relaySession connects to url with the relay's session settings (outboxdb.PlanInIDOrder).
func relaySession(ctx context.Context, t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, outboxdb.PlanInIDOrder); err != nil {
		t.Fatal(err)
	}
	return conn
}

// indexesNotOf returns the indexes among names that are not partitions of the partitioned
// index parent.
func indexesNotOf(ctx context.Context, t *testing.T, pool *pgxpool.Pool, names []string, parent string) []string {
	t.Helper()
	var others []string
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(n), '{}') FROM unnest($1::text[]) AS n
WHERE NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = n::regclass AND h.inhparent = $2::regclass)`,
		names, parent).Scan(&others); err != nil {
		t.Fatal(err)
	}
	return others
}

// The open statement's variants for a known from and floor (openKnown, and openFused, which the
// relay sends in the steady state with the fetch of the batch's first rows) answer as the open
// statement does, for the unsharded and the sharded shapes: all run in one round trip, so in one
// transaction with one transaction id of the relay's, with events committed since from, a writer
// in progress at from that commits after it, and a writer still in progress; the rows must be
// equal, column by column, but for the floor (known only to the statement that took the
// transaction's id, the first) and the column openFused leaves to its fetch. And no variant is
// sent where from or its floor is not known (openFor).
func TestOpenKnownAgreesWithOpen(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	relayConn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer relayConn.Close(context.Background())
	insert := `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'Seq', '{}')`
	q := newSnapQueries(testTable, false, 100)
	known := snapMark{text: "1:1:", floor: 0}
	for _, fused := range []bool{false, true} {
		if q.openFor(unmarked(""), fused) != q.open || q.openFor(unmarked("1:1:"), fused) != q.open {
			t.Fatalf("fused %v: openFor sends a variant where from or its floor is not known", fused)
		}
	}
	if q.openFor(known, false) != q.openKnown || q.openFor(known, true) != q.openFused {
		t.Fatal("openFor does not send openKnown, or openFused for a fused fetch, where from and its floor are known")
	}

	// open begins a writer's transaction that has appended one event; the test rolls back what
	// it leaves open.
	open := func() pgx.Tx {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		if _, err := tx.Exec(ctx, insert); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	inProgressAtFrom := open()
	first, _ := openBatch(ctx, t, relayConn, q, unmarked(""))
	from := first.to
	if _, xip, err := parseSnapshot(from.text); err != nil || from.floor < 0 || len(xip) == 0 {
		t.Fatalf("precondition: from %+v has no floor or no transaction in progress", from)
	}
	for range 3 {
		if _, err := pool.Exec(ctx, insert); err != nil {
			t.Fatal(err)
		}
	}
	if err := inProgressAtFrom.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	open() // still open at the open statements

	buckets, err := OwnedBuckets(4, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, shape := range []struct {
		name string
		q    snapQueries
		args []any
	}{
		{"unsharded", q, []any{from.text, nil, from.floor, nil, nil}},
		{"sharded", newSnapQueries(testTable, true, 100), []any{from.text, nil, from.floor, nil, nil, buckets}},
	} {
		// Each order in one round trip: the first statement takes the transaction's id, so its
		// ceiling is the new snapshot's floor; the others find the id taken, and their floor is
		// not known. Every other column must be equal, but for openFused's lowest id of the
		// transactions in progress at from, which it leaves to its fetch (always NULL).
		for _, order := range [][3]string{{shape.q.open, shape.q.openKnown, shape.q.openFused}, {shape.q.openFused, shape.q.openKnown, shape.q.open}} {
			var rows [3][]any
			var pb pgx.Batch
			for i, sql := range order {
				pb.Queue(sql, slices.Concat(shape.args, []any{""})...).QueryRow(func(r pgx.Row) error {
					var text, done string
					var floor, ceil, byTxid, byXip, unsent *int64
					var same bool
					if err := r.Scan(&text, &floor, &ceil, &byTxid, &byXip, &unsent, &done, &same); err != nil {
						return err
					}
					rows[i] = []any{text, orDash(floor), orDash(ceil), orDash(byTxid), orDash(byXip), orDash(unsent), done}
					return nil
				})
			}
			if err := relayConn.SendBatch(ctx, &pb).Close(); err != nil {
				t.Fatalf("%s: %v", shape.name, err)
			}
			if rows[0][1] != rows[0][2] || rows[0][1] == "-" {
				t.Errorf("%s: the first open statement of its transaction answered floor %v, want its ceiling %v", shape.name, rows[0][1], rows[0][2])
			}
			for i := 1; i < 3; i++ {
				if rows[i][1] != "-" {
					t.Errorf("%s: an open statement after the transaction took its id answered floor %v, want none (not known)", shape.name, rows[i][1])
				}
				rows[i][1] = rows[0][1]
			}
			fusedAt := 2
			if order[0] == shape.q.openFused {
				fusedAt = 0
			}
			if rows[fusedAt][4] != "-" {
				t.Errorf("%s: openFused answered the lowest id of the transactions in progress at from: %v", shape.name, rows[fusedAt])
			}
			rows[fusedAt][4] = rows[1][4]
			if !slices.Equal(rows[0], rows[1]) || !slices.Equal(rows[1], rows[2]) {
				t.Errorf("%s: in the order open, openKnown, openFused or its reverse, they answered %v", shape.name, rows)
			}
			if rows[1][4] == "-" {
				t.Errorf("%s: precondition: no lowest id of the transactions in progress at from (%v)", shape.name, rows[1])
			}
			t.Logf("%s: all answered %v", shape.name, rows[1])
		}
	}
}

// orDash renders a nullable column for comparison.
func orDash(v *int64) any {
	if v == nil {
		return "-"
	}
	return *v
}

// TestFusedOpenReadsTransactionsInProgress (snapshot tracking): in the steady state the relay
// opens a batch with openFused, which does not look up the events of the transactions in progress
// at the batch's start, and the fetch in the same round trip reads them. Driven through
// snapRoundTrip as the loop sends it, unsharded and sharded: a batch whose only events belong to a
// transaction in progress at its start, all at or below the start's floor (the case where the
// bounds alone would call the batch empty); then one with events on both sides of the floor; then
// an empty one. The answer is checked against the table: every event in id order, none twice.
func TestFusedOpenReadsTransactionsInProgress(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	insert := `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'E', '{}') RETURNING id`
	all, err := OwnedBuckets(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, sharded := range []bool{false, true} {
		r, err := New(testConfig(url, []string{"127.0.0.1:9"}, "fused"))
		if err != nil {
			t.Fatal(err)
		}
		r.session = "fused-test"
		conn := relaySession(ctx, t, url)
		if _, err := conn.Exec(ctx, `SELECT set_config('outbox.relay_session', $1, false)`, r.session); err != nil {
			t.Fatal(err)
		}
		first, _ := openBatch(ctx, t, conn, newSnapQueries(testTable, false, 100), unmarked(""))
		g := &cursorGroup{buckets: all, snap: first.to}
		st := &snapState{groups: []*cursorGroup{g}, win: int64(r.snapFetchSize())}
		st.setQueries(r, sharded)
		// round opens the next batch and fetches its first rows, as the loop does; the batch
		// must be read whole in that round trip (these batches are small).
		round := func(name string) []int64 {
			t.Helper()
			into := r.getBatch()
			if err := r.snapRoundTrip(conn, nil, st, nil, stepOpen, nil, into); err != nil {
				t.Fatalf("sharded %v, %s: %v", sharded, name, err)
			}
			if !st.rng.done || !into.pos.complete {
				t.Fatalf("sharded %v, %s: the batch was not read whole in its round trip: %+v", sharded, name, st.rng)
			}
			var ids []int64
			for _, rw := range into.rows {
				ids = append(ids, rw.id)
			}
			return ids
		}
		writer := func() (pgx.Tx, int64) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			var id int64
			if err := tx.QueryRow(ctx, insert, "open").Scan(&id); err != nil {
				t.Fatal(err)
			}
			return tx, id
		}
		if ids := round("catch up"); len(ids) != 0 {
			t.Fatalf("sharded %v: a batch of nothing new holds %v", sharded, ids)
		}
		// A writer in progress across a batch's start, with no event after it.
		tx, early := writer()
		if ids := round("writer open"); len(ids) != 0 {
			t.Fatalf("sharded %v: the batch while the writer is open holds %v", sharded, ids)
		}
		from := st.rng.to
		if _, xip, err := parseSnapshot(from.text); err != nil || len(xip) == 0 || from.floor < early {
			t.Fatalf("precondition: the batch's end %+v does not list the writer or lies below its event %d", from, early)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		ids := round("only the writer's events, below the floor")
		if !slices.Equal(ids, []int64{early}) {
			t.Fatalf("sharded %v: the batch after the writer committed holds %v, want [%d] (from %+v, to %+v)", sharded, ids, early, from, st.rng.to)
		}
		// Events on both sides of the floor: the open writer's, and one committed after.
		tx, early = writer()
		round("writer open again")
		var late, mid int64
		if err := tx.QueryRow(ctx, insert, "open").Scan(&late); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, insert, "other").Scan(&mid); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if ids := round("both sides of the floor"); !slices.Equal(ids, []int64{early, late, mid}) {
			t.Fatalf("sharded %v: the batch holds %v, want %v", sharded, ids, []int64{early, late, mid})
		}
		if ids := round("nothing new"); len(ids) != 0 {
			t.Fatalf("sharded %v: a batch of nothing new holds %v", sharded, ids)
		}
		t.Logf("sharded %v: the events of a transaction in progress at a batch's start read by openFused's round trip, alone and with later ones", sharded)
	}
}
