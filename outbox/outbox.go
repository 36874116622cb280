package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// DefaultMaxPayloadBytes is the default payload limit: below Kafka's default 1 MB message size,
// with room for the key and headers.
const DefaultMaxPayloadBytes = contract.DefaultMaxPayloadBytes

// Event is one event to append.
type Event struct {
	// AggregateType selects the Kafka topic (the relay's topic map). Required.
	AggregateType string
	// AggregateID is the Kafka key and the unit of ordering: the events of one aggregate reach
	// Kafka in commit order. Required.
	AggregateID string
	// EventType is published as the event_type header. Required.
	EventType string
	// Payload is the message value, a JSON document. Required, unless PayloadBytes or Tombstone
	// is set.
	Payload json.RawMessage
	// PayloadBytes is the message value as bytes the application encoded itself (Avro,
	// Protobuf, a Schema Registry frame), stored in the payload_bytes column (schema version 20
	// and later): set it instead of Payload. Empty but not nil is an empty value (a tombstone
	// where the relays' --null-payload is tombstone).
	PayloadBytes []byte
	// Tombstone appends an event without a value: published as a record with a null value (the
	// deletion of its key in a compacted topic) where the OutboxRelay's publish.nullPayload is
	// Tombstone, poison otherwise. Payload and PayloadBytes must be empty.
	Tombstone bool
	// Headers are extra Kafka headers (correlation id, W3C traceparent, ...). Optional; keys must
	// be non-empty and not one of ReservedHeaders.
	Headers map[string]string
	// EventID is the event's UUID, published as the event_id header and used by consumers to
	// drop duplicates. Optional: the Writer generates a random (version 4) one when empty, as
	// the table's default would, without the server's cost of it. Setting it makes an
	// application retry idempotent only if the application also checks for it; the outbox
	// table does not enforce uniqueness.
	EventID string
}

// Appended describes an appended event.
//
// It carries what the Writer knows without asking PostgreSQL: a RETURNING clause (the row's id,
// its created_at) costs every appending transaction a few percent of its throughput under
// concurrent writers (docs/benchmarks.md, the write path). The event id is what identifies an
// event everywhere else: its Kafka header, consumers' inboxes, `kubectl outbox`.
type Appended struct {
	EventID string // the event's UUID, lower case: Event.EventID, or the one the Writer generated
}

// Querier is what Append needs from a transaction. pgx.Tx and *pgxpool.Tx satisfy it (and so do
// *pgx.Conn and *pgxpool.Pool, but see the package documentation: outside a transaction the
// event is not atomic with anything).
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Writer appends events to one outbox table. It is safe for concurrent use and holds no
// connection; create one per table and keep it.
type Writer struct {
	table           table
	maxPayloadBytes int
	noLock          bool // WithoutAggregateLock

	appendSQL      string
	batchSQL       string
	appendBytesSQL string // with payload_bytes: events with PayloadBytes or Tombstone
	batchBytesSQL  string
}

// Option configures a Writer.
type Option func(*Writer) error

// WithMaxPayloadBytes sets the largest payload accepted, measured as the relay reads it (see
// StoredPayloadSize). Match it to the relay's --max-payload-bytes.
func WithMaxPayloadBytes(n int) Option {
	return func(w *Writer) error {
		if n <= 0 {
			return fmt.Errorf("outbox: max payload bytes must be positive, got %d", n)
		}
		w.maxPayloadBytes = n
		return nil
	}
}

// WithoutAggregateLock makes Append and AppendBatch skip the per-aggregate advisory lock (see
// "Order per aggregate" in the package documentation). Use it only when every transaction that
// appends an event of an aggregate already holds, before it appends, a lock that makes any other
// such transaction wait until it ends: for example a row lock on the aggregate's own row
// (SELECT ... FOR UPDATE, or an UPDATE of that row earlier in the transaction). The ids of one
// aggregate then follow commit order without it. If any code path appends without that lock,
// events of one aggregate can be published out of order.
func WithoutAggregateLock() Option {
	return func(w *Writer) error {
		w.noLock = true
		return nil
	}
}

