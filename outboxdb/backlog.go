package outboxdb

import "github.com/outbox-operator/outbox-operator/internal/contract"

// PlanInIDOrder is the session setting under which the relay's fetch and BacklogSQL are planned
// as ordered walks of the pending index whatever the statistics say. A backlog committed in one
// burst after a quiet spell meets statistics in which no row is pending (until autovacuum
// analyzes the partition again, a minute or more later); planned with them, those statements
// read and sort the whole backlog every time. Neither needs a sort, so sorting is turned off for
// the sessions that run them (the relay's connections and the operator's).
//
// Sequential scans are turned off for the same reason: snapshot tracking finds a batch's
// transactions through the transaction-id index, and a partition written by one large
// transaction has statistics in which every row shares one id, so the planner read the whole
// partition for a lookup that the index answers at once (measured: 10 ms per batch per such
// partition).
//
// JIT compilation is turned off too: a plan that must still sort (snapshot tracking sorts the
// few events of the transactions open at a batch's older snapshot) carries the huge cost that
// disabling sorts adds, which is past jit_above_cost, and compiling it took 600 ms per fetch.
//
// Parallel workers are turned off: every statement reads a bounded slice of an index, and a
// parallel plan only adds processes that compete with the rest of the database.
const PlanInIDOrder = `SELECT set_config('enable_sort', 'off', false), set_config('enable_seqscan', 'off', false),
  set_config('jit', 'off', false), set_config('max_parallel_workers_per_gather', '0', false)`

// DefaultBacklogCountLimit is the number of unsent rows a backlog measurement counts one by one
// unless told otherwise. Past it, the count is estimated (see Backlog.Pending), so the cost of a
// measurement does not grow with the backlog.
const DefaultBacklogCountLimit = 100_000

// BacklogSQL returns the statement that measures the backlog of table t: the whole table, or
// with sharded the rows whose bucket (BucketExpr) is in the first parameter (smallint[]). The next
// parameter is the count limit (int). Scan its row into Backlog.Dest().
//
// The whole table's is read from the partial pending index (<table>_pending_idx ON (id) WHERE
// sent_at IS NULL): a count bounded by the limit and index probes at both ends. A shard's is read
// bucket by bucket from the bucket index (<table>_bucket_idx ON (bucket, id) WHERE sent_at IS
// NULL), so that it does not walk the other shards' rows: each bucket counts up to its share of
// the limit, extrapolated past it as Backlog.Pending does, and the statement returns the estimate
// (FirstID and LastCountedID NULL).
//
// The operator (status.pendingEvents and lagSeconds) and the relay (outbox_pending and
// outbox_lag_seconds) both measure with it.
func BacklogSQL(t Table, sharded bool) string {
	pending := `FROM ` + t.Ident() + ` WHERE sent_at IS NULL`
	if !sharded {
		return `SELECT c.n, c.lo, c.hi,
  (SELECT id ` + pending + ` ORDER BY id DESC LIMIT 1),
  coalesce((SELECT extract(epoch FROM clock_timestamp() - created_at)::float8 ` + pending + ` ORDER BY id LIMIT 1), 0)
FROM (SELECT count(*) AS n, min(id) AS lo, max(id) AS hi
      FROM (SELECT id ` + pending + ` ORDER BY id LIMIT $1::int) AS s) AS c`
	}
	bucket := pending + ` AND ` + BucketExpr + ` = k.b`
	return `WITH k AS (SELECT b, (greatest($2::int, 1) + cardinality($1::smallint[]) - 1) / cardinality($1::smallint[]) AS lim
           FROM unnest($1::smallint[]) AS u(b)),
per AS (
  SELECT c.n, c.lo, c.hi, c.oldest, k.lim, l.id AS last
  FROM k
  CROSS JOIN LATERAL (SELECT count(*) AS n, min(id) AS lo, max(id) AS hi, min(created_at) AS oldest
                      FROM (SELECT id, created_at ` + bucket + ` ORDER BY ` + BucketExpr + `, id LIMIT k.lim) AS s) AS c
  LEFT JOIN LATERAL (SELECT id ` + bucket + ` ORDER BY ` + BucketExpr + ` DESC, id DESC LIMIT 1) AS l ON true)
SELECT coalesce(sum(CASE WHEN n >= lim AND hi > lo AND last > hi
                         THEN greatest(n, round(n * (last - lo + 1)::float8 / (hi - lo + 1))::int8) ELSE n END), 0)::int8,
  NULL::int8, NULL::int8, max(last),
  coalesce(extract(epoch FROM clock_timestamp() - min(oldest))::float8, 0)
FROM per`
}

