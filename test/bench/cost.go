package main

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// The cost of a publisher per event, counted by observers independent of it (never its own
// metrics): its statements on PostgreSQL (pg_stat_statements), the transaction ids it drew
// (the server's snapshot xmax, less the writers' transactions), and the Kafka record batches an
// independent consumer reads (a franz-go fetch hook).
//
// The publisher is told from everyone else on the server by its role: it connects as
// publisherRole, the writers, the bench's observers and its checks as the server's own user.
// pg_stat_statements keys its entries by role (userid), database and query, so the publisher's
// statements are exactly the entries of its role, whatever their text; an application name
// would not do (the relay rewrites its lock connection's application_name to carry its state,
// and pg_stat_statements does not record it). The role is a superuser, as the writers' is, so
// that the publisher may do exactly what it did before (Debezium's replication connection and
// slot included).

// publisherRole is the role the publishers of the debezium and idle scenarios connect as.
const publisherRole = "bench_publisher"

// createPublisherRole creates publisherRole on srv (once per server).
func createPublisherRole(ctx context.Context, srv *pgtest.Server) error {
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, publisherRole).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE ROLE "+pgx.Identifier{publisherRole}.Sanitize()+" LOGIN SUPERUSER")
	return err
}

// withUser returns dbURL connecting as user (the server trusts local connections).
func withUser(dbURL, user string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return dbURL
	}
	u.User = url.User(user)
	return u.String()
}

// pgCounters are the server's counters at one moment, as the observer reads them.
type pgCounters struct {
	// statements: pg_stat_statements calls of publisherRole (every database); all: of every role
	// (the observer's own reads included). Both -1 without pg_stat_statements.
	statements, all int64
	// xmax is pg_snapshot_xmax(pg_current_snapshot()): one past the newest transaction id
	// completed. Reading it draws no transaction id.
	xmax int64
	// xacts is xact_commit + xact_rollback of the observed database (pg_stat_database; backends
	// report theirs within a second or so, so it suits windows of many seconds).
	xacts int64
	// rollbacks is the part of xacts rolled back (a statement cancelled or failed among them).
	rollbacks int64
	// dealloc is pg_stat_statements_info.dealloc: entries evicted, whose calls a difference loses.
	dealloc int64
}

// pgObserver reads pgCounters on its own connection to the maintenance database.
type pgObserver struct {
	conn *pgx.Conn
	db   string // the database whose transactions xacts counts ("" for none)
	pss  bool   // pg_stat_statements is loaded
	info bool   // pg_stat_statements_info exists (PostgreSQL 14 and later)
}

// newPGObserver connects to srv. Without pg_stat_statements loaded (shared_preload_libraries)
// statements are not counted.
func newPGObserver(ctx context.Context, srv *pgtest.Server, db string) (*pgObserver, error) {
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		return nil, err
	}
	o := &pgObserver{conn: conn, db: db}
	var loaded bool
	if err := conn.QueryRow(ctx, `SELECT 'pg_stat_statements' = ANY (string_to_array(current_setting('shared_preload_libraries'), ', '))`).Scan(&loaded); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	if loaded {
		if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
			conn.Close(context.Background())
			return nil, fmt.Errorf("pg_stat_statements: %w", err)
		}
		o.pss = true
		if err := conn.QueryRow(ctx, `SELECT to_regclass('pg_stat_statements_info') IS NOT NULL`).Scan(&o.info); err != nil {
			conn.Close(context.Background())
			return nil, err
		}
	}
	return o, nil
}

func (o *pgObserver) close() { o.conn.Close(context.Background()) }

