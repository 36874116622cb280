package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/relay"
)

// DrainResult is one measured drain rate.
type DrainResult struct {
	Key     string    `json:"key"`
	Name    string    `json:"name"`
	Events  int64     `json:"events"`  // rows marked sent in the measurement
	Seconds float64   `json:"seconds"` // from start to the commit of the last mark
	Rate    float64   `json:"rate"`    // events per second
	Rounds  []float64 `json:"rounds,omitempty"`
	PeakRSS int64     `json:"peakRSS,omitempty"` // bytes, largest VmHWM of the relay processes
	CPU     *CPUUsage `json:"cpu,omitempty"`
	Method  string    `json:"method"`
	Plan    string    `json:"plan,omitempty"` // the relay's fetch plan when the rows were committed
	// Compression is the relays' --compression (empty: none).
	Compression string `json:"compression,omitempty"`
	// TopicBytes is what the topic holds on the broker's disk after the drain (its log
	// segments, as the broker describes its log directories).
	TopicBytes int64  `json:"topicBytes,omitempty"`
	Err        string `json:"error,omitempty"`
	Measured   bool   `json:"measured"`
	// MergedRun is when the run that measured it started, for a drain merged into an earlier
	// run's results (-merge-into); nil for the run's own.
	MergedRun *time.Time `json:"mergedRun,omitempty"`
}

func (r *DrainResult) fail(err error) {
	r.Err = err.Error()
	progress("%s: FAILED: %v", r.Name, err)
}

// idRange is the ids of the rows a measurement publishes.
type idRange struct{ lo, hi int64 }

