package relay

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// queries holds the relay's SQL for one table and shard. Every statement runs through pgx's
// statement cache: prepared once per connection, then executed with binary parameters.
type queries struct {
	shardCount int
	// fetch[blocked][inflight]: with or without the blocked-aggregate filter and the in-flight
	// exclusion (see FetchSQL), from the position in resume.args.
	fetch [2][2]string
	// position reads, first in a round trip that fetches, the snapshot and the id sequence's
	// value that the fetch's position moves to (resume.afterFetch).
	position string
	// mark marks acknowledged rows sent: $1 ids, $2/$3 the created_at bounds that let
	// PostgreSQL prune the partitions.
	mark string
	// record writes the outcome of failed and dead-lettered rows: attempts, error and, for
	// dead-lettered rows, sent_at.
	record string
	// stats measures the shard's backlog (outboxdb.BacklogSQL).
	stats string
}

const fetchColumns = `id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, attempts`

func newQueries(t outboxdb.Table, shardCount, batchSize int) queries {
	q := queries{shardCount: shardCount}
	n := strconv.Itoa(batchSize)
	limit := ` LIMIT ` + n
	seq := quoteLit(t.Derived("id_seq")) + `::regclass`
	q.position = `SELECT pg_current_snapshot()::text, coalesce(pg_sequence_last_value(` + seq + `), 0)`
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
			// wrote (resume.go): through the (txid, id) index, whatever the statistics say
			// (txid bounded by a range rather than equated keeps (txid, id) the order only that
			// index gives; see snapshot_sql.go), those in progress at the watch one by one, then
			// those that began after it.
			if shardCount == 1 {
				below := `id <= $1::int8 AND sent_at IS NULL` + f + ` ORDER BY txid, id` + limit + ` FOR UPDATE`
				q.fetch[blocked][inflight] = `SELECT * FROM (
  SELECT o.* FROM unnest($2::text[]::xid8[]) AS x(txid) CROSS JOIN LATERAL (
    SELECT ` + fetchColumns + ` FROM ` + t.Ident() + ` WHERE txid >= x.txid AND txid <= x.txid AND ` + below + `) AS o
  UNION ALL
  SELECT * FROM (SELECT ` + fetchColumns + ` FROM ` + t.Ident() + ` WHERE txid >= $3::text::xid8 AND ` + below + `) AS r` + limit + `) AS below
UNION ALL
SELECT * FROM (SELECT ` + fetchColumns + ` FROM ` + t.Ident() + ` WHERE sent_at IS NULL AND id > $1::int8` + f + ` ORDER BY id` + limit + ` FOR UPDATE) AS above` + limit
				continue
			}
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
			q.fetch[blocked][inflight] = `SELECT * FROM (
  SELECT o.* FROM unnest($3::text[]::xid8[]) AS x(txid) CROSS JOIN LATERAL (
    SELECT ` + fetchColumns + `, ` + bucket + ` AS bucket FROM ` + t.Ident() + ` WHERE txid >= x.txid AND txid <= x.txid AND ` + below + `) AS o
  UNION ALL
  SELECT * FROM (SELECT ` + fetchColumns + `, ` + bucket + ` AS bucket FROM ` + t.Ident() + ` WHERE txid >= $4::text::xid8 AND ` + below + `) AS r` + limit + `) AS below
UNION ALL
SELECT o.*, k.b FROM unnest($1::smallint[]) AS k(b) CROSS JOIN LATERAL (
  SELECT ` + fetchColumns + ` FROM ` + t.Ident() + ` WHERE ` + bucket + ` = k.b AND sent_at IS NULL AND id > ($2::int8[])[k.b + 1]` + f + `
  ORDER BY ` + bucket + `, id` + limit + ` FOR UPDATE) AS o` + limit
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

// fetchArgs returns the fetch variant chosen by the non-empty lists and its arguments: the
// position's (resume.args, with the shard's buckets in the order the fetch reads them), then
// the ids in flight and the blocked aggregates.
func (q *queries) fetchArgs(pos *resume, buckets []int16, inflight []int64, blocked []string) (string, []any) {
	args := pos.args(buckets)
	if len(inflight) > 0 {
		args = append(args, inflight)
	}
	if len(blocked) > 0 {
		args = append(args, blocked)
	}
	return q.fetch[b2i(len(blocked) > 0)][b2i(len(inflight) > 0)], args
}

// FetchSQL returns the exact statement the relay runs to fetch a batch from the oldest unsent
// row (its first fetch; see resume.go for the others), with or without the blocked-aggregate
// filter and the in-flight exclusion, and its arguments.
func FetchSQL(t outboxdb.Table, shardCount, shardIndex, batchSize int, inflight []int64, blocked []string) (string, []any, error) {
	buckets, err := OwnedBuckets(shardCount, shardIndex)
	if err != nil {
		return "", nil, err
	}
	q := newQueries(t, shardCount, batchSize)
	sql, args := q.fetchArgs(&resume{sharded: shardCount > 1}, buckets, inflight, blocked)
	return sql, args, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// row is one fetched outbox row. Its byte fields alias the batch's arena.
type row struct {
	id        int64
	createdAt time.Time
	attempts  int32
	eventID   []byte // canonical text form
	aggType   []byte
	aggID     []byte
	eventType []byte
	payload   []byte
	headers   []byte
	bucket    int16 // a sharded row-tracking fetch's tenth column

	state   rowState
	topic   string // where the event goes (the dead-letter topic for a dead-lettered row)
	poison  string // poison reason, "" when none
	errText string // the error to record
	inc     int32  // what the failure adds to attempts
	err     error  // the publish result
}

type rowState uint8

const (
	rowFetched  rowState = iota // not published in this round; stays pending
	rowInFlight                 // handed to the publisher
	rowSent                     // acknowledged by the broker
	rowFailed                   // publish failed (or poison under block): record attempts and error
	rowDeadSent                 // acknowledged on the dead-letter topic
	rowSkipped                  // dropped before publishing: a previous event of its aggregate failed
)

var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// scanRow appends the raw values of one fetched row to b.
func (b *batch) scanRow(vals [][]byte, fds []pgconn.FieldDescription) error {
	if len(vals) != 9 && len(vals) != 10 {
		return fmt.Errorf("fetch returned %d columns, want 9 or 10", len(vals))
	}
	for i, want := range [9]int16{1, 1, 0, 0, 0, -1, -1, 1, 1} {
		if want >= 0 && fds[i].Format != want {
			return fmt.Errorf("fetch column %s came in format %d, want %d", fds[i].Name, fds[i].Format, want)
		}
	}
	var r row
	if len(vals[0]) != 8 || len(vals[1]) != 16 || len(vals[7]) != 8 || len(vals[8]) != 4 {
		return errors.New("fetch returned a malformed row")
	}
	r.id = int64(binary.BigEndian.Uint64(vals[0]))
	r.createdAt = pgEpoch.Add(time.Duration(int64(binary.BigEndian.Uint64(vals[7]))) * time.Microsecond)
	r.attempts = int32(binary.BigEndian.Uint32(vals[8]))
	r.eventID = b.appendUUID(vals[1])
	r.aggType = b.appendBytes(vals[2])
	r.aggID = b.appendBytes(vals[3])
	r.eventType = b.appendBytes(vals[4])
	r.payload = b.appendBytes(jsonbText(vals[5], fds[5].Format))
	r.headers = b.appendBytes(jsonbText(vals[6], fds[6].Format))
	if len(vals) == 10 {
		if fds[9].Format != 1 || len(vals[9]) != 2 {
			return errors.New("fetch returned a malformed bucket")
		}
		r.bucket = int16(binary.BigEndian.Uint16(vals[9]))
	}
	b.rows = append(b.rows, r)
	return nil
}

// jsonbText strips the version byte of jsonb's binary format.
func jsonbText(v []byte, format int16) []byte {
	if format == 1 && len(v) > 0 && v[0] == 1 {
		return v[1:]
	}
	return v
}

func (b *batch) appendBytes(v []byte) []byte {
	start := len(b.arena)
	b.arena = append(b.arena, v...)
	return b.arena[start:len(b.arena):len(b.arena)]
}

func (b *batch) appendUUID(u []byte) []byte {
	start := len(b.arena)
	var buf [36]byte
	hex.Encode(buf[0:8], u[0:4])
	buf[8] = '-'
	hex.Encode(buf[9:13], u[4:6])
	buf[13] = '-'
	hex.Encode(buf[14:18], u[6:8])
	buf[18] = '-'
	hex.Encode(buf[19:23], u[8:10])
	buf[23] = '-'
	hex.Encode(buf[24:36], u[10:16])
	b.arena = append(b.arena, buf[:]...)
	return b.arena[start:len(b.arena):len(b.arena)]
}

// connConfig parses the database URL and adds what the relay needs: its application name, TCP
// keepalives on the client side and a connect timeout (see also tuneSession).
func connConfig(url, appName string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, errors.New("cannot parse OUTBOX_DATABASE_URL (details withheld: they could contain the password)")
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = appName
	}
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > 15*time.Second {
		cfg.ConnectTimeout = 15 * time.Second
	}
	d := &net.Dialer{KeepAlive: 10 * time.Second}
	cfg.DialFunc = d.DialContext
	return cfg, nil
}

// dbTarget describes the database for logs: host, port and database name, never the user's
// password.
func dbTarget(url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "(unparseable OUTBOX_DATABASE_URL)"
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))) + "/" + cfg.Database
}

