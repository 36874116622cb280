package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// The idle scenario (issue 28): many shards with nothing to publish on one database, what they
// cost PostgreSQL. Tables outbox tables in one database, each published by idleShardsPerTable
// relay processes (--shard-count 2 --shard-index i), started directly as the bench starts every
// relay; at full size 50 x 2 = 100 shards, as 50 OutboxRelays of 2 shards would run. For each
// wake-up mode (polling, the default; --notify with the tables' insert trigger):
//
//   - idle: the relays running, nothing written, for the idle window (2 minutes at full size):
//     PostgreSQL's CPU (every process of the server) and the relays' statements per second;
//   - the first event after the long idle (10 minutes at full size, the idle window included):
//     one event committed into each table, commit to an independent consumer;
//   - fed: each relay fed about 1 event/s (one writer committing, round robin over the tables,
//     idleShardsPerTable events/s per table on random aggregates), for the fed window: the same
//     counters, and the events' latency.
//
// Each mode gets its own server (the counters and the CPU are per server) and topic. To fit the
// long idle of every mode in about 15 minutes, the modes overlap: the second mode's relays start
// when the first mode's idle window ends and idle while the first mode is fed, and its first
// events follow the first mode's end (its relays stopped). So polling, the costlier mode, runs
// first and alone in its idle window; the next modes' idle windows have the earlier modes'
// relays running beside them (on their own servers: other processes' CPU only).

const (
	idleShardsPerTable = 2
	idleTargetShards   = 100  // the shards the targets are stated for
	targetIdleStmtsSec = 50.0 // statements/s of all idleTargetShards idle shards
	targetIdlePGPct    = 5.0  // % of a core, PostgreSQL, all idleTargetShards idle shards
	idleFedPerRelay    = 1.0  // events/s per relay while fed
	idleDB             = "bench_idle"
)

// idleModeKeys are the modes -idle-modes accepts: wake-up mode, and tracking mode.
var idleModeKeys = []string{"poll", "notify", "poll-snapshot", "notify-snapshot"}

// IdleResult is the idle scenario.
type IdleResult struct {
	Tables         int        `json:"tables"`
	ShardsPerTable int        `json:"shardsPerTable"`
	WindowSec      float64    `json:"windowSec"`   // the idle window
	LongIdleSec    float64    `json:"longIdleSec"` // how long the relays idle before the first events
	FedSec         float64    `json:"fedSec"`      // the fed window
	FedPerRelay    float64    `json:"fedPerRelay"` // events/s per relay while fed (on average over random aggregates)
	Settings       string     `json:"settings"`
	Runs           []*IdleRun `json:"runs"`
	Err            string     `json:"error,omitempty"`
}

func (r *IdleResult) relays() int { return r.Tables * r.ShardsPerTable }

// IdleRun is one mode of the idle scenario.
type IdleRun struct {
	Key      string  `json:"key"`
	Name     string  `json:"name"`
	Notify   bool    `json:"notify,omitempty"`
	Snapshot bool    `json:"snapshot,omitempty"`
	PollMs   float64 `json:"pollMs"`
	// IdlePollMs: the longest wait of an idle polling relay (contract.IdlePollInterval), reached
	// after an idle spell of contract.IdleBackoffShare times it; 0 for relays that listen.
	IdlePollMs float64 `json:"idlePollMs,omitempty"`
	ReadyMs    float64 `json:"readyMs"` // from starting the first relay to the last one ready
	// Alongside: the modes whose relays ran (idle, on their own servers) during this mode's idle
	// window.
	Alongside []string `json:"alongside,omitempty"`
	// Ramp: relays that back off, their idle spell from a few seconds after the last one was
	// ready until their waits reach the idle poll interval (the idle window follows).
	Ramp *IdleCost `json:"ramp,omitempty"`
	Idle *IdleCost `json:"idle,omitempty"`
	// IdleForSec: how long the relays had been idle (since the last one was ready) when the first
	// events were committed.
	IdleForSec float64      `json:"idleForSec,omitempty"`
	First      *IdleLatency `json:"first,omitempty"`
	Fed        *IdleCost    `json:"fed,omitempty"`
	FedLatency *IdleLatency `json:"fedLatency,omitempty"`
	PeakRSS    int64        `json:"peakRSS,omitempty"` // the largest relay's VmHWM
	Err        string       `json:"error,omitempty"`
}

