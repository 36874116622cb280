// Package inbox lets a Kafka consumer apply each outbox event at most once, however often it is
// delivered.
//
// outbox-operator relays publish at least once: a relay that crashes between Kafka's
// acknowledgement and marking the row sent publishes the row again, with the same event_id
// header. A consumer that keeps its state in PostgreSQL processes each message through
// Inbox.Process, which records the event id in the inbox table and runs the handler in the same
// transaction:
//
//	id, err := inbox.EventIDFromHeaders(msg.Headers) // kafka-go or franz-go headers
//	if err != nil {
//		// no usable event_id: not from an outbox relay; dead-letter it, do not drop it silently
//	}
//	processed, err := in.Process(ctx, pool, inbox.Message{EventID: id, Topic: msg.Topic},
//		func(ctx context.Context, tx pgx.Tx) error {
//			_, err := tx.Exec(ctx, "UPDATE accounts SET ...") // the message's effect
//			return err
//		})
//	if err != nil {
//		// not applied, not recorded: do not commit the Kafka offset; the message comes again
//	}
//
// If the event id is already recorded, the handler is skipped and Process reports
// processed=false. If the handler fails, the transaction rolls back, the id is not recorded and
// a redelivery runs the handler again. Concurrent deliveries of the same event (two consumers
// during a rebalance) serialize on the inbox row's primary key: the second waits for the first
// to commit, then skips, or, if the first rolled back, runs the handler itself.
//
// The inbox table (event_id uuid PRIMARY KEY, topic text, processed_at timestamptz) is created by
// the migrations package in the outbox table's schema. Process never deletes a row; Prune deletes
// the rows processed longer ago than a retention, in short transactions of a bounded number of
// rows each, for a consumer to run periodically (a daily job, a ticker in the consumer).
//
// # Choosing the retention
//
// An event whose inbox row was pruned is processed again if it is delivered again, so the
// retention must be longer than any redelivery can come late:
//
//   - the topic's retention (retention.ms; a consumer group reset to the earliest offset, or a
//     new consumer group reading from the beginning, sees every event the topic holds),
//   - plus the longest a consumer may lag behind or be stopped (its uncommitted offsets are
//     delivered again),
//   - plus the relays' own redeliveries, which come within seconds of the first delivery (a relay
//     that crashed after Kafka's acknowledgement and before recording it), and replays
//     (`kubectl outbox replay`), which are deliberate second copies marked as such.
//
// For a topic kept 7 days, a retention of 8 days or more. A compacted topic keeps the last event
// of each key forever: an inbox in front of a compacted topic read from the beginning needs its
// rows forever too, or a handler that is idempotent by the aggregate's version.
//
// The package depends on pgx only.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultTable is the inbox table migrations create next to the default outbox table.
const DefaultTable = "public.inbox"

// ErrMissingEventID is returned for a message without an event id, or whose event id is not a
// UUID. Such a message was not written by an outbox relay (or was tampered with); it cannot be
// deduplicated, and Process refuses it rather than apply it unguarded.
var ErrMissingEventID = errors.New("inbox: message has no event_id that is a UUID")

// ErrInvalidTable is returned by New for a table name that is not a valid identifier.
var ErrInvalidTable = errors.New("inbox: invalid table name")

// Message identifies one delivery.
type Message struct {
	EventID string // the event_id header: a UUID, any case
	Topic   string // recorded with the id, for operators; may be empty
}

// Beginner starts a transaction: *pgxpool.Pool, *pgx.Conn, or a pgx.Tx (then Process runs in a
// savepoint of the caller's transaction).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Handler applies a message's effect inside Process's transaction. It must use tx for every
// write that belongs to the message, and should not commit or roll back tx itself.
type Handler func(ctx context.Context, tx pgx.Tx) error