// TuneFetchSession makes a session plan the relay's fetch and the backlog statement as ordered
// walks of the pending index, whatever the statistics say (outboxdb.PlanInIDOrder), and plan
// each of its prepared statements once (planGeneric). The relay applies it to both its
// connections.
func TuneFetchSession(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, outboxdb.PlanInIDOrder); err != nil {
		return err
	}
	_, err := conn.Exec(ctx, planGeneric)
	return err
}

// planGeneric has the session plan each prepared statement once, for any values. Left to
// choose, PostgreSQL judged a custom plan cheaper for the relay's hottest statements and planned
// them anew at every execution, which cost more than executing them: snapshot tracking's
// statement that opens a batch 0.8 ms a call, its fetch of the open transactions' rows 0.5 ms,
// row tracking's mark 0.16 ms (woken by notifications) and its resumed fetch 0.6 ms, measured by
// pg_stat_statements (track_planning) at 500 events/s. At that rate a snapshot relay's backend
// was 0.7 of a core busy, mostly planning. The generic plans read the same indexes (TestFetchPlan,
// TestMarkPlanAfterBurst and TestSnapshotOpenTransactionsByTxid check them; TestRelayStatementsPlannedOnce
// that each is planned once).
const planGeneric = `SELECT set_config('plan_cache_mode', 'force_generic_plan', false)`