func (r *IdleRun) fail(err error) {
	r.Err = strings.TrimPrefix(errors.Join(errors.New(r.Err), err).Error(), "\n")
	progress("idle %s: FAILED: %v", r.Key, err)
}

// IdleCost is what the relays cost over one window, from observers independent of them.
type IdleCost struct {
	Seconds float64 `json:"seconds"`
	Events  int64   `json:"events"` // the writer's transactions (one event each)
	// CPU seconds: every process of the server (postmaster, backends, background workers), of
	// which the relays' backends; the relay processes; the whole machine.
	PostgresCPU      float64 `json:"postgresCPU"`
	PostgresRelayCPU float64 `json:"postgresRelayCPU"`
	RelayCPU         float64 `json:"relayCPU"`
	MachineCPU       float64 `json:"machineCPU"`
	// Statements: pg_stat_statements calls of the relays' role; AllStatements of every role (the
	// writer's and the observer's included).
	Statements    int64 `json:"statements"`
	AllStatements int64 `json:"allStatements"`
	// Xacts: xact_commit + xact_rollback of the database (pg_stat_database: every session, the
	// writer's included; backends report within about a second).
	Xacts int64 `json:"xacts"`
	// Rollbacks: the part of Xacts rolled back (statements cancelled or failed, which
	// pg_stat_statements does not record).
	Rollbacks int64 `json:"rollbacks"`
	// Evicted: pg_stat_statements entries evicted during the window (pg_stat_statements.max): the
	// statements are then undercounted.
	Evicted int64 `json:"evicted,omitempty"`
	// Xids: transaction ids assigned (the snapshot xmax's advance) less the writer's.
	Xids int64 `json:"xids"`
}

func (c *IdleCost) perSec(v float64) float64 {
	if c == nil || c.Seconds <= 0 {
		return 0
	}
	return v / c.Seconds
}

// PostgresPct is PostgreSQL's CPU in % of a core.
func (c *IdleCost) PostgresPct() float64 { return c.perSec(c.PostgresCPU) * 100 }

// RelayPct is the relay processes' CPU in % of a core.
func (c *IdleCost) RelayPct() float64 { return c.perSec(c.RelayCPU) * 100 }

// StatementsPerSec is the relays' statements per second.
func (c *IdleCost) StatementsPerSec() float64 { return c.perSec(float64(c.Statements)) }

// XactsPerSec is the database's transactions per second, the writer's taken off.
func (c *IdleCost) XactsPerSec() float64 { return c.perSec(float64(c.Xacts - c.Events)) }

// XidsPerSec is the transaction ids per second drawn by others than the writer.
func (c *IdleCost) XidsPerSec() float64 { return c.perSec(float64(c.Xids)) }

// IdleLatency is commit to consumer over some events.
type IdleLatency struct {
	Events    int     `json:"events"`
	P50       float64 `json:"p50ms"`
	P99       float64 `json:"p99ms"`
	Max       float64 `json:"maxms"`
	PickupP50 float64 `json:"pickupP50ms"` // commit to the broker's append
	PickupMax float64 `json:"pickupMaxms"`
}