// marked counts the rows of r marked sent and returns the commit time of the transaction that
// marked the last of them (track_commit_timestamp is on): the exact end of a drain, whoever
// marked and however the harness polled.
func marked(ctx context.Context, conn *pgx.Conn, e *env, r idRange) (int64, time.Time, error) {
	if e.snap != nil {
		return e.snap.passed(ctx, conn, e.table, r)
	}
	var n int64
	var last *time.Time
	err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), max(pg_xact_commit_timestamp(xmin))
		FROM %s WHERE id BETWEEN $1 AND $2 AND sent_at IS NOT NULL`, e.table.Ident()), r.lo, r.hi).Scan(&n, &last)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("count marked rows: %w", err)
	}
	if last == nil {
		return n, time.Time{}, nil
	}
	return n, *last, nil
}

// waitDrained waits until no row of r is pending. alive reports a publisher that died. It
// fails when nothing was marked for stall (a stuck publisher), with the last progress seen.
//
// status, when set, adds to the progress line (the relays' outbox_published_total).
func waitDrained(ctx context.Context, conn *pgx.Conn, e *env, r idRange, what string, alive func() error, stall time.Duration, status func() string) error {
	pendingQ := fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE sent_at IS NULL AND id BETWEEN $1 AND $2)`, e.table.Ident())
	// Cumulative row updates of the table's partitions: a cheap progress signal for any publisher.
	updatesQ := `SELECT coalesce(sum(n_tup_upd), 0)::bigint FROM pg_stat_user_tables WHERE relid IN (
		SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)`
	if e.snap != nil {
		updatesQ = e.snap.progressQuery(e.table)
	}
	var lastUpd int64 = -1
	lastMove, lastReport, start := time.Now(), time.Now(), time.Now()
	for {
		if err := alive(); err != nil {
			return err
		}
		var pending bool
		var err error
		if e.snap != nil {
			pending, err = e.snap.pending(ctx, conn, e.table)
		} else {
			err = conn.QueryRow(ctx, pendingQ, r.lo, r.hi).Scan(&pending)
		}
		if err != nil {
			return fmt.Errorf("poll pending rows: %w", err)
		}
		if !pending {
			return nil
		}
		var upd int64
		if err := conn.QueryRow(ctx, updatesQ, e.table.Ident()).Scan(&upd); err != nil {
			return fmt.Errorf("poll progress: %w", err)
		}
		if upd != lastUpd {
			lastUpd, lastMove = upd, time.Now()
		} else if time.Since(lastMove) > stall {
			return fmt.Errorf("%s: no row marked for %s", what, stall)
		}
		if time.Since(lastReport) >= 10*time.Second {
			lastReport = time.Now()
			extra := ""
			if status != nil {
				extra = status()
			}
			progress("%s: draining, %s elapsed%s", what, time.Since(start).Round(time.Second), extra)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// cpuGroups returns the process groups to attribute CPU to, with relays from g.
func (e *env) cpuGroups(g *relayGroup) cpuGroups {
	cg := cpuGroups{pgMaster: postmasterPid(e.pg.DataDir), kafka: e.kafkaPid}
	if g != nil {
		cg.relay = func() []int { return g.pids() }
	}
	return cg
}

// worker is a publisher that runs in the benchmark process: it marks rows until none is pending
// or ctx ends, calls finished before it closes its connection, and returns the rows it marked.
type worker func(ctx context.Context, finished func()) (int64, error)

// drainBaseline measures a baseline worker over the backlog in r. With window > 0 the worker
// stops starting batches after window and the rate is over what it marked until then.
func (e *env) drainBaseline(ctx context.Context, res *DrainResult, b baseline, dbURL, topic string, r idRange, window time.Duration) {
	e.drainWorker(ctx, res, func(ctx context.Context, finished func()) (int64, error) {
		return b.run(ctx, dbURL, e.table, e.kafka.Brokers, topic, finished)
	}, dbURL, r, window)
}

// drainWorker measures a worker of the benchmark process over the backlog in r (see drainBaseline).
func (e *env) drainWorker(ctx context.Context, res *DrainResult, run worker, dbURL string, r idRange, window time.Duration) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		res.fail(err)
		return
	}
	defer conn.Close(context.Background())
	cg := e.cpuGroups(nil)
	var after cpuSnapshot
	finished := func() { after = cg.snapshot() }
	before := cg.snapshot()
	start := time.Now()
	if window > 0 {
		wctx, cancel := context.WithTimeout(ctx, window)
		_, err = run(wctx, finished)
		cancel()
		if err == nil && ctx.Err() != nil {
			err = ctx.Err()
		}
	} else {
		done := make(chan error, 1)
		wctx, cancel := context.WithCancel(ctx)
		go func() {
			_, err := run(wctx, finished)
			done <- err
		}()
		var workerErr error
		finished := false
		err = waitDrained(ctx, conn, e, r, res.Name, func() error {
			if finished {
				return workerErr
			}
			select {
			case workerErr = <-done:
				finished = true
				return workerErr
			default:
				return nil
			}
		}, 60*time.Second, nil)
		cancel()
		if !finished {
			if werr := <-done; err == nil {
				err = werr
			}
		}
	}
	if err != nil {
		res.fail(err)
		return
	}
	usage := usageSince(before, after)
	e.finishDrain(ctx, conn, res, r, start, &usage)
}

// drainRelays measures shards relay processes over the backlog in r, from their start to the
// commit of the last mark: process start, locks and connections are part of the time.
func (e *env) drainRelays(ctx context.Context, res *DrainResult, dbURL, topic string, r idRange, shards int, snapshot bool) {
	e.drainRelaysBut(ctx, res, dbURL, topic, r, shards, snapshot, -1)
}

// drainRelaysBut is drainRelays with shard index stopped (none when negative) not started.
func (e *env) drainRelaysBut(ctx context.Context, res *DrainResult, dbURL, topic string, r idRange, shards int, snapshot bool, stopped int) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		res.fail(err)
		return
	}
	defer conn.Close(context.Background())
	if snapshot {
		if e.snap, err = watchSnapshot(ctx, conn, e.table, r); err != nil {
			res.fail(err)
			return
		}
		defer func() { e.snap = nil }()
	}
	var g relayGroup
	cg := e.cpuGroups(&g)
	defer e.statementsTop(ctx, conn, res.Name)()
	before := cg.snapshot()
	start := time.Now()
	for i := range shards {
		if i == stopped {
			continue
		}
		p, err := e.startRelay(ctx, fmt.Sprintf("%s-shard%d", res.Key, i), dbURL, topic,
			relayOptions{shardCount: shards, shardIndex: i, batchSize: e.cfg.relayBatch, snapshot: snapshot, compression: res.Compression})
		if err != nil {
			_ = g.stop()
			res.fail(err)
			return
		}
		g = append(g, p)
	}
	err = waitDrained(ctx, conn, e, r, res.Name, g.checkRunning, 60*time.Second, g.status)
	usage := usageSince(before, cg.snapshot())
	rss, rssErr := g.peakRSS()
	stopErr := g.stop()
	if err = errors.Join(err, rssErr, stopErr); err != nil {
		res.fail(err)
		return
	}
	res.PeakRSS = rss
	e.finishDrain(ctx, conn, res, r, start, &usage)
}

