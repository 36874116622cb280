package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// baseline is the classic hand-written outbox worker the relay is measured against: poll every
// 200 ms, lock a batch of pending rows with FOR UPDATE SKIP LOCKED, write them with kafka-go,
// mark them sent, commit.
type baseline struct {
	name   string
	batch  int
	writer func(brokers []string, topic string) *kafka.Writer
	// loopWhenFull skips the sleep when a batch came back full.
	loopWhenFull bool
}

// baselineDefaults is the worker as most teams first write it: kafka-go's Writer with nothing
// but the address and topic set (round-robin balancer, BatchSize 100, BatchTimeout 1 s,
// RequiredAcks none), 100 rows every 200 ms.
//
// Every writer gets its own Transport, as it would in its own worker process: kafka-go's shared
// DefaultTransport caches metadata for MetadataTTL (6 s), and a writer for a topic created after
// another writer's metadata request fails with UNKNOWN_TOPIC_OR_PARTITION until it expires.
var baselineDefaults = baseline{
	name:  "baseline (kafka-go defaults)",
	batch: 100,
	writer: func(brokers []string, topic string) *kafka.Writer {
		return &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: &kafka.Transport{}}
	},
}

// baselineTuned is the same worker tuned as far as its design goes: 1,000-row batches, a
// writer batch to match, a millisecond batch timeout, acks from all replicas, the Java client's
// partitioner, and no sleep while batches come back full.
var baselineTuned = baseline{
	name:  "baseline (tuned)",
	batch: 1000,
	writer: func(brokers []string, topic string) *kafka.Writer {
		return &kafka.Writer{
			Addr:         kafka.TCP(brokers...),
			Topic:        topic,
			Balancer:     &kafka.Murmur2Balancer{},
			BatchSize:    1000,
			BatchTimeout: time.Millisecond,
			RequiredAcks: kafka.RequireAll,
			Transport:    &kafka.Transport{},
		}
	},
	loopWhenFull: true,
}

const baselinePoll = 200 * time.Millisecond

// workerConn connects a worker of the benchmark process. done runs finished, when set, and then
// closes the connection, so that the CPU of its PostgreSQL backend can still be read in finished.
func workerConn(dbURL string, finished func()) (conn *pgx.Conn, done func(), err error) {
	conn, err = pgx.Connect(context.Background(), dbURL)
	if err != nil {
		return nil, nil, err
	}
	return conn, func() {
		if finished != nil {
			finished()
		}
		conn.Close(context.Background())
	}, nil
}

// run publishes until no pending row is left or ctx ends, and returns the rows it marked.
// A ctx that ends is not an error: the windowed measurement stops the worker that way, after
// the batch in flight was committed.
// finished, when set, runs before the worker closes its connection (so that the CPU of its
// PostgreSQL backend can still be read).
func (b baseline) run(ctx context.Context, dbURL string, t outboxdb.Table, brokers []string, topic string, finished func()) (int64, error) {
	conn, done, err := workerConn(dbURL, finished)
	if err != nil {
		return 0, err
	}
	defer done()
	w := b.writer(brokers, topic)
	defer func() {
		_ = w.Close()
		if tr, ok := w.Transport.(*kafka.Transport); ok {
			tr.CloseIdleConnections()
		}
	}()

	fetch := fmt.Sprintf(`SELECT id, event_id::text, aggregate_type, aggregate_id, event_type, payload, headers
		FROM %s WHERE sent_at IS NULL ORDER BY id LIMIT %d FOR UPDATE SKIP LOCKED`, t.Ident(), b.batch)
	mark := fmt.Sprintf(`UPDATE %s SET sent_at = now() WHERE id = ANY($1)`, t.Ident())

	var marked int64
	msgs := make([]kafka.Message, 0, b.batch)
	ids := make([]int64, 0, b.batch)
	for ctx.Err() == nil {
		n, err := b.once(conn, w, fetch, mark, &msgs, &ids)
		if err != nil {
			return marked, err
		}
		marked += int64(n)
		if n == 0 {
			return marked, nil
		}
		if n == b.batch && b.loopWhenFull {
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(baselinePoll):
		}
	}
	return marked, nil
}