// idleLatency computes the latency of the events committed at commit[seq], received at recv[seq]
// and appended by the broker at app[seq].
func idleLatency(commit, recv, app map[int]time.Time) *IdleLatency {
	var lat, pick []time.Duration
	for seq, c := range commit {
		r, ok := recv[seq]
		if !ok {
			continue
		}
		lat = append(lat, max(0, r.Sub(c)))
		pick = append(pick, max(0, app[seq].Sub(c)))
	}
	if len(lat) == 0 {
		return nil
	}
	slices.Sort(lat)
	slices.Sort(pick)
	return &IdleLatency{Events: len(lat), P50: ms(percentile(lat, 50)), P99: ms(percentile(lat, 99)), Max: ms(lat[len(lat)-1]),
		PickupP50: ms(percentile(pick, 50)), PickupMax: ms(pick[len(pick)-1])}
}

// seqWatch is an independent consumer that records when each event (by its payload's seq)
// arrives, and the broker's append time.
type seqWatch struct {
	cl       *kgo.Client
	cancel   context.CancelFunc
	done     chan struct{}
	once     sync.Once
	mu       sync.Mutex
	arrived  map[int]time.Time
	appended map[int]time.Time
	foreign  int
}

func (e *env) watchSeqs(ctx context.Context, topic string) (*seqWatch, error) {
	cl, err := e.newTopicConsumer(topic)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &seqWatch{cl: cl, cancel: cancel, done: make(chan struct{}), arrived: map[int]time.Time{}, appended: map[int]time.Time{}}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			fetches := cl.PollFetches(ctx)
			now := time.Now()
			w.mu.Lock()
			fetches.EachRecord(func(r *kgo.Record) {
				var v struct{ Seq *int }
				if json.Unmarshal(r.Value, &v) != nil || v.Seq == nil {
					w.foreign++
					return
				}
				if _, ok := w.arrived[*v.Seq]; !ok {
					w.arrived[*v.Seq], w.appended[*v.Seq] = now, r.Timestamp
				}
			})
			w.mu.Unlock()
		}
	}()
	return w, nil
}

func (w *seqWatch) close() {
	w.once.Do(func() {
		w.cancel()
		<-w.done
		w.cl.Close()
	})
}

// times returns copies of the arrival and append times of the seqs given.
func (w *seqWatch) times(seqs map[int]time.Time) (recv, app map[int]time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	recv, app = map[int]time.Time{}, map[int]time.Time{}
	for s := range seqs {
		if t, ok := w.arrived[s]; ok {
			recv[s], app[s] = t, w.appended[s]
		}
	}
	return recv, app
}