// SnapshotBacklogSQL is BacklogSQL for a table tracked by snapshot, with the same arguments and
// row: it calls the table's <table>_snapshot_backlog function (migration 00007), which counts
// the events no cursor has passed and the parked ones.
func SnapshotBacklogSQL(t Table, sharded bool) string {
	if sharded {
		return `SELECT * FROM ` + t.Derived("snapshot_backlog") + `($1::smallint[], $2::int)`
	}
	return `SELECT * FROM ` + t.Derived("snapshot_backlog") + `(NULL, $1::int)`
}

// TrackedBacklogSQL returns the statement that measures the backlog of table t tracked in mode:
// SnapshotBacklogSQL under snapshot tracking, BacklogSQL under row tracking; same arguments, same
// row.
func TrackedBacklogSQL(t Table, mode contract.Tracking, sharded bool) string {
	if mode == contract.TrackSnapshot {
		return SnapshotBacklogSQL(t, sharded)
	}
	return BacklogSQL(t, sharded)
}

// ScalableLagSQL measures the lag more shards can fix, in seconds (NULL when nothing is pending
// that a failed event does not hold back), with $1 the count limit (migration 00012): the
// backlog's age leaves in the events a failed event holds back, which no shard count publishes.
func ScalableLagSQL(t Table) string {
	return `SELECT ` + t.Derived("scalable_lag") + `($1::int)`
}

// ParkedCountSQL counts the events of a snapshot-tracked table waiting in <table>_parked
// (migration 00007).
func ParkedCountSQL(t Table) string {
	return `SELECT count(*) FROM ` + t.Derived("parked")
}

// BacklogArgs returns the arguments of BacklogSQL(t, len(buckets) > 0).
func BacklogArgs(buckets []int16, limit int) []any {
	if len(buckets) > 0 {
		return []any{buckets, limit}
	}
	return []any{limit}
}

// Backlog is one measurement by BacklogSQL.
type Backlog struct {
	// Counted is the number of unsent rows counted, at most Limit; or, with FirstID nil, the
	// estimate of the backlog that <table>_snapshot_backlog extrapolated cursor row by cursor row
	// (migration 00009), or a shard's BacklogSQL bucket by bucket, which Pending returns as it is.
	Counted int64
	// FirstID and LastCountedID are the lowest and highest id among the counted rows, LastID
	// the highest unsent id; nil when nothing is unsent.
	FirstID, LastCountedID, LastID *int64
	// OldestAgeSeconds is the age of the unsent row with the lowest id (a shard's: the oldest
	// of its buckets' first unsent rows), by the database's clock (0 when nothing is unsent).
	OldestAgeSeconds float64
	// Limit is the count limit the measurement ran with.
	Limit int
}

// Dest returns the scan destinations of BacklogSQL's row, for pgx and database/sql alike.
func (b *Backlog) Dest() []any {
	return []any{&b.Counted, &b.FirstID, &b.LastCountedID, &b.LastID, &b.OldestAgeSeconds}
}

// Pending is the number of unsent rows: exact below Limit; past it, extrapolated from the
// density of the counted rows over the ids up to the last unsent one (ids that were never
// committed or are already sent lower the density, so the estimate follows them).
func (b Backlog) Pending() int64 {
	if b.Counted < int64(b.Limit) || b.FirstID == nil || b.LastCountedID == nil || b.LastID == nil ||
		*b.LastCountedID <= *b.FirstID || *b.LastID <= *b.LastCountedID {
		return b.Counted
	}
	span := float64(*b.LastID - *b.FirstID + 1)
	counted := float64(*b.LastCountedID - *b.FirstID + 1)
	return max(b.Counted, int64(float64(b.Counted)*span/counted+0.5))
}