// Inbox deduplicates messages by event id in one inbox table. It is safe for concurrent use.
type Inbox struct {
	table     string // schema.name
	insertSQL string
	pruneSQL  string
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// New returns an Inbox on table "name" (schema public) or "schema.name"; "" means DefaultTable.
func New(table string) (*Inbox, error) {
	if table == "" {
		table = DefaultTable
	}
	schema, name, found := strings.Cut(table, ".")
	if !found {
		schema, name = "public", table
	}
	for _, part := range []string{schema, name} {
		if !identRE.MatchString(part) || len(part) > 63 {
			return nil, fmt.Errorf("%w: %q must be name or schema.name, each matching ^[a-z_][a-z0-9_]*$ with at most 63 characters", ErrInvalidTable, table)
		}
	}
	ident := pgx.Identifier{schema, name}.Sanitize()
	return &Inbox{
		table: schema + "." + name,
		insertSQL: `INSERT INTO ` + ident + ` (event_id, topic, processed_at) VALUES ($1::uuid, $2, now())
ON CONFLICT (event_id) DO NOTHING`,
		// At most $2 rows a statement, found by a scan of the heap from its start (no index on
		// processed_at, which every Process would pay for): the inbox is appended to in time
		// order, so its oldest rows lie first and a scan finds them early.
		pruneSQL: `DELETE FROM ` + ident + ` WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM ` + ident + ` WHERE processed_at < now() - make_interval(secs => $1::float8) LIMIT $2::int))`,
	}, nil
}

// Table returns the inbox table as schema.name.
func (in *Inbox) Table() string { return in.table }

// Process applies msg once. In one transaction it records msg.EventID in the inbox table and, if
// the id was not recorded before, runs handler; then it commits. It returns processed=true when
// handler ran and committed, processed=false with a nil error when the event had already been
// processed (handler not called), and processed=false with an error when nothing was recorded:
// a message without a valid event id (ErrMissingEventID), a database error, or handler's error
// (wrapped; test with errors.Is). In the error cases the transaction is rolled back and a
// redelivery is processed normally.
func (in *Inbox) Process(ctx context.Context, db Beginner, msg Message, handler Handler) (processed bool, err error) {
	id, ok := canonicalUUID(msg.EventID)
	if !ok {
		if msg.EventID == "" {
			return false, ErrMissingEventID
		}
		return false, fmt.Errorf("%w: the event id is not a UUID", ErrMissingEventID)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("inbox: begin: %w", err)
	}
	// A no-op after Commit. Not bound to ctx, so that a cancelled ctx still rolls back cleanly
	// (handler errors and panics included).
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	tag, err := tx.Exec(ctx, in.insertSQL, id, msg.Topic)
	if err != nil {
		return false, fmt.Errorf("inbox: record event %s in %s: %w", id, in.table, err)
	}
	if tag.RowsAffected() == 0 {
		// Already processed: commit the (empty) transaction and skip the handler.
		if err := tx.Commit(ctx); err != nil {
			return false, fmt.Errorf("inbox: commit: %w", err)
		}
		return false, nil
	}
	if err := handler(ctx, tx); err != nil {
		return false, fmt.Errorf("inbox: handler for event %s: %w", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("inbox: commit event %s: %w", id, err)
	}
	return true, nil
}

// ErrInvalidRetention is returned by Prune for a retention or batch that is not positive.
var ErrInvalidRetention = errors.New("inbox: the retention and the batch must be positive")

// Prune deletes the rows processed more than retention ago (by the database's clock), at most
// batch rows per statement, each statement its own transaction, until none is left or ctx ends,
// and returns how many it deleted. Each short statement holds its rows' locks only for itself
// and leaves vacuum a bounded amount of work at a time; a Process of the same event waits for
// the statement at most. See the package documentation for the retention to choose.
func (in *Inbox) Prune(ctx context.Context, db interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, retention time.Duration, batch int) (int64, error) {
	if retention <= 0 || batch <= 0 {
		return 0, ErrInvalidRetention
	}
	var total int64
	for {
		tag, err := db.Exec(ctx, in.pruneSQL, retention.Seconds(), batch)
		if err != nil {
			return total, fmt.Errorf("inbox: prune %s: %w", in.table, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}

// canonicalUUID accepts the 8-4-4-4-12 hexadecimal form, either case, and returns it in lower
// case.
func canonicalUUID(s string) (string, bool) {
	if len(s) != 36 {
		return "", false
	}
	b := []byte(s)
	for i, c := range b {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return "", false
			}
		case '0' <= c && c <= '9' || 'a' <= c && c <= 'f':
		case 'A' <= c && c <= 'F':
			b[i] = c + ('a' - 'A')
		default:
			return "", false
		}
	}
	return string(b), true
}