// waitAll waits until every seq of seqs arrived, the relays alive, at most limit.
func (w *seqWatch) waitAll(ctx context.Context, seqs map[int]time.Time, g relayGroup, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		recv, _ := w.times(seqs)
		if len(recv) == len(seqs) {
			return nil
		}
		if err := g.checkRunning(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d events received within %s", len(recv), len(seqs), limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// idleSet is one mode's server, tables, relays and consumer.
type idleSet struct {
	run     *IdleRun
	srv     *pgtest.Server
	url     string
	tables  []outboxdb.Table
	relays  relayGroup
	cg      cpuGroups
	obs     *pgObserver
	topic   string
	watch   *seqWatch
	writer  *pgx.Conn
	readyAt time.Time
	seq     int
	cleanup []func() // run by close, last first
}

// idleSettings are the idle servers' settings on top of the test server's: pg_stat_statements,
// and connections for every relay (two each, a third for replays) and the bench.
func idleSettings(tables int) []string {
	return []string{"shared_preload_libraries = 'pg_stat_statements'",
		fmt.Sprintf("max_connections = %d", 3*tables*idleShardsPerTable+50)}
}

func idleTable(i int) outboxdb.Table {
	return outboxdb.MustParseTable(fmt.Sprintf("public.outbox_idle_%02d", i))
}

func (e *env) startIdleSet(ctx context.Context, r *IdleResult, run *IdleRun) (s *idleSet, err error) {
	s = &idleSet{run: run}
	defer func() {
		if err != nil {
			s.close(context.Background())
			s = nil
		}
	}()
	progress("idle %s: starting PostgreSQL (%s)", run.Key, r.Settings)
	if s.srv, err = startServerWith(ctx, idleSettings(r.Tables)...); err != nil {
		return s, err
	}
	if err = createPublisherRole(ctx, s.srv); err != nil {
		return s, err
	}
	progress("idle %s: %d outbox tables in database %s", run.Key, r.Tables, idleDB)
	for i := range r.Tables {
		t := idleTable(i + 1)
		s.tables = append(s.tables, t)
		if i == 0 {
			s.url, err = createDatabaseOn(ctx, s.srv, t, idleDB, 1)
		} else {
			err = pgtest.OutboxSchema(ctx, s.url, t, 1)
		}
		if err == nil && run.Notify {
			err = setNotifyAt(ctx, s.url, t, true)
		}
		if err != nil {
			return s, fmt.Errorf("table %s: %w", t, err)
		}
	}
	if s.topic, err = e.newAppendTimeTopic(ctx, "idle-"+run.Key); err != nil {
		return s, err
	}
	topic := s.topic
	s.cleanup = append(s.cleanup, func() { e.deleteTopic(context.Background(), topic) })
	if s.watch, err = e.watchSeqs(ctx, s.topic); err != nil {
		return s, err
	}
	if s.writer, err = pgx.Connect(ctx, s.url); err != nil {
		return s, err
	}
	progress("idle %s: starting %d relays (%d tables x %d shards)", run.Key, r.relays(), r.Tables, r.ShardsPerTable)
	t0 := time.Now()
	for k, t := range s.tables {
		for i := range r.ShardsPerTable {
			p, err := e.startRelay(ctx, fmt.Sprintf("idle-%s-%02d-%d", run.Key, k+1, i), withUser(s.url, publisherRole), s.topic,
				relayOptions{table: t, shardCount: r.ShardsPerTable, shardIndex: i, notify: run.Notify, snapshot: run.Snapshot})
			if err != nil {
				return s, err
			}
			s.relays = append(s.relays, p)
		}
	}
	for _, p := range s.relays {
		if err := p.waitReady(ctx, 3*time.Minute); err != nil {
			return s, err
		}
	}
	s.readyAt = time.Now()
	run.ReadyMs = since(t0, s.readyAt)
	progress("idle %s: %d relays ready after %.1fs", run.Key, len(s.relays), run.ReadyMs/1000)
	s.cg = cpuGroups{relay: s.relays.pids, pgMaster: postmasterPid(s.srv.DataDir), kafka: e.kafkaPid}
	if s.cg.pgRelay, err = relayBackendsOn(ctx, s.srv); err != nil {
		return s, err
	}
	if s.obs, err = newPGObserver(ctx, s.srv, idleDB); err != nil {
		return s, err
	}
	if !s.obs.pss {
		return s, errors.New("pg_stat_statements is not loaded")
	}
	return s, nil
}

// close stops everything of the set; safe on a partial one.
func (s *idleSet) close(ctx context.Context) {
	if err := s.relays.stop(); err != nil && s.run.Err == "" {
		s.run.fail(err)
	}
	s.relays = nil
	if s.watch != nil {
		s.watch.close()
	}
	if s.obs != nil {
		s.obs.close()
	}
	if s.writer != nil {
		s.writer.Close(ctx)
	}
	if s.srv != nil {
		s.srv.Close()
	}
	for i := len(s.cleanup) - 1; i >= 0; i-- {
		s.cleanup[i]()
	}
	s.cleanup = nil
}

// commit commits one event into table t on the writer's connection and returns its seq and the
// moment COMMIT was sent.
func (s *idleSet) commit(ctx context.Context, t outboxdb.Table) (int, time.Time, error) {
	seq := s.seq
	s.seq++
	agg := fmt.Sprintf("order-%d", seq%1000)
	var at time.Time
	err := pgx.BeginFunc(ctx, s.writer, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', $1, 'OrderPlaced', $2::jsonb)`, t.Ident()), agg, seqPayload(seq, agg)); err != nil {
			return err
		}
		at = time.Now()
		return nil
	})
	return seq, at, err
}