func (e *env) finishDrain(ctx context.Context, conn *pgx.Conn, res *DrainResult, r idRange, start time.Time, usage *CPUUsage) {
	n, last, err := marked(ctx, conn, e, r)
	if err != nil {
		res.fail(err)
		return
	}
	if n == 0 || !last.After(start) {
		res.fail(fmt.Errorf("nothing was marked sent"))
		return
	}
	res.Events, res.Seconds = n, last.Sub(start).Seconds()
	res.Rate = float64(n) / res.Seconds
	res.CPU = usage
	res.Measured = true
	progress("%s: %d events in %.2fs = %.0f events/s", res.Name, n, res.Seconds, res.Rate)
}

// statsMode is what the planner's statistics say when a round's rows are committed.
type statsMode int

const (
	// statsAsIs leaves statistics to autovacuum.
	statsAsIs statsMode = iota
	// statsBefore analyzes the table just before the insert, while every row is sent: the
	// statistics of a quiet system that a sudden burst of events meets (until autovacuum
	// analyzes again, up to a minute later).
	statsBefore
	// statsCurrent analyzes in the inserting transaction: the statistics autovacuum would have
	// gathered while a backlog built up over time.
	statsCurrent
)

// rounds describes a series of drain rounds against relays that already run.
type rounds struct {
	n     int64     // events per round, committed in one transaction
	count int       // rounds
	stats statsMode // what the planner knows when the relay sees the rows
	// limit, when set, stops waiting for a round after this long; its rate is then over the
	// rows marked until then (a windowed measurement).
	limit time.Duration
	// snapshot: the relays track by snapshot; a round ends when their cursors pass it.
	snapshot bool
}

// roundsResult is what a series of rounds measured.
type roundsResult struct {
	rates   []float64
	plan    string // the relay's fetch plan right after the first commit
	partial int64  // when the last round was cut by limit: the rows it marked
	limit   time.Duration
}