// once runs one batch: BEGIN, fetch and lock, publish, mark, COMMIT. It runs to completion
// whatever the caller's context does, as a worker finishing its batch on shutdown would.
func (b baseline) once(conn *pgx.Conn, w *kafka.Writer, fetch, mark string, msgs *[]kafka.Message, ids *[]int64) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, fetch)
	if err != nil {
		return 0, fmt.Errorf("fetch: %w", err)
	}
	*msgs, *ids = (*msgs)[:0], (*ids)[:0]
	for rows.Next() {
		var (
			id                                 int64
			eventID, aggType, aggID, eventType string
			payload                            []byte
			headers                            map[string]string
		)
		if err := rows.Scan(&id, &eventID, &aggType, &aggID, &eventType, &payload, &headers); err != nil {
			rows.Close()
			return 0, fmt.Errorf("fetch: %w", err)
		}
		h := []kafka.Header{
			{Key: "event_id", Value: []byte(eventID)},
			{Key: "event_type", Value: []byte(eventType)},
			{Key: "aggregate_type", Value: []byte(aggType)},
			{Key: "aggregate_id", Value: []byte(aggID)},
		}
		for k, v := range headers {
			h = append(h, kafka.Header{Key: k, Value: []byte(v)})
		}
		*msgs = append(*msgs, kafka.Message{Key: []byte(aggID), Value: payload, Headers: h})
		*ids = append(*ids, id)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("fetch: %w", err)
	}
	if len(*ids) == 0 {
		return 0, tx.Commit(ctx)
	}
	if err := w.WriteMessages(ctx, *msgs...); err != nil {
		var we kafka.WriteErrors
		if errors.As(err, &we) {
			return 0, fmt.Errorf("publish: %d of %d messages failed: %w", we.Count(), len(*msgs), err)
		}
		return 0, fmt.Errorf("publish: %w", err)
	}
	if _, err := tx.Exec(ctx, mark, *ids); err != nil {
		return 0, fmt.Errorf("mark: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return len(*ids), nil
}

// ceilingBatch is the batch of the PostgreSQL-only worker, the tuned baseline's.
const ceilingBatch = 1000

// runCeiling is the PostgreSQL work alone of any publisher that locks, reads and marks each row:
// one statement per batch of ceilingBatch rows that locks the oldest pending rows
// (FOR UPDATE SKIP LOCKED), marks them sent and returns the event columns a publisher needs,
// which the client reads and drops. Nothing is published. Its rate bounds every publisher that
// marks rows one by one in this database, the relay and the baselines alike.
func runCeiling(ctx context.Context, dbURL string, t outboxdb.Table, finished func()) (int64, error) {
	conn, done, err := workerConn(dbURL, finished)
	if err != nil {
		return 0, err
	}
	defer done()
	stmt := fmt.Sprintf(`WITH b AS (
  SELECT id, created_at FROM %[1]s WHERE sent_at IS NULL ORDER BY id LIMIT %[2]d FOR UPDATE SKIP LOCKED)
UPDATE %[1]s AS o SET sent_at = now() FROM b WHERE o.id = b.id AND o.created_at = b.created_at
RETURNING o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers`, t.Ident(), ceilingBatch)
	var marked int64
	for ctx.Err() == nil {
		qctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		rows, err := conn.Query(qctx, stmt)
		if err != nil {
			cancel()
			return marked, err
		}
		n := 0
		for rows.Next() {
			_ = rows.RawValues()
			n++
		}
		err = rows.Err()
		cancel()
		if err != nil {
			return marked, err
		}
		marked += int64(n)
		if n == 0 {
			return marked, nil
		}
	}
	return marked, nil
}