// measure reads the counters, runs feed (or waits) for d, and reads them again.
func (s *idleSet) measure(ctx context.Context, d time.Duration, feed func(ctx context.Context, until time.Time) (int64, error)) (*IdleCost, error) {
	a := s.cg.snapshot()
	pa, err := s.obs.read(ctx)
	if err != nil {
		return nil, err
	}
	until := time.Now().Add(d)
	var events int64
	if feed != nil {
		events, err = feed(ctx, until)
	} else {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(time.Until(until)):
		}
	}
	if err != nil {
		return nil, err
	}
	b := s.cg.snapshot()
	pb, err := s.obs.read(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.relays.checkRunning(); err != nil {
		return nil, err
	}
	return idleCostOf(usageSince(a, b), pa, pb, events), nil
}

// idleCostOf is the cost of a window from its CPU usage and the server's counters at its ends,
// events written in between.
func idleCostOf(u CPUUsage, a, b pgCounters, events int64) *IdleCost {
	return &IdleCost{Seconds: u.Wall, Events: events, PostgresCPU: u.Postgres, PostgresRelayCPU: u.PostgresRelay,
		RelayCPU: u.Relay, MachineCPU: u.Machine, Statements: b.statements - a.statements, AllStatements: b.all - a.all,
		Xacts: b.xacts - a.xacts, Rollbacks: b.rollbacks - a.rollbacks, Evicted: b.dealloc - a.dealloc, Xids: b.xmax - a.xmax - events}
}

// statementCalls returns the relays' pg_stat_statements calls by statement (the -statements
// diagnostic), to tell what a window ran.
func (s *idleSet) statementCalls(ctx context.Context) (map[string]int64, error) {
	rows, err := s.obs.conn.Query(ctx, `SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 200), sum(calls)::int8 FROM pg_stat_statements
  WHERE userid = (SELECT oid FROM pg_roles WHERE rolname = $1) GROUP BY 1`, publisherRole)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var q string
		var n int64
		if err := rows.Scan(&q, &n); err != nil {
			return nil, err
		}
		out[q] += n
	}
	return out, rows.Err()
}

// topStatements prints the n statements the relays ran most between two statementCalls, per
// second of the window.
func (s *idleSet) topStatements(what string, before, after map[string]int64, secs float64, n int) {
	type call struct {
		q string
		n int64
	}
	var calls []call
	for q, c := range after {
		if d := c - before[q]; d > 0 {
			calls = append(calls, call{q, d})
		}
	}
	slices.SortFunc(calls, func(a, b call) int { return int(b.n - a.n) })
	progress("idle %s: the relays' most called statements %s (calls/s of all %d relays)", s.run.Key, what, len(s.relays))
	for _, c := range calls[:min(n, len(calls))] {
		progress("  %9.2f/s  %s", float64(c.n)/secs, c.q)
	}
}

// firstEvents commits one event into each table, spaced, and waits for them all.
func (s *idleSet) firstEvents(ctx context.Context) (*IdleLatency, error) {
	commits := map[int]time.Time{}
	spacing := min(100*time.Millisecond, 5*time.Second/time.Duration(len(s.tables)))
	for _, t := range s.tables {
		seq, at, err := s.commit(ctx, t)
		if err != nil {
			return nil, err
		}
		commits[seq] = at
		time.Sleep(spacing)
	}
	if err := s.watch.waitAll(ctx, commits, s.relays, time.Minute); err != nil {
		return nil, err
	}
	recv, app := s.watch.times(commits)
	return idleLatency(commits, recv, app), nil
}