// runRounds drains rounds of events against relays that are already running and idle, and
// returns the rate of each round: the rows marked divided by the time from the commit of the
// insert to the commit of the last mark, both PostgreSQL commit timestamps.
func (e *env) runRounds(ctx context.Context, dbURL string, g relayGroup, spec rounds, what string) (roundsResult, error) {
	res := roundsResult{limit: spec.limit}
	defer func() { e.snap = nil }()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return res, err
	}
	defer conn.Close(context.Background())
	seq := e.table.Derived("id_seq")
	for i := range spec.count {
		if err := g.checkRunning(); err != nil {
			return res, err
		}
		if spec.stats == statsBefore {
			if _, err := conn.Exec(ctx, "ANALYZE "+e.table.Ident()); err != nil {
				return res, fmt.Errorf("analyze: %w", err)
			}
		}
		var r idRange
		var xid int64
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, "SELECT nextval($1::regclass), txid_current()", seq).Scan(&r.lo, &xid); err != nil {
				return err
			}
			if err := insertPending(ctx, tx, e.table, r.lo, spec.n, e.cfg.aggregates); err != nil {
				return err
			}
			if spec.stats == statsCurrent {
				// ANALYZE counts the rows its own transaction inserted; the statistics commit
				// with them.
				if _, err := tx.Exec(ctx, "ANALYZE "+e.table.Ident()); err != nil {
					return fmt.Errorf("analyze: %w", err)
				}
			}
			return tx.QueryRow(ctx, "SELECT currval($1::regclass)", seq).Scan(&r.hi)
		})
		if err != nil {
			return res, fmt.Errorf("insert round: %w", err)
		}
		var committed time.Time
		if err := conn.QueryRow(ctx, "SELECT pg_xact_commit_timestamp($1::text::xid)", strconv.FormatInt(xid, 10)).Scan(&committed); err != nil {
			return res, fmt.Errorf("commit time of the insert: %w", err)
		}
		if spec.snapshot {
			e.snap = &snapWatch{txids: []string{strconv.FormatInt(xid, 10)}}
		} else if i == 0 {
			res.plan = e.fetchPlan(ctx, conn, r)
		}
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if spec.limit > 0 {
			wctx, cancel = context.WithDeadline(ctx, committed.Add(spec.limit))
		}
		// A generous stall limit: a fetch planned on stale statistics may sort the whole backlog.
		err = waitDrained(wctx, conn, e, r, what, g.checkRunning, 3*time.Minute, g.status)
		cancel()
		cut := err != nil && ctx.Err() == nil && wctx.Err() != nil
		if err != nil && !cut {
			return res, err
		}
		got, last, err := marked(ctx, conn, e, r)
		if err != nil {
			return res, err
		}
		if got == 0 {
			return res, fmt.Errorf("round %d: nothing marked", i+1)
		}
		if !cut && got != spec.n {
			return res, fmt.Errorf("round %d: %d of %d rows marked", i+1, got, spec.n)
		}
		if cut {
			res.partial = got
		}
		secs := last.Sub(committed).Seconds()
		rate := float64(got) / secs
		progress("%s: round %d/%d: %d of %d events in %.3fs = %.0f events/s", what, i+1, spec.count, got, spec.n, secs, rate)
		res.rates = append(res.rates, rate)
	}
	return res, nil
}

// fetchPlan is the shape of the plan PostgreSQL chooses for the relay's fetch (the statement
// relay.FetchSQL returns, with a batch in flight, on a session tuned by relay.TuneFetchSession)
// at this moment, e.g.
// "Limit > LockRows > Merge Append > Index Scan": planning only, nothing is executed.
func (e *env) fetchPlan(ctx context.Context, conn *pgx.Conn, r idRange) string {
	batch := 500
	if e.cfg.relayBatch > 0 {
		batch = e.cfg.relayBatch
	}
	inflight := make([]int64, 0, batch)
	for id := r.lo; id <= r.hi && len(inflight) < batch; id++ {
		inflight = append(inflight, id)
	}
	q, args, err := relay.FetchSQL(e.table, 1, 0, batch, inflight, nil)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	// Planned on a session set up as the relay's lock connection is.
	sess, err := pgx.ConnectConfig(ctx, conn.Config())
	if err != nil {
		return "(" + firstLine(err.Error(), 80) + ")"
	}
	defer sess.Close(context.Background())
	if err := relay.TuneFetchSession(ctx, sess); err != nil {
		return "(" + firstLine(err.Error(), 80) + ")"
	}
	var doc []byte
	if err := sess.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+q, args...).Scan(&doc); err != nil {
		return "(explain failed: " + firstLine(err.Error(), 80) + ")"
	}
	var plans []struct{ Plan planNode }
	if err := json.Unmarshal(doc, &plans); err != nil || len(plans) == 0 {
		return "(unreadable plan)"
	}
	return plans[0].Plan.shape()
}

type planNode struct {
	NodeType string     `json:"Node Type"`
	Plans    []planNode `json:"Plans"`
}

// shape lists the node types from the root down the first child, and for a node with several
// children (the partitions) the distinct node types below it.
func (n planNode) shape() string {
	parts := []string{n.NodeType}
	for len(n.Plans) == 1 {
		n = n.Plans[0]
		parts = append(parts, n.NodeType)
	}
	if len(n.Plans) > 1 {
		var kinds []string
		for _, c := range n.Plans {
			k := c.shape()
			if !slices.Contains(kinds, k) {
				kinds = append(kinds, k)
			}
		}
		parts = append(parts, strings.Join(kinds, " | "))
	}
	return strings.Join(parts, " > ")
}
