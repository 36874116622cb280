// Row tracking's statements: the fetch from where resume says, the marks and the record of
// failed attempts.

package relay

import (
	"strconv"
	"strings"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// queries holds the relay's SQL for one table and shard. Every statement runs through pgx's
// statement cache: prepared once per connection, then executed with binary parameters.
type queries struct {
	shardCount int
	// fetch[blocked][inflight]: with or without the blocked-aggregate filter and the in-flight
	// exclusion (see FetchSQL), from the position in resume.args. The same statement answers,
	// in a row of its own (the position row, scanPosition), its snapshot and the id sequence's
	// value that the position moves to (resume.afterFetch), and the check of the session's mark.
	fetch [2][2]string
	// mark marks acknowledged rows sent: $1 ids, $2/$3 the created_at bounds that let
	// PostgreSQL prune the partitions.
	mark string
	// record writes the outcome of failed and dead-lettered rows: attempts, error and, for
	// dead-lettered rows, sent_at.
	record string
	// stats measures the shard's backlog (outboxdb.BacklogSQL).
	stats string
}

const fetchColumns = `id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, attempts, payload_bytes`

func newQueries(t outboxdb.Table, shardCount, batchSize int) queries {
	q := queries{shardCount: shardCount}
	n := strconv.Itoa(batchSize)
	limit := ` LIMIT ` + n
	seq := outboxdb.QuoteLiteral(t.Derived("id_seq")) + `::regclass`
	for blocked := range 2 {
		for inflight := range 2 {
			// The resume arguments (resume.args) come first.
			next := 4
			if shardCount > 1 {
				next = 6
			}
			param := func(typ string) string { next++; return "$" + strconv.Itoa(next-1) + "::" + typ }
			var filters strings.Builder
			if inflight == 1 {
				filters.WriteString(` AND NOT (id = ANY(` + param("bigint[]") + `))`)
			}
			if blocked == 1 {
				filters.WriteString(` AND NOT (aggregate_id = ANY(` + param("text[]") + `))`)
			}
			f := filters.String()
			// FOR UPDATE, not SKIP LOCKED: the bucket locks already keep other relays away, and a
			// row another session holds (an admin's UPDATE of a poison row) must be waited for,
			// not skipped, or the later events of its aggregate would be published before it.
			//
			// First the rows at or below their floor that the watch snapshot's transactions
			// wrote (row_resume.go): through the (txid, id) index, whatever the statistics say
			// (txid bounded by a range rather than equated keeps (txid, id) the order only that
			// index gives; see snapshot_sql.go), those in progress at the watch one by one, then
			// those that began after it.
			var rows string
			if shardCount == 1 {
				below := `id <= $1::int8 AND sent_at IS NULL` + f + ` ORDER BY txid, id` + limit + ` FOR UPDATE`
				rows = `SELECT * FROM (
  SELECT o.* FROM unnest($2::text[]::xid8[]) AS x(txid) CROSS JOIN LATERAL (
    SELECT ` + fetchColumns + ` FROM ` + t.Ident() + ` WHERE txid >= x.txid AND txid <= x.txid AND ` + below + `) AS o
  UNION ALL
  SELECT * FROM (SELECT ` + fetchColumns + ` FROM ` + t.Ident() + ` WHERE txid >= $3::text::xid8 AND ` + below + `) AS r` + limit + `) AS below
UNION ALL
SELECT * FROM (SELECT ` + fetchColumns + ` FROM ` + t.Ident() + ` WHERE sent_at IS NULL AND id > $1::int8` + f + ` AND ($1::int8 < (SELECT seq FROM pos) OR $1::int8 = 0)` + ` ORDER BY id` + limit + ` FOR UPDATE) AS above` + limit
			} else {
				// A shard of several reads its own buckets only, bucket by bucket through the bucket
				// index ((bucket, id) WHERE sent_at IS NULL), in the order of $1, until the batch is
				// full: what a fetch costs does not depend on the other shards' backlog (a walk of
				// the pending index in id order passed every unsent row of a stopped shard, on every
				// fetch: make bench, "a shard down"). An aggregate lives in one bucket, so its events
				// still come in id order; the relay turns $1 by one bucket a fetch (tenure.fetchBuckets),
				// so that a bucket with a backlog of a batch or more cannot keep the ones after it
				// waiting. The lock sits in the per-bucket read (a merge in id order across buckets
				// cannot carry one: PostgreSQL gives up the order of locked rows), which visits each
				// row once. Each row comes with its bucket (resume.afterFetch).
				bucket := outboxdb.BucketExpr
				below := `id <= $5::int8 AND sent_at IS NULL AND ` + bucket + ` = ANY($1::smallint[]) AND id <= ($2::int8[])[` + bucket + ` + 1]` +
					f + ` ORDER BY txid, id` + limit + ` FOR UPDATE`
				rows = `SELECT * FROM (
  SELECT o.* FROM unnest($3::text[]::xid8[]) AS x(txid) CROSS JOIN LATERAL (
    SELECT ` + fetchColumns + `, ` + bucket + ` AS bucket FROM ` + t.Ident() + ` WHERE txid >= x.txid AND txid <= x.txid AND ` + below + `) AS o
  UNION ALL
  SELECT * FROM (SELECT ` + fetchColumns + `, ` + bucket + ` AS bucket FROM ` + t.Ident() + ` WHERE txid >= $4::text::xid8 AND ` + below + `) AS r` + limit + `) AS below
UNION ALL
SELECT o.*, k.b FROM unnest($1::smallint[]) AS k(b) CROSS JOIN LATERAL (
  SELECT ` + fetchColumns + ` FROM ` + t.Ident() + ` WHERE ` + bucket + ` = k.b AND sent_at IS NULL AND id > ($2::int8[])[k.b + 1]` + f + `
  ORDER BY ` + bucket + `, id` + limit + ` FOR UPDATE) AS o
WHERE ($2::int8[])[k.b + 1] < (SELECT seq FROM pos) OR ($2::int8[])[k.b + 1] = 0` + limit
			}
			q.fetch[blocked][inflight] = withPosition(rows, seq, shardCount > 1, param("text"))
		}
	}
	// The mark and the record find their rows by primary key. "Unsent" is spelled so that it
	// does not match the partial indexes' predicate (sent_at IS NULL): where the statistics
	// still describe a quiet table and a burst of millions of rows has just committed, the
	// planner believes those indexes empty, and chose to scan one whole, filtering on id, for
	// every batch (a 2M burst drained at tens of events a second, make bench). No plan can
	// beat the primary key's index for a list of ids; this one has no other to choose.
	const unsent = `coalesce(sent_at, 'infinity') = 'infinity'`
	q.mark = `UPDATE ` + t.Ident() + ` SET sent_at = now()
WHERE id = ANY($1::bigint[]) AND created_at BETWEEN $2::timestamptz AND $3::timestamptz AND ` + unsent
	q.record = `UPDATE ` + t.Ident() + ` AS o SET
  attempts = o.attempts + f.inc,
  error = f.err,
  sent_at = CASE WHEN f.sent THEN now() END
FROM unnest($1::bigint[], $2::timestamptz[], $3::int[], $4::text[], $5::bool[]) AS f(id, created_at, inc, err, sent)
WHERE o.id = f.id AND o.created_at = f.created_at AND coalesce(o.sent_at, 'infinity') = 'infinity'
  AND o.created_at BETWEEN $6::timestamptz AND $7::timestamptz`
	q.stats = outboxdb.BacklogSQL(t, shardCount > 1)
	return q
}

// positionColumns is how many columns the fetch adds to fetchColumns (and the bucket) for its
// position row: the snapshot, the id sequence's value and the check of the session's mark.
const positionColumns = 3

// withPosition makes rows, the fetch of a batch, one statement with its position: every row of
// rows with positionColumns NULL columns after its own, and one row more, the position row, whose
// own columns are NULL: the statement's snapshot S (pg_current_snapshot is the active snapshot,
// the one rows read under), the value of the id sequence seq read after S was taken (the
// statement's functions run after its snapshot), and the check of the session's mark (its token
// the parameter session). rows reads above a floor only where the sequence's value is above it
// (SELECT seq FROM pos): a row that S shows drew its id before S, so at most that value (a read
// from the oldest unsent row, its floor 0, reads whatever the sequence says: a row whose id was
// not drawn from it, which the relays do not expect, is still found there). An idle poll of a
// shard of several then reads no bucket index (it probed all of its 128 buckets: 1.1 ms of
// PostgreSQL's CPU a poll, make bench "Idle shards"), only the watch's transactions. One
// statement rather than a statement that reads the position before the fetch: a round trip
// fewer statements, and the position's snapshot is the fetch's own (row_resume.go).
func withPosition(rows, seq string, sharded bool, session string) string {
	n := strings.Count(fetchColumns, ",") + 1
	if sharded {
		n++ // the bucket
	}
	return `WITH pos AS MATERIALIZED (SELECT pg_current_snapshot()::text AS snap, coalesce(pg_sequence_last_value(` + seq + `), 0) AS seq)
SELECT f.*, NULL::text AS snap, NULL::int8 AS seq, NULL::bool AS same FROM (` + rows + `) AS f
UNION ALL
SELECT ` + strings.Repeat(`NULL, `, n) + `pos.snap, pos.seq, ` + sessionMarked(session) + ` FROM pos`
}

// fetchArgs returns the fetch variant chosen by the non-empty lists and its arguments: the
// position's (resume.args, with the shard's buckets in the order the fetch reads them), then
// the ids in flight and the blocked aggregates, then the session's token (session.go).
func (q *queries) fetchArgs(pos *resume, buckets []int16, inflight []int64, blocked []string, session string) (string, []any) {
	args := pos.args(buckets)
	if len(inflight) > 0 {
		args = append(args, inflight)
	}
	if len(blocked) > 0 {
		args = append(args, blocked)
	}
	args = append(args, session)
	return q.fetch[b2i(len(blocked) > 0)][b2i(len(inflight) > 0)], args
}

// FetchSQL returns the exact statement the relay runs to fetch a batch from the oldest unsent
// row (its first fetch; see row_resume.go for the others), with or without the blocked-aggregate
// filter and the in-flight exclusion, and its arguments. Its last row is the position row
// (withPosition); the session's token is empty, so that row's check of the session answers false.
func FetchSQL(t outboxdb.Table, shardCount, shardIndex, batchSize int, inflight []int64, blocked []string) (string, []any, error) {
	buckets, err := OwnedBuckets(shardCount, shardIndex)
	if err != nil {
		return "", nil, err
	}
	q := newQueries(t, shardCount, batchSize)
	sql, args := q.fetchArgs(&resume{sharded: shardCount > 1}, buckets, inflight, blocked, "")
	return sql, args, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