// fed feeds every relay about idleFedPerRelay events/s for d and measures; then waits for the
// events.
func (s *idleSet) fed(ctx context.Context, r *IdleResult, d time.Duration) (*IdleCost, *IdleLatency, error) {
	rate := idleFedPerRelay * float64(r.relays())
	interval := time.Duration(float64(time.Second) / rate)
	commits := map[int]time.Time{}
	feed := func(ctx context.Context, until time.Time) (int64, error) {
		start := time.Now()
		var n int64
		for i := 0; ; i++ {
			next := start.Add(time.Duration(i) * interval)
			if !next.Before(until) {
				break
			}
			if w := time.Until(next); w > 0 {
				select {
				case <-ctx.Done():
					return n, ctx.Err()
				case <-time.After(w):
				}
			}
			seq, at, err := s.commit(ctx, s.tables[i%len(s.tables)])
			if err != nil {
				return n, err
			}
			commits[seq] = at
			n++
		}
		if w := time.Until(until); w > 0 {
			time.Sleep(w)
		}
		return n, nil
	}
	cost, err := s.measure(ctx, d, feed)
	if err != nil {
		return nil, nil, err
	}
	if err := s.watch.waitAll(ctx, commits, s.relays, time.Minute); err != nil {
		return cost, nil, err
	}
	recv, app := s.watch.times(commits)
	return cost, idleLatency(commits, recv, app), nil
}

// idleRunName names a mode in the report.
func idleRunName(key string) (name string, notify, snapshot bool) {
	notify = strings.HasPrefix(key, "notify")
	snapshot = strings.HasSuffix(key, "-snapshot")
	name = "polling"
	if notify {
		name = "woken by notifications (--notify, the insert trigger)"
	}
	switch {
	case snapshot && !notify:
		name += ", snapshot tracking (the defaults)"
	case snapshot:
		name += ", snapshot tracking"
	default:
		name += ", row tracking"
	}
	return name, notify, snapshot
}