// New returns a Writer for the outbox table "name" (schema public) or "schema.name". The table
// is not checked to exist; its schema is created by the migrations package.
func New(tableName string, opts ...Option) (*Writer, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return nil, err
	}
	w := &Writer{table: t, maxPayloadBytes: DefaultMaxPayloadBytes}
	for _, o := range opts {
		if err := o(w); err != nil {
			return nil, err
		}
	}
	w.buildSQL()
	return w, nil
}

// Table returns the outbox table as schema.name.
func (w *Writer) Table() string { return w.table.String() }

// MaxPayloadBytes returns the writer's payload limit.
func (w *Writer) MaxPayloadBytes() int { return w.maxPayloadBytes }

func (w *Writer) buildSQL() {
	lock := func(key string) string {
		if w.noLock {
			return key
		}
		return "pg_advisory_xact_lock(hashtextextended(" + w.table.lockPrefix() + " || " + key + ", 0))"
	}
	// The lock sits in an uncorrelated subquery of the WHERE clause, which PostgreSQL runs once,
	// as a one-time filter, before the first row is produced, and so before nextval() draws the
	// row's id in the projection above it.
	//
	// Every event id comes from the Writer, never from the column's default: on PostgreSQL 15
	// with 32 durable writers, gen_random_uuid() in the statement cost the appending transaction
	// about 5% of its throughput, a RETURNING clause about 4% more (make bench, the write path).
	w.appendSQL = `INSERT INTO ` + w.table.ident() + ` (event_id, aggregate_type, aggregate_id, event_type, payload, headers)
SELECT $1::uuid, $2::text, $3::text, $4::text, $5::jsonb, $6::jsonb
WHERE (SELECT ` + lock("$3::text") + `) IS NOT NULL`
	// Events with bytes or no value (PayloadBytes, Tombstone) name payload_bytes, a column of
	// schema version 20: JSON events keep the statement above, which every version takes.
	w.appendBytesSQL = `INSERT INTO ` + w.table.ident() + ` (event_id, aggregate_type, aggregate_id, event_type, payload_bytes, headers)
SELECT $1::uuid, $2::text, $3::text, $4::text, $5::bytea, $6::jsonb
WHERE (SELECT ` + lock("$3::text") + `) IS NOT NULL`
	// $7 holds the distinct aggregate ids, sorted; the aggregate over unnest() locks them in
	// array order. Rows are inserted, and their ids drawn, in the order of the batch.
	w.batchSQL = `INSERT INTO ` + w.table.ident() + ` (event_id, aggregate_type, aggregate_id, event_type, payload, headers)
SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.event_type, e.payload, e.headers
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::jsonb[]) WITH ORDINALITY
    AS e(event_id, aggregate_type, aggregate_id, event_type, payload, headers, ord)
WHERE (SELECT count(` + lock("k") + `) FROM unnest($7::text[]) AS k) IS NOT NULL
ORDER BY e.ord`
	w.batchBytesSQL = `INSERT INTO ` + w.table.ident() + ` (event_id, aggregate_type, aggregate_id, event_type, payload, payload_bytes, headers)
SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.event_type, e.payload, e.payload_bytes, e.headers
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $8::bytea[], $6::jsonb[]) WITH ORDINALITY
    AS e(event_id, aggregate_type, aggregate_id, event_type, payload, payload_bytes, headers, ord)
WHERE (SELECT count(` + lock("k") + `) FROM unnest($7::text[]) AS k) IS NOT NULL
ORDER BY e.ord`
}

// Append validates ev and inserts it in tx, after taking the aggregate's advisory lock (see the
// package documentation). The event is published once tx commits; if tx rolls back, it never
// existed. A validation error (an *InvalidEventError) leaves tx untouched; a database error
// aborts tx, as any failed statement does.
func (w *Writer) Append(ctx context.Context, tx Querier, ev Event) (Appended, error) {
	p, err := w.validate(&ev)
	if err != nil {
		return Appended{}, &InvalidEventError{Index: 0, Err: err}
	}
	id := pgtype.UUID{Bytes: p.eventID, Valid: true}
	// The JSON goes as text: as []byte, pgx's exec and simple protocol modes (PgBouncer users'
	// choice) would send it as bytea, which jsonb does not parse.
	var tag pgconn.CommandTag
	if p.bytes {
		tag, err = tx.Exec(ctx, w.appendBytesSQL, id, ev.AggregateType, ev.AggregateID, ev.EventType, p.payload, string(p.headers))
	} else {
		tag, err = tx.Exec(ctx, w.appendSQL, id, ev.AggregateType, ev.AggregateID, ev.EventType, string(p.payload), string(p.headers))
	}
	if err != nil {
		return Appended{}, fmt.Errorf("outbox: append to %s: %w", w.table, err)
	}
	if tag.RowsAffected() != 1 {
		return Appended{}, fmt.Errorf("outbox: append to %s: inserted %d rows", w.table, tag.RowsAffected())
	}
	return Appended{EventID: id.String()}, nil
}

