package relay

import (
	"strconv"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// snapQueries holds the statements of snapshot tracking for one table and layout (migration
// 00007_snapshot_tracking.sql, docs/architecture.md "Tracking progress"). Snapshots travel as
// text (xmin:xmax:xip,...), transaction ids as decimal text.
//
// A batch is every event committed in a newer snapshot (to) and not in an older one (from),
// published in id order: with the writer's per-aggregate lock, the ids of one aggregate follow
// commit order. Like PgQ's batch_event_sql, the events of the transactions still open at from
// are found by their ids (xip(from)) up to from's floor, and every other event as one id range
// above it (snapRange), so one long transaction neither stalls nor widens the others.
type snapQueries struct {
	// open ($1 from or NULL, $2 the target or NULL for a new snapshot, $3 floor(from), $4 and $5
	// floor and ceil of the target, [$6 buckets], then the session's token) returns the batch's
	// snapshot, widened to list every transaction below the next transaction id as in progress
	// (migration 00008), its floor and ceil (for a target whose ceil is not known, the sequence's
	// value now, above it too); where
	// floor(from) is not known (NULL), the lowest id of the events of transactions that began
	// after from, found by the transaction-id index; then the lowest id of the events of those in
	// progress at from; for from NULL (the first batch) the lowest unsent id; and the check of
	// the session's mark, which the round trip would otherwise send as a statement of its own.
	//
	// It comes before anything in its round trip takes a transaction id, and takes none itself:
	// it reads the next one to be assigned after reading the ceiling, so that the ceiling of a
	// new snapshot is its floor too (openSQL): every event of a transaction at or above the
	// widened xmax has an id above it. Where the transaction had its id before (a claim to be
	// woken comes first), the floor is the one the floor statement read first in the round trip,
	// or else not known (NULL: the next batch finds its bound by the transaction-id index).
	open string
	// floor sets the transaction's outbox.floor to the id sequence's value, first in a round trip
	// where something takes the transaction's id before the open statement.
	floor string
	// openKnown is open for a from and a floor(from) both known, the steady state: its plan holds
	// neither the read of the lowest unsent id nor the transaction-id lookup for an unknown floor,
	// which open skips at run time then but initializes at every execution (about a third of the
	// relay backend's CPU at 500 events/s went to starting executors; docs/architecture.md, "The
	// relay loop"). Same parameters and columns, those two NULL.
	openKnown string
	// openFused is openKnown for a batch whose first rows the same round trip fetches
	// (queueFusedFetch): that fetch reads the events of the transactions in progress at from
	// itself, so the statement does not look up the lowest of their ids either, and reads no table
	// at all. Same parameters and columns, that one NULL too (scanRange then leaves it to the fetch
	// to tell whether the batch is empty).
	openFused string
	// fetch ($1 to, $2 after id, $3 bound, $4 up to id, $5 from, [$6 buckets]) returns the next
	// rows, in id order, above the bound, of the transactions committed in to and not in from.
	// Sharded, it reads each bucket's rows through the bucket index, at most a fetch each, and
	// the relay merges them.
	fetch string
	// fetchOpen ($1 to, $2 after id, $3 xip(from), $4 bound, [$5 buckets]) returns the next rows
	// up to the bound of each transaction open at from that to shows committed, each in id order
	// through the (txid, id) index, so that a large one is read in chunks; the relay merges them.
	fetchOpen string
	// fetchFused ($1 after id, $2 up to id or NULL, $3 from, [$4 buckets]) and fetchOpenFused
	// ($1 after id, $2 xip(from), $3 bound, [$4 buckets]) are fetch and fetchOpen in the round
	// trip of the open statement: they read the new snapshot and its ceiling from the session,
	// where the open statement leaves them.
	fetchFused, fetchOpenFused string
	// first ($1 to, $2 after id, $3 up to id, [$4 buckets]) returns the next rows of the first
	// batch: every unsent row committed in to.
	first string
	// advance ($1 cursor row, $2 snap, $3 next_snap, $4 last_id, $5 floor(snap), $6 and $7 floor
	// and ceil of next_snap) records the position.
	advance string
	// park copies failed and held-back rows into <table>_parked ($1 ids, $2 created_at,
	// $3 attempts, $4 errors) and returns the aggregate of each row it parked.
	park string
	// parkedFetch ($1 aggregate ids) returns the parked events of those aggregates in id order.
	parkedFetch string
	// unpark deletes published parked events ($1 ids), returning their aggregates; parkedRecord records attempts and error
	// of parked events that failed again ($1 ids, $2 increments, $3 errors).
	unpark, parkedRecord string
	// parkedLoad ($1 buckets) counts the parked events per aggregate.
	parkedLoad string
	// quiet ($1 floor of the last snapshot, $2 its xip) reports whether no event can have been
	// committed since that snapshot: the id sequence has not passed its floor and every
	// transaction it listed in progress still is. Read without a transaction id (see
	// Relay.quietSince).
	quiet string
	// deadLettered records events published to the dead-letter topic ($1 ids, $2 event ids,
	// $3 aggregate ids, $4 errors).
	deadLettered string
}

func newSnapQueries(t outboxdb.Table, sharded bool, batchSize int) snapQueries {
	cursor, parked := t.Derived("relay_cursor"), t.Derived("parked")
	var q snapQueries
	bucketParam := func(n int) string {
		if !sharded {
			return ""
		}
		return ` AND ` + outboxdb.BucketExpr + ` = ANY($` + strconv.Itoa(n) + `::smallint[])`
	}
	limit := ` ORDER BY id LIMIT ` + strconv.Itoa(batchSize)
	// oneTxid selects the rows of the transaction x.txid in id order, through the (txid, id)
	// index whatever the statistics say: a backlog written by few transactions makes any txid
	// look common, and the planner walked the id index filtering every row by txid instead
	// (35k pages read per fetch, for no row, measured with 4 shards). With txid bounded by a range
	// rather than equated to a parameter, the planner keeps txid in the sort order, and only
	// the (txid, id) index gives (txid, id) order without a sort; for one txid it is id order.
	oneTxid := func(more string) string {
		return `txid >= x.txid AND txid <= x.txid AND ` + more
	}
	byTxid := ` ORDER BY txid, id LIMIT ` + strconv.Itoa(batchSize)
	// perBucket reads the rows that match cond, in id order, bucket by bucket through the bucket
	// index ($n holds the buckets); unsharded, the id index in one walk. Within one bucket,
	// ordering by (bucket, id) is ordering by id; only the bucket index gives that order without a
	// sort (which the relay's sessions do not plan), so no plan walks the id index instead,
	// whatever the statistics say (a backlog written a moment ago has none).
	perBucket := func(cond string, n int) string {
		if !sharded {
			return `SELECT ` + fetchColumns + ` FROM ` + t.Ident() + ` WHERE ` + cond + limit
		}
		return `SELECT o.* FROM unnest($` + strconv.Itoa(n) + `::smallint[]) AS k(b) CROSS JOIN LATERAL (
  SELECT ` + fetchColumns + ` FROM ` + t.Ident() + ` WHERE ` + outboxdb.BucketExpr + ` = k.b AND ` + cond + `
  ORDER BY ` + outboxdb.BucketExpr + `, id LIMIT ` + strconv.Itoa(batchSize) + `) AS o`
	}
	seq := outboxdb.QuoteLiteral(t.Derived("id_seq")) + `::regclass`
	q.quiet = `SELECT coalesce(pg_sequence_last_value(` + seq + `), 0) <= $1::int8
  AND NOT EXISTS (SELECT 1 FROM unnest($2::text[]::xid8[]) AS x(t) WHERE pg_xact_status(x.t) IS DISTINCT FROM 'in progress')`
	q.floor = `SELECT set_config('outbox.floor', coalesce(pg_sequence_last_value(` + seq + `), 0)::text, true)`
	token := "$6"
	if sharded {
		token = "$7"
	}
	q.open = openSQL(t, seq, bucketParam(6), token, openAny)
	q.openKnown = openSQL(t, seq, bucketParam(6), token, openKnownFrom)
	q.openFused = openSQL(t, seq, bucketParam(6), token, openFusedFetch)
	// The snapshots as uncorrelated subqueries: parsed once per statement, not once per row.
	toSnap, fromSnap := `(SELECT $1::text::pg_snapshot)`, `(SELECT $5::text::pg_snapshot)`
	q.fetch = perBucket(`sent_at IS NULL AND id > $2::int8 AND id > $3::int8 AND id <= $4::int8
  AND pg_visible_in_snapshot(txid, `+toSnap+`) AND NOT pg_visible_in_snapshot(txid, `+fromSnap+`)`, 6)
	q.fetchOpen = `SELECT o.* FROM unnest($3::text[]::xid8[]) AS x(txid) CROSS JOIN LATERAL (
  SELECT ` + fetchColumns + ` FROM ` + t.Ident() + ` WHERE ` + oneTxid(`sent_at IS NULL AND id > $2::int8 AND id <= $4::int8
    AND pg_visible_in_snapshot(txid, `+toSnap+`)`) + bucketParam(5) + byTxid + `) AS o`
	// The fused variants read the snapshot and its ceiling the open statement before them left in
	// the session, once each; the window ends at the ceiling or at the given id, whichever is lower.
	to := `(SELECT current_setting('outbox.to')::pg_snapshot)`
	ceil := `(SELECT current_setting('outbox.ceil')::int8)`
	q.fetchFused = perBucket(`sent_at IS NULL AND id > $1::int8 AND id <= least(`+ceil+`, $2::int8)
  AND pg_visible_in_snapshot(txid, `+to+`) AND NOT pg_visible_in_snapshot(txid, (SELECT $3::text::pg_snapshot))`, 4)
	q.fetchOpenFused = `SELECT o.* FROM unnest($2::text[]::xid8[]) AS x(txid) CROSS JOIN LATERAL (
  SELECT ` + fetchColumns + ` FROM ` + t.Ident() + ` WHERE ` + oneTxid(`sent_at IS NULL AND id > $1::int8 AND id <= $3::int8
    AND pg_visible_in_snapshot(txid, `+to+`)`) + bucketParam(4) + byTxid + `) AS o`
	q.first = perBucket(`sent_at IS NULL AND id > $2::int8 AND id <= $3::int8
  AND (txid IS NULL OR pg_visible_in_snapshot(txid, `+toSnap+`))`, 4)
	q.advance = `UPDATE ` + cursor + ` SET snap = $2::text::pg_snapshot, next_snap = $3::text::pg_snapshot, last_id = $4::int8,
  snap_floor = $5::int8, next_floor = $6::int8, next_ceil = $7::int8, updated_at = now() WHERE id = $1::int8`
	q.park = `INSERT INTO ` + parked + ` (id, created_at, event_id, aggregate_type, aggregate_id, event_type, payload, payload_bytes, headers, bucket, attempts, error)
SELECT o.id, o.created_at, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.payload_bytes, o.headers, ` + outboxdb.BucketExprOf("o") + `, f.attempts, f.err
FROM unnest($1::int8[], $2::timestamptz[], $3::int4[], $4::text[]) AS f(id, created_at, attempts, err)
JOIN ` + t.Ident() + ` AS o ON o.id = f.id AND o.created_at = f.created_at
ON CONFLICT (id) DO NOTHING RETURNING aggregate_id`
	q.parkedFetch = `SELECT ` + fetchColumns + ` FROM ` + parked + `
WHERE aggregate_id = ANY($1::text[]) ORDER BY id LIMIT ` + strconv.Itoa(batchSize)
	q.unpark = `DELETE FROM ` + parked + ` WHERE id = ANY($1::int8[]) RETURNING aggregate_id`
	q.parkedRecord = `UPDATE ` + parked + ` AS p SET attempts = p.attempts + f.inc, error = f.err
FROM unnest($1::int8[], $2::int4[], $3::text[]) AS f(id, inc, err) WHERE p.id = f.id`
	q.deadLettered = `INSERT INTO ` + t.Derived("dead_lettered") + ` (id, event_id, aggregate_id, error)
SELECT * FROM unnest($1::int8[], $2::uuid[], $3::text[], $4::text[]) ON CONFLICT (id) DO NOTHING`
	q.parkedLoad = `SELECT aggregate_id, count(*) FROM ` + parked + ` WHERE bucket = ANY($1::smallint[]) GROUP BY aggregate_id`
	return q
}

// openFor returns the open statement for a batch from from: openFused where from and its floor
// are both known (the open statement's $1 and $3 not NULL) and the round trip fetches the batch's
// first rows (fused), openKnown where they are known and it does not, open otherwise.
func (q *snapQueries) openFor(from snapMark, fused bool) string {
	switch {
	case from.text == "" || from.floor < 0:
		return q.open
	case fused:
		return q.openFused
	}
	return q.openKnown
}

// openVariant is which reads an open statement holds (openSQL).
type openVariant int

const (
	openAny        openVariant = iota // every read the open statement may need
	openKnownFrom                     // from and floor(from) known
	openFusedFetch                    // and the round trip fetches the batch's first rows
)

// openSQL is the open statement (snapQueries.open) or one of its variants for a from and a
// floor(from) both known (openKnown, openFused): the columns of the lowest unsent id and of the
// lowest id by transaction id are then NULL, and their reads are not in the plan; in openFused
// the lowest id of the transactions in progress at from too. Every parameter stays in the
// statement (in an expression that is always NULL), so that all take the same parameters.
func openSQL(t outboxdb.Table, seq, buckets, token string, v openVariant) string {
	byTxid := `b.lo`
	byTxidJoin := `
LEFT JOIN LATERAL (SELECT min(id) AS lo FROM (SELECT id FROM ` + t.Ident() + `
  WHERE $1::text IS NOT NULL AND $3::int8 IS NULL
    AND txid >= pg_snapshot_xmax($1::text::pg_snapshot) AND txid < pg_snapshot_xmax(s.t)
    AND pg_visible_in_snapshot(txid, s.t)` + buckets + ` OFFSET 0) AS i) AS b ON true`
	unsent := `CASE WHEN $1::text IS NULL THEN (SELECT min(id) FROM ` + t.Ident() + ` WHERE sent_at IS NULL) END`
	byXip := `a.lo`
	byXipJoin := `
LEFT JOIN LATERAL (SELECT min(id) AS lo FROM (SELECT id FROM ` + t.Ident() + `
  WHERE $1::text IS NOT NULL AND txid = ANY(ARRAY(SELECT pg_snapshot_xip($1::text::pg_snapshot)))
    AND pg_visible_in_snapshot(txid, s.t)` + buckets + ` OFFSET 0) AS i) AS a ON true`
	if v != openAny {
		byTxid, byTxidJoin, unsent = `nullif($3::int8, $3::int8)`, ``, `NULL::int8`
	}
	if v == openFusedFetch {
		refs := `$1::text IS NULL`
		if buckets != "" {
			refs += ` AND $6::smallint[] IS NULL`
		}
		byXip, byXipJoin = `CASE WHEN `+refs+` THEN NULL::int8 END`, ``
	}
	// The snapshot is the statement's, taken before the ceiling is read; the counter of
	// transaction ids is read after the ceiling was read (w after c), so that a transaction at or
	// above it takes its id later and draws its ids later still (an id is drawn after its
	// transaction has its id: migration 00007): the ceiling is the new snapshot's floor too,
	// unless the transaction had its id before this statement (fresh false; the floor is then the
	// one the floor statement set, if it came first, or not known).
	//
	// The counter is read without taking an id (nextXid below): age() measures from the
	// transaction's own id if it has one, from the next id to be assigned otherwise, read at its
	// first call in the transaction and kept for the rest of it (GetStableLatestTransactionId).
	// Its 32-bit difference from the snapshot's xmin (a real id, at most 2^31 behind) added to
	// the 64-bit xmin gives the 64-bit id, across an epoch's wrap too. Taking an id instead
	// (pg_current_xact_id(), as the relay did before) gave the same bound for an id per batch: at
	// 50 events/s three ids per event, three times the writers' own. A second
	// open statement in one transaction would read the first one's counter again, older than its
	// own ceiling: the setting the open statement leaves (outbox.to) makes it not fresh.
	//
	// OFFSET 0 keeps each step a step of its own, in this order. In the legacy bounds, OFFSET 0
	// keeps PostgreSQL from answering min and max by walking the id index from either end
	// (filtering every row it meets); the transaction-id index reads only the batch's rows.
	nextXid := `(pg_snapshot_xmin(c.t)::text::int8 + age((pg_snapshot_xmin(c.t)::text::int8 % 4294967296)::text::xid))::text::xid8`
	return `WITH c AS (SELECT pg_current_snapshot() AS t, coalesce(pg_sequence_last_value(` + seq + `), 0) AS ceil,
  pg_current_xact_id_if_assigned() IS NULL AND coalesce(current_setting('outbox.to', true), '') = '' AS fresh OFFSET 0),
w AS (SELECT c.t, c.ceil, c.fresh, ` + nextXid + ` AS own FROM c OFFSET 0),
s AS (SELECT CASE
    WHEN $2::text IS NOT NULL THEN $2::text::pg_snapshot
    WHEN w.own <= pg_snapshot_xmax(w.t) THEN w.t
    ELSE (pg_snapshot_xmin(w.t)::text || ':' || w.own::text || ':' || array_to_string(ARRAY(
      SELECT x::text::int8 FROM pg_snapshot_xip(w.t) AS x
      UNION ALL SELECT generate_series(pg_snapshot_xmax(w.t)::text::int8, w.own::text::int8 - 1) ORDER BY 1), ','))::pg_snapshot
  END AS t,
  CASE WHEN $2::text IS NOT NULL THEN $4::int8 WHEN w.fresh THEN w.ceil
    ELSE nullif(current_setting('outbox.floor', true), '')::int8 END AS floor,
  CASE WHEN $2::text IS NULL THEN w.ceil ELSE coalesce($5::int8, w.ceil) END AS ceil FROM w)
SELECT s.t::text, s.floor, s.ceil, ` + byTxid + `, ` + byXip + `,
  ` + unsent + `,
  set_config('outbox.to', s.t::text, true) || set_config('outbox.ceil', coalesce(s.ceil::text, ''), true),
  ` + sessionMarked(token) + ` FROM s` + byTxidJoin + byXipJoin
}

// cursorSQL holds the statements that set up a tenure's cursor rows (snapshot.go, takeCursor).
type cursorSQL struct {
	lock, seqCache, init, read, split, merge string
}

func newCursorSQL(t outboxdb.Table) cursorSQL {
	cursor := t.Derived("relay_cursor")
	return cursorSQL{
		// Serialises the set-up of tenures (rare); batches' updates wait for it only briefly.
		lock: `LOCK TABLE ` + cursor + ` IN SHARE ROW EXCLUSIVE MODE`,
		// The first snapshot relay of a table: every bucket starts before its first batch.
		init: `INSERT INTO ` + cursor + ` (buckets, snap, next_snap, last_id, system_identifier)
SELECT ARRAY(SELECT generate_series(0, ` + strconv.Itoa(outboxdb.Buckets-1) + `))::smallint[], NULL, NULL, 0, system_identifier FROM pg_control_system()
WHERE NOT EXISTS (SELECT 1 FROM ` + cursor + `)`,
		seqCache: `SELECT seqcache FROM pg_sequence WHERE seqrelid = ` + outboxdb.QuoteLiteral(t.Derived("id_seq")) + `::regclass`,
		read: `SELECT c.id, c.buckets, c.snap::text, c.next_snap::text, c.last_id, c.system_identifier = s.system_identifier,
  pg_snapshot_xmax(pg_current_snapshot()) >= pg_snapshot_xmax(coalesce(c.next_snap, c.snap, pg_current_snapshot())),
  c.snap_floor, c.next_floor, c.next_ceil
FROM ` + cursor + ` AS c, pg_control_system() AS s WHERE c.buckets && $1::smallint[] ORDER BY c.id`,
		// Gives the buckets $2 of row $1 to a new row with the same position, returning its id.
		split: `WITH old AS (UPDATE ` + cursor + ` SET buckets = ARRAY(SELECT b FROM unnest(buckets) AS b WHERE b <> ALL($2::smallint[]) ORDER BY b)
  WHERE id = $1::int8 RETURNING snap, next_snap, last_id, system_identifier, snap_floor, next_floor, next_ceil)
INSERT INTO ` + cursor + ` (buckets, snap, next_snap, last_id, system_identifier, snap_floor, next_floor, next_ceil)
SELECT $2::smallint[], snap, next_snap, last_id, system_identifier, snap_floor, next_floor, next_ceil FROM old RETURNING id`,
		// Replaces rows $1 (all at snapshot $3, between batches) by one row for buckets $2.
		merge: `WITH gone AS (DELETE FROM ` + cursor + ` WHERE id = ANY($1::int8[]) RETURNING system_identifier)
INSERT INTO ` + cursor + ` (buckets, snap, next_snap, last_id, system_identifier)
SELECT $2::smallint[], $3::text::pg_snapshot, NULL, 0, min(system_identifier) FROM gone RETURNING id`,
	}
}

// snapshotTrackedSQL asks whether t's cursor table has rows: a snapshot relay tracks t, and a row
// relay must not publish it (it would publish every event again).
func snapshotTrackedSQL(t outboxdb.Table) string {
	return `SELECT EXISTS (SELECT 1 FROM ` + t.Derived("relay_cursor") + `)`
}