// scenarioIdle runs the idle scenario.
func (e *env) scenarioIdle(ctx context.Context, res *Results) {
	r := &IdleResult{Tables: e.cfg.idleTables, ShardsPerTable: idleShardsPerTable, WindowSec: e.cfg.idleWindow.Seconds(),
		LongIdleSec: e.cfg.idleLong.Seconds(), FedSec: e.cfg.idleFed.Seconds(), FedPerRelay: idleFedPerRelay,
		Settings: strings.Join(idleSettings(e.cfg.idleTables), ", ")}
	res.Idle = r
	if e.relayBin == "" {
		r.Err = fmt.Sprintf("no relay binary: %v", e.relayErr)
		return
	}
	var sets []*idleSet
	defer func() {
		for _, s := range sets {
			if s != nil {
				s.close(context.Background())
			}
		}
	}()
	// Start each mode in turn and measure its idle window, the earlier modes idling beside it.
	for _, key := range e.cfg.idleModes {
		run := &IdleRun{Key: key}
		run.Name, run.Notify, run.Snapshot = idleRunName(key)
		run.PollMs = ms(contract.DefaultPollInterval(run.Notify))
		if !run.Notify {
			run.IdlePollMs = ms(contract.IdlePollInterval)
		}
		r.Runs = append(r.Runs, run)
		if ctx.Err() != nil {
			run.fail(ctx.Err())
			sets = append(sets, nil)
			continue
		}
		for _, s := range sets {
			if s != nil {
				run.Alongside = append(run.Alongside, s.run.Key)
			}
		}
		s, err := e.startIdleSet(ctx, r, run)
		sets = append(sets, s)
		if err != nil {
			run.fail(err)
			continue
		}
		// A few seconds for the relays' start-up work to end before the window.
		settle := min(3*time.Second, e.cfg.idleWindow/4)
		time.Sleep(settle)
		if run.IdlePollMs > 0 {
			// Polling relays back off while idle: the idle window begins once their waits have
			// reached the idle poll interval, and the ramp before it is measured too.
			ramp := contract.IdleBackoffShare*contract.IdlePollInterval + 5*time.Second - settle
			progress("idle %s: the relays back off for %s before the idle window", key, ramp)
			if run.Ramp, err = s.measure(ctx, ramp, nil); err != nil {
				run.fail(err)
				continue
			}
		}
		progress("idle %s: %d relays idle for %s", key, len(s.relays), e.cfg.idleWindow)
		var calls map[string]int64
		if e.cfg.statements > 0 {
			calls, _ = s.statementCalls(ctx)
		}
		if run.Idle, err = s.measure(ctx, e.cfg.idleWindow, nil); err != nil {
			run.fail(err)
			continue
		}
		if calls != nil {
			if after, err := s.statementCalls(ctx); err == nil {
				s.topStatements("idle", calls, after, run.Idle.Seconds, e.cfg.statements)
			}
		}
		progress("idle %s: PostgreSQL %.2f%% of a core, relays' statements %.1f/s (all roles %.1f/s), transactions %.1f/s (rolled back %.1f/s), xids %.2f/s; relays %.1f%% of a core",
			key, run.Idle.PostgresPct(), run.Idle.StatementsPerSec(), run.Idle.perSec(float64(run.Idle.AllStatements)),
			run.Idle.XactsPerSec(), run.Idle.perSec(float64(run.Idle.Rollbacks)), run.Idle.XidsPerSec(), run.Idle.RelayPct())
	}
	// Then each mode in turn: its first events after the long idle, fed, stopped.
	for i, s := range sets {
		if s == nil || s.run.Err != "" {
			continue
		}
		run := s.run
		wait := time.Until(s.readyAt.Add(e.cfg.idleLong))
		if wait > 0 {
			progress("idle %s: idle for %s more before the first events", run.Key, wait.Round(time.Second))
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		if ctx.Err() != nil {
			run.fail(ctx.Err())
			continue
		}
		run.IdleForSec = time.Since(s.readyAt).Seconds()
		var err error
		if run.First, err = s.firstEvents(ctx); err != nil {
			run.fail(fmt.Errorf("the first events: %w", err))
		} else {
			progress("idle %s: the first event into each of %d tables after %.0fs idle: p50 %.1f ms, max %.1f ms (commit to the broker's append p50 %.1f ms, max %.1f ms)",
				run.Key, run.First.Events, run.IdleForSec, run.First.P50, run.First.Max, run.First.PickupP50, run.First.PickupMax)
		}
		progress("idle %s: each relay fed %.0f event/s for %s", run.Key, idleFedPerRelay, e.cfg.idleFed)
		var calls map[string]int64
		if e.cfg.statements > 0 {
			calls, _ = s.statementCalls(ctx)
		}
		run.Fed, run.FedLatency, err = s.fed(ctx, r, e.cfg.idleFed)
		if calls != nil && run.Fed != nil {
			if after, err := s.statementCalls(ctx); err == nil {
				s.topStatements("fed (and until the last event arrived)", calls, after, run.Fed.Seconds, e.cfg.statements)
			}
		}
		if err != nil {
			run.fail(fmt.Errorf("fed: %w", err))
		} else {
			progress("idle %s: fed %d events: PostgreSQL %.2f%% of a core, relays' statements %.1f/s, transactions %.1f/s (the writer's off; rolled back %.1f/s), xids %.2f/s; relays %.1f%% of a core; latency p50 %.1f ms, p99 %.1f ms, max %.1f ms",
				run.Key, run.Fed.Events, run.Fed.PostgresPct(), run.Fed.StatementsPerSec(), run.Fed.XactsPerSec(), run.Fed.perSec(float64(run.Fed.Rollbacks)), run.Fed.XidsPerSec(),
				run.Fed.RelayPct(), run.FedLatency.P50, run.FedLatency.P99, run.FedLatency.Max)
		}
		if rss, err := s.relays.peakRSS(); err == nil {
			run.PeakRSS = rss
		}
		s.watch.mu.Lock()
		foreign := s.watch.foreign
		s.watch.mu.Unlock()
		if foreign > 0 {
			run.fail(fmt.Errorf("%d records on the topic were not events of this run", foreign))
		}
		s.close(context.Background())
		sets[i] = nil
	}
}