// tuneSession asks the server to notice a vanished relay quickly, so that the locks of a dead
// relay are released within about half a minute: TCP keepalives from the server's side and,
// on PostgreSQL 14 and later, client_connection_check_interval (which also ends a wait for a
// lock whose client is gone). Settings the server refuses are left as they are; they are set
// after connecting rather than as startup parameters, which poolers may reject.
//
// The relay's own commits do not wait for the WAL flush (synchronous_commit off, for its
// sessions only: the application's commits keep the server's setting). Everything the relay
// writes records what already happened in Kafka (marks, cursors, attempts, parked events, a
// replay's progress), so a commit lost in a crash is written again: the events since are
// published again (duplicates, dropped by event_id), never lost; and a commit is visible to
// every other session at once, as before, so no ordering or fencing changes. What it saves is a
// WAL flush per round trip, in the relay's latency (the next batch waited for the previous
// batch's flush) and on the server's disk.
func tuneSession(ctx context.Context, conn *pgx.Conn) {
	for _, q := range []string{
		`SELECT set_config('synchronous_commit', 'off', false)`,
		`SELECT set_config('tcp_keepalives_idle', '10', false), set_config('tcp_keepalives_interval', '5', false),
		        set_config('tcp_keepalives_count', '3', false)`,
		`SELECT set_config('client_connection_check_interval', '5s', false)`,
	} {
		_, _ = conn.Exec(ctx, q)
	}
}