// read returns the counters now. Every statement runs on its own, outside a transaction: none
// draws a transaction id, and pg_stat_database is read afresh.
func (o *pgObserver) read(ctx context.Context) (pgCounters, error) {
	c := pgCounters{statements: -1, all: -1}
	if err := o.conn.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8`).Scan(&c.xmax); err != nil {
		return c, fmt.Errorf("snapshot xmax: %w", err)
	}
	if o.pss {
		if err := o.conn.QueryRow(ctx, `SELECT coalesce(sum(calls) FILTER (WHERE userid = (SELECT oid FROM pg_roles WHERE rolname = $1)), 0)::int8,
  coalesce(sum(calls), 0)::int8 FROM pg_stat_statements`, publisherRole).Scan(&c.statements, &c.all); err != nil {
			return c, fmt.Errorf("pg_stat_statements: %w", err)
		}
	}
	if o.info {
		if err := o.conn.QueryRow(ctx, `SELECT dealloc FROM pg_stat_statements_info`).Scan(&c.dealloc); err != nil {
			return c, fmt.Errorf("pg_stat_statements: %w", err)
		}
	}
	if o.db != "" {
		if err := o.conn.QueryRow(ctx, `SELECT coalesce(sum(xact_commit + xact_rollback), 0)::int8, coalesce(sum(xact_rollback), 0)::int8
  FROM pg_stat_database WHERE datname = $1`, o.db).Scan(&c.xacts, &c.rollbacks); err != nil {
			return c, fmt.Errorf("pg_stat_database: %w", err)
		}
	}
	return c, nil
}

// EventCost is what a publisher cost per event during a latency run, from independent
// observers: PostgreSQL's statements and transaction ids over the counting window (from the
// end of the warm-up to the last event received), and the record batches of the measured
// events as an independent consumer read them.
type EventCost struct {
	Seconds float64 `json:"seconds"` // the counting window
	// Events: the writers' transactions committed in the window, one event each.
	Events int64 `json:"events"`
	// Statements: pg_stat_statements calls of the publisher's role in the window (BEGIN and
	// COMMIT count, as round trips); -1 when pg_stat_statements was not loaded.
	Statements int64 `json:"statements"`
	// Xids: transaction ids assigned in the window (the advance of the snapshot xmax) less the
	// writers' Events transactions: the publisher's, plus any autovacuum's (ANALYZE).
	Xids int64 `json:"xids"`
	// RecordBatches: the record batches holding measured events (those after the warm-up; a
	// batch that straddles the warm-up's end counts), and BatchedEvents the measured records in
	// them, duplicates included.
	RecordBatches int `json:"recordBatches"`
	BatchedEvents int `json:"batchedEvents"`
}

// StatementsPerEvent is the publisher's statements per event; false when not counted.
func (c *EventCost) StatementsPerEvent() (float64, bool) {
	if c == nil || c.Statements < 0 || c.Events <= 0 {
		return 0, false
	}
	return float64(c.Statements) / float64(c.Events), true
}

// XidsPerEvent is the transaction ids drawn per event by others than the writers (a little
// below zero is the counting's noise); false when not counted.
func (c *EventCost) XidsPerEvent() (float64, bool) {
	if c == nil || c.Events <= 0 {
		return 0, false
	}
	return float64(c.Xids) / float64(c.Events), true
}

// EventsPerBatch is how many measured events a record batch held on average; false when no
// batch was counted.
func (c *EventCost) EventsPerBatch() (float64, bool) {
	if c == nil || c.RecordBatches <= 0 {
		return 0, false
	}
	return float64(c.BatchedEvents) / float64(c.RecordBatches), true
}

// costOf is the cost between two readings a and b, w writer transactions committed in between,
// over secs seconds.
func costOf(a, b pgCounters, w int64, secs float64) EventCost {
	c := EventCost{Seconds: secs, Events: w, Statements: -1, Xids: b.xmax - a.xmax - w}
	if a.statements >= 0 && b.statements >= 0 && a.dealloc == b.dealloc {
		c.Statements = b.statements - a.statements
	}
	return c
}

// batchCounter is a franz-go hook (kgo.HookFetchBatchRead) that records, per partition and in
// order, how many records each batch the consumer read held; records then tells, from the
// records as they were polled (in offset order per partition), which batches held which.
type batchCounter struct {
	mu    sync.Mutex
	sizes map[int32][]int
	seqs  map[int32][]int // per partition, each record's sequence number as polled (-1: not an event of the run)
}

func newBatchCounter() *batchCounter {
	return &batchCounter{sizes: map[int32][]int{}, seqs: map[int32][]int{}}
}

func (b *batchCounter) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, partition int32, m kgo.FetchBatchMetrics) {
	if m.NumRecords <= 0 {
		return
	}
	b.mu.Lock()
	b.sizes[partition] = append(b.sizes[partition], m.NumRecords)
	b.mu.Unlock()
}

// polled notes one record as the consumer polled it.
func (b *batchCounter) polled(partition int32, seq int) {
	b.mu.Lock()
	b.seqs[partition] = append(b.seqs[partition], seq)
	b.mu.Unlock()
}

// count returns the batches that held at least one record for which measured is true, and how
// many such records they held.
func (b *batchCounter) count(measured func(seq int) bool) (batches, records int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return countBatches(b.sizes, b.seqs, measured)
}

// countBatches walks each partition's batches (their sizes, in order) over its records (in
// order): a batch read but whose records were never polled (the consumer stopped) holds none.
func countBatches(sizes, seqs map[int32][]int, measured func(seq int) bool) (batches, records int) {
	parts := make([]int32, 0, len(sizes))
	for p := range sizes {
		parts = append(parts, p)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
	for _, p := range parts {
		recs := seqs[p]
		at := 0
		for _, n := range sizes[p] {
			end := min(at+n, len(recs))
			in := 0
			for _, s := range recs[at:end] {
				if measured(s) {
					in++
				}
			}
			if in > 0 {
				batches++
				records += in
			}
			at = end
		}
	}
	return batches, records
}

// summary is the cost for progress lines.
func (c *EventCost) summary() string {
	if c == nil {
		return "no cost counted"
	}
	var parts []string
	if v, ok := c.StatementsPerEvent(); ok {
		parts = append(parts, fmt.Sprintf("%.2f statements", v))
	}
	if v, ok := c.XidsPerEvent(); ok {
		parts = append(parts, fmt.Sprintf("%.3f transaction ids", v))
	}
	s := "per event"
	if len(parts) > 0 {
		s = strings.Join(parts, ", ") + " per event"
	}
	if v, ok := c.EventsPerBatch(); ok {
		s += fmt.Sprintf(", %.1f events per record batch (%d batches)", v, c.RecordBatches)
	}
	return s
}