// AppendBatch validates every event, then inserts them all in tx with one statement (one round
// trip), in order: their ids ascend in the order of evs. It takes the advisory lock of each
// distinct aggregate once, in sorted order, before drawing any id. If any event is invalid,
// nothing is written and the error (an *InvalidEventError) names its index. The result has one
// entry per event, in the order of evs.
//
// Each distinct aggregate holds a lock-table entry until the transaction ends: keep a
// transaction's distinct aggregates to a few thousand (see the package documentation).
func (w *Writer) AppendBatch(ctx context.Context, tx Querier, evs []Event) ([]Appended, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	var (
		out      = make([]Appended, len(evs))
		ids      = make([]pgtype.UUID, len(evs))
		aggTypes = make([]string, len(evs))
		aggIDs   = make([]string, len(evs))
		types    = make([]string, len(evs))
		payloads = make([]string, len(evs)) // text, as in Append
		bytesVal = make([][]byte, len(evs)) // payload_bytes: NULL (nil) where JSON or a tombstone
		anyBytes bool
		headers  = make([]string, len(evs))
	)
	for i := range evs {
		p, err := w.validate(&evs[i])
		if err != nil {
			return nil, &InvalidEventError{Index: i, Err: err}
		}
		ids[i] = pgtype.UUID{Bytes: p.eventID, Valid: true}
		out[i] = Appended{EventID: ids[i].String()}
		aggTypes[i], aggIDs[i], types[i] = evs[i].AggregateType, evs[i].AggregateID, evs[i].EventType
		if p.bytes {
			bytesVal[i], anyBytes = p.payload, true
		} else {
			payloads[i] = string(p.payload)
		}
		headers[i] = string(p.headers)
	}
	locks := slices.Clone(aggIDs)
	sort.Strings(locks)
	locks = slices.Compact(locks)

	var (
		tag pgconn.CommandTag
		err error
	)
	if anyBytes {
		// payload is NULL where the event's value is bytes or none.
		jsonVals := make([]*string, len(evs))
		for i := range evs {
			if bytesVal[i] == nil && !evs[i].Tombstone {
				jsonVals[i] = &payloads[i]
			}
		}
		tag, err = tx.Exec(ctx, w.batchBytesSQL, ids, aggTypes, aggIDs, types, jsonVals, headers, locks, bytesVal)
	} else {
		tag, err = tx.Exec(ctx, w.batchSQL, ids, aggTypes, aggIDs, types, payloads, headers, locks)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: append batch to %s: %w", w.table, err)
	}
	if n := tag.RowsAffected(); n != int64(len(evs)) {
		return nil, fmt.Errorf("outbox: append batch to %s: inserted %d rows for %d events", w.table, n, len(evs))
	}
	return out, nil
}

// IsDeadlock reports whether err is PostgreSQL's deadlock_detected (40P01), which Append returns
// when two transactions append to the same aggregates in opposite orders. The transaction is
// aborted; retry it.
func IsDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

// NoWakeUp makes the appends of tx wake no relay: call it first in a transaction that will be
// prepared (PREPARE TRANSACTION, two-phase commit), which PostgreSQL refuses once it has sent a
// notification, as the table's insert trigger does while a relay waits for one (spec.publish.notify).
// The events are published as usual, found by the relays' next poll. In SQL, from any language:
// SET LOCAL outbox.notify = off.
func NoWakeUp(ctx context.Context, tx Querier) error {
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.set_config('outbox.notify', 'off', true)`); err != nil {
		return fmt.Errorf("outbox: no wake-up: %w", err)
	}
	return nil
}
