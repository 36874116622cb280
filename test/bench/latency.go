package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// LatencyResult is scenario 3: commit-to-consumer latency at a steady rate.
type LatencyResult struct {
	Rate     float64 `json:"rate"`     // target events/s
	Achieved float64 `json:"achieved"` // events/s the writers committed
	Events   int     `json:"events"`   // events measured (after the warm-up)
	Seconds  float64 `json:"seconds"`
	Writers  int     `json:"writers"`
	P50      float64 `json:"p50ms"`
	P95      float64 `json:"p95ms"`
	P99      float64 `json:"p99ms"`
	Max      float64 `json:"maxms"`
	// Commit to the record's timestamp, which the relay sets (in milliseconds) when it sends the
	// produce request: the relay's share of the latency; the rest is the broker's ack and the
	// consumer's fetch.
	PickupP50 float64 `json:"pickupP50ms"`
	PickupP99 float64 `json:"pickupP99ms"`
	// The writer's COMMIT, from sent to returned: the database's share, the same for every
	// publisher on the same server.
	CommitP50  float64   `json:"commitP50ms,omitempty"`
	CommitP99  float64   `json:"commitP99ms,omitempty"`
	Duplicates int       `json:"duplicates"`
	PeakRSS    int64     `json:"peakRSS,omitempty"`
	CPU        *CPUUsage `json:"cpu,omitempty"`
	Err        string    `json:"error,omitempty"`
	Measured   bool      `json:"measured"`
	// Notify: the relay listens for notifications (--notify) and the table has its insert
	// trigger; otherwise it polls every PollMs (the default) and the table has no trigger.
	Notify bool `json:"notify,omitempty"`
	// NotifyAlways: with Notify, a standing claim made every insert notify, as before wake-ups
	// on demand.
	NotifyAlways bool `json:"notifyAlways,omitempty"`
	// Snapshot: the relay tracks by snapshot.
	Snapshot bool `json:"snapshot,omitempty"`
	// Envelope names the envelopes scenario's variant (envelopes.go); relayArgs are its flags.
	Envelope  string   `json:"envelope,omitempty"`
	relayArgs []string `json:"-"`
	// PollMs is the relay's poll interval when it polls.
	PollMs float64 `json:"pollMs,omitempty"`
	// Idle is the CPU used during latencyIdle after the last event arrived, the relay idle: the
	// PostgreSQL part is what an idle relay costs the database (its polls, or its wait).
	Idle *CPUUsage `json:"idle,omitempty"`
	// Cost is the publisher's statements, transaction ids and record batches per event, from
	// independent observers (cost.go); nil where the run had no observer (before this field, or
	// outside the debezium scenario).
	Cost *EventCost `json:"cost,omitempty"`
}

// latencyIdle is how long the relay's idle cost is measured after the latency run.
const latencyIdle = 5 * time.Second

// latencyPad makes each payload about 200 bytes, like the drain scenarios' events.
var latencyPad = strings.Repeat("x", 120)

// seqInsert is the statement the paced writers of the latency and reshard scenarios commit:
// one event of aggregate $1 with payload $2 (seqPayload).
func (e *env) seqInsert() string {
	return fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', $1, 'OrderPlaced', $2::jsonb)`, e.table.Ident())
}

// seqPayload is the payload of the seq-th event, of aggregate agg: about 200 bytes.
func seqPayload(seq int, agg string) string {
	return fmt.Sprintf(`{"seq": %d, "order_id": %q, "amount": 42.5, "currency": "EUR", "note": %q}`, seq, agg, latencyPad)
}

// consumerOpts are what every independent consumer of the benchmark's topics is, wherever it
// starts reading, followed by opts: on the broker, and read_committed (what a consumer of an
// exactly-once relay's topic reads; the same as read_uncommitted for the others, which write no
// transactions).
func (e *env) consumerOpts(opts ...kgo.Opt) []kgo.Opt {
	return append([]kgo.Opt{
		kgo.SeedBrokers(e.kafka.Brokers...),
		kgo.FetchMaxWait(250 * time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	}, opts...)
}

// newTopicConsumer returns an independent client reading topic from its start.
func (e *env) newTopicConsumer(topic string, opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(e.consumerOpts(append([]kgo.Opt{
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}, opts...)...)...)
}

// scenarioLatency: scenario 3. Writers commit one event per transaction on a fixed schedule;
// a single-shard relay with default settings (polling, no insert trigger) publishes; an
// independent franz-go consumer records when each event arrives. Latency is arrival minus the
// moment the writer sent COMMIT (so it includes the commit itself).
// It runs in each wake-up mode so they compare in one run: polling (the default), wake-ups on
// demand (notify), and every insert notifying as before them (a standing claim held by another
// session); and under snapshot tracking polling and notified.
func (e *env) scenarioLatency(ctx context.Context, res *Results) {
	poll := ms(contract.PollInterval)
	res.Latency = &LatencyResult{Rate: e.cfg.latencyRate, Writers: 8, PollMs: poll}
	res.LatencyNotify = &LatencyResult{Rate: e.cfg.latencyRate, Writers: 8, Notify: true}
	res.LatencyAlways = &LatencyResult{Rate: e.cfg.latencyRate, Writers: 8, Notify: true, NotifyAlways: true}
	res.LatencySnapshot = &LatencyResult{Rate: e.cfg.latencyRate, Writers: 8, Snapshot: true, PollMs: poll}
	res.LatencySnapshotNotify = &LatencyResult{Rate: e.cfg.latencyRate, Writers: 8, Snapshot: true, Notify: true}
	for _, lr := range []*LatencyResult{res.Latency, res.LatencyNotify, res.LatencyAlways, res.LatencySnapshot, res.LatencySnapshotNotify} {
		if err := e.runLatency(ctx, lr); err != nil {
			lr.Err = err.Error()
			progress("latency: FAILED: %v", err)
		}
	}
}

func (e *env) runLatency(ctx context.Context, lr *LatencyResult) error {
	const db = "bench_latency"
	defer e.dropDatabase(context.Background(), db)
	url, err := e.createDatabase(ctx, db, 1)
	if err != nil {
		return err
	}
	// Stamped by the broker's append: a record's own time is its event's created_at.
	topic, err := e.newAppendTimeTopic(ctx, "latency")
	if err != nil {
		return err
	}
	defer e.deleteTopic(context.Background(), topic)
	o := relayOptions{snapshot: lr.Snapshot, notify: lr.Notify, extra: lr.relayArgs} // otherwise the relay's defaults
	if lr.Notify {
		if err := e.setNotify(ctx, url, true); err != nil {
			return err
		}
	}
	p, err := e.startRelay(ctx, "latency", url, topic, o)
	if err != nil {
		return err
	}
	g := relayGroup{p}
	defer func() { _ = g.stop() }()
	if err := p.waitReady(ctx, time.Minute); err != nil {
		return err
	}
	if lr.NotifyAlways {
		claim, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer claim.Close(context.Background())
		var watch []int64
		if err := claim.QueryRow(ctx, outboxdb.WakeStatements(e.table).Wait, time.Hour.Seconds(), nil).Scan(&watch); err != nil {
			return fmt.Errorf("standing claim: %w", err)
		}
	}

	cg := e.cpuGroups(&g)
	if cg.pgRelay, err = e.relayBackends(ctx); err != nil {
		return err
	}
	if err := e.measureLatency(ctx, lr, latencyTarget{url: url, topic: topic, cg: cg, alive: g.checkRunning, peakRSS: g.peakRSS}); err != nil {
		return err
	}
	return g.stop()
}

// latencyTarget is what measureLatency loads and watches: a database whose outbox a publisher
// (a relay, or Debezium) is already publishing to topic.
type latencyTarget struct {
	url, topic string
	// from, when set, is where the consumer starts in each partition (the end offsets before the
	// run, on a topic that already holds other events); nil reads the topic from its start.
	from    map[int32]kgo.Offset
	cg      cpuGroups
	alive   func() error
	peakRSS func() (int64, error)
	// handOff, when set, is called by the writer as soon as its COMMIT returns, with the event's
	// sequence number, key and payload: the floor measurement, where the writer itself hands the
	// event to the broker and no publisher reads the database.
	handOff func(ctx context.Context, seq int, key, payload string) error
	// label names the publisher in -latency-dump's file names (empty: the latency scenario's relay).
	label string
	// obs, when set, counts the publisher's statements and transaction ids on the server over the
	// window (lr.Cost); the record batches are counted in any case.
	obs *pgObserver
}

// latencyConsumer is an independent client (consumerOpts) reading t's topic from t.from, or from
// its start, with hooks (the record batches' counter). It keeps the transaction markers: the hook
// counts their batches too, and measureLatency, which sees them polled, leaves them out.
func (e *env) latencyConsumer(t latencyTarget, hooks ...kgo.Hook) (*kgo.Client, error) {
	if t.from == nil {
		return e.newTopicConsumer(t.topic, kgo.WithHooks(hooks...), kgo.KeepControlRecords())
	}
	return kgo.NewClient(e.consumerOpts(
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{t.topic: t.from}),
		kgo.KeepControlRecords(),
		kgo.WithHooks(hooks...),
	)...)
}

// measureLatency runs the paced writers against t and records when each event arrives.
func (e *env) measureLatency(ctx context.Context, lr *LatencyResult, t latencyTarget) error {
	duration := e.cfg.latencyRunDuration(lr.Rate)
	total := int(lr.Rate * duration.Seconds())
	warm := int(lr.Rate * e.cfg.latencyWarmup.Seconds())
	commitAt := make([]time.Time, total)
	doneAt := make([]time.Time, total)
	recvAt := make([]time.Time, total)
	prodAt := make([]time.Time, total)
	seen := make([]int, total)

	// The consumer: an independent client, reading the topic from its start; its hook counts the
	// record batches it reads.
	batches := newBatchCounter()
	cl, err := e.latencyConsumer(t, batches)
	if err != nil {
		return err
	}
	defer cl.Close()
	cctx, stopConsumer := context.WithCancel(ctx)
	defer stopConsumer()
	var (
		mu       sync.Mutex
		received int
		badRecs  int
	)
	consumerDone := make(chan struct{})
	go func() {
		defer close(consumerDone)
		for cctx.Err() == nil {
			fetches := cl.PollFetches(cctx)
			now := time.Now()
			mu.Lock()
			fetches.EachRecord(func(r *kgo.Record) {
				if r.Attrs.IsControl() { // a transaction's marker: its batch holds no event
					batches.polled(r.Partition, -1)
					return
				}
				var v struct {
					Seq  int
					Data *struct{ Seq int } `json:"data"` // a structured CloudEvent (the envelopes scenario)
				}
				value := r.Value
				if len(value) > 5 && value[0] == 0 {
					value = value[5:] // the schema registry's wire format (the envelopes scenario)
				}
				err := json.Unmarshal(value, &v)
				if err == nil && v.Data != nil {
					v.Seq = v.Data.Seq
				}
				if err != nil || v.Seq < 0 || v.Seq >= total {
					badRecs++
					batches.polled(r.Partition, -1)
					return
				}
				batches.polled(r.Partition, v.Seq)
				if seen[v.Seq] == 0 {
					recvAt[v.Seq] = now
					prodAt[v.Seq] = r.Timestamp
					received++
				}
				seen[v.Seq]++
			})
			mu.Unlock()
		}
	}()
	// Let the consumer load metadata and start fetching before the clock starts.
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	<-waitCtx.Done()
	cancel()

	progress("latency: %d events at %.0f/s over %s (%d writers, notify: %v, every insert notifies: %v, snapshot tracking: %v)", total, lr.Rate, duration, lr.Writers, lr.Notify, lr.NotifyAlways, lr.Snapshot)
	var before cpuSnapshot
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		writeErr error
		lastDone time.Time
		// The writers' transactions committed so far, and the server's counters (t.obs) with the
		// count at the window's start.
		committed atomic.Int64
		pgBefore  pgCounters
		wBefore   int64
		obsAt     time.Time
		obsErr    error
	)
	t0 := time.Now().Add(100 * time.Millisecond)
	insert := e.seqInsert()
	interval := time.Duration(float64(time.Second) / lr.Rate)
	for w := range lr.Writers {
		conn, err := pgx.Connect(ctx, t.url)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += lr.Writers {
				if d := time.Until(t0.Add(time.Duration(i) * interval)); d > 0 {
					time.Sleep(d)
				}
				if ctx.Err() != nil {
					return
				}
				agg := fmt.Sprintf("order-%d", i%1000)
				payload := seqPayload(i, agg)
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, insert, agg, payload); err != nil {
						return err
					}
					commitAt[i] = time.Now()
					return nil
				})
				doneAt[i] = time.Now()
				if err == nil {
					committed.Add(1)
				}
				if err == nil && t.handOff != nil {
					err = t.handOff(ctx, i, agg, payload)
				}
				if err != nil {
					errMu.Lock()
					writeErr = errors.Join(writeErr, fmt.Errorf("writer %d: %w", w, err))
					errMu.Unlock()
					return
				}
			}
			errMu.Lock()
			if now := time.Now(); now.After(lastDone) {
				lastDone = now
			}
			errMu.Unlock()
		}()
	}
	go func() { // CPU over the steady part only
		time.Sleep(time.Until(t0.Add(e.cfg.latencyWarmup)))
		errMu.Lock()
		before = t.cg.snapshot()
		if t.obs != nil {
			// The writers' count is read on both sides of the server's, so that a commit in
			// between counts half (one transaction at most either way per writer).
			w0 := committed.Load()
			obsAt = time.Now()
			pgBefore, obsErr = t.obs.read(ctx)
			wBefore = (w0 + committed.Load()) / 2
		}
		errMu.Unlock()
	}()
	wg.Wait()
	if writeErr != nil {
		return writeErr
	}
	errMu.Lock()
	usage := usageSince(before, t.cg.snapshot())
	errMu.Unlock()
	lr.CPU = &usage
	lr.Achieved = float64(total) / lastDone.Sub(t0).Seconds()

	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		got := received
		mu.Unlock()
		if got == total {
			break
		}
		if err := t.alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consumer received %d of %d events within 60s of the last commit", got, total)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The server's counters end once every event arrived: the publisher's work for each of the
	// window's events is in them, and little of its idling after the last one.
	if t.obs != nil {
		errMu.Lock()
		err := obsErr
		errMu.Unlock()
		var after pgCounters
		if err == nil {
			after, err = t.obs.read(ctx)
		}
		if err != nil {
			return fmt.Errorf("the server's counters: %w", err)
		}
		c := costOf(pgBefore, after, committed.Load()-wBefore, time.Since(obsAt).Seconds())
		lr.Cost = &c
	}
	stopConsumer()
	<-consumerDone
	if lr.Cost == nil {
		lr.Cost = &EventCost{Statements: -1, Xids: -1}
	}
	lr.Cost.RecordBatches, lr.Cost.BatchedEvents = batches.count(func(seq int) bool { return seq >= warm })
	// The relay idle: what it costs the database to wait for the next event.
	idleFrom := t.cg.snapshot()
	idleCtx, idleDone := context.WithTimeout(ctx, latencyIdle)
	<-idleCtx.Done()
	idleDone()
	idle := usageSince(idleFrom, t.cg.snapshot())
	lr.Idle = &idle
	if rss, err := t.peakRSS(); err == nil {
		lr.PeakRSS = rss
	}
	if badRecs > 0 {
		return fmt.Errorf("%d records on the topic were not events of this run", badRecs)
	}

	if e.cfg.latencyDump != "" {
		if err := dumpLatency(e.cfg.latencyDump, t.label, lr, t0, commitAt, doneAt, prodAt, recvAt); err != nil {
			progress("latency: dump: %v", err)
		}
	}
	var lat, pickup, commit []time.Duration
	for i := warm; i < total; i++ {
		lat = append(lat, max(0, recvAt[i].Sub(commitAt[i])))
		pickup = append(pickup, max(0, prodAt[i].Sub(commitAt[i])))
		commit = append(commit, doneAt[i].Sub(commitAt[i]))
		if seen[i] > 1 {
			lr.Duplicates += seen[i] - 1
		}
	}
	slices.Sort(lat)
	slices.Sort(pickup)
	slices.Sort(commit)
	lr.CommitP50 = ms(percentile(commit, 50))
	lr.CommitP99 = ms(percentile(commit, 99))
	lr.PickupP50 = ms(percentile(pickup, 50))
	lr.PickupP99 = ms(percentile(pickup, 99))
	lr.Events = len(lat)
	lr.Seconds = float64(len(lat)) / lr.Rate
	lr.P50 = ms(percentile(lat, 50))
	lr.P95 = ms(percentile(lat, 95))
	lr.P99 = ms(percentile(lat, 99))
	lr.Max = ms(lat[len(lat)-1])
	lr.Measured = true
	progress("latency: achieved %.0f/s; p50 %.2f ms, p95 %.2f ms, p99 %.2f ms, max %.2f ms over %d events; commit to the record's timestamp p50 %.2f ms, p99 %.2f ms; the commit itself p50 %.2f ms, p99 %.2f ms; %s",
		lr.Achieved, lr.P50, lr.P95, lr.P99, lr.Max, lr.Events, lr.PickupP50, lr.PickupP99, lr.CommitP50, lr.CommitP99, lr.Cost.summary())
	if th := usage.KafkaThreads; len(th) > 0 && lr.Events > 0 {
		progress("latency: the broker's CPU by thread, µs per event: %s", threadsSummary(th, float64(lr.Events)))
	}
	return nil
}

// percentile is the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// dumpLatency writes one latency run's per-event times, in milliseconds since t0, as CSV into dir
// (diagnostic: -latency-dump).
func dumpLatency(dir, label string, lr *LatencyResult, t0 time.Time, sent, done, appended, received []time.Time) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	name := fmt.Sprintf("latency-%s-%.0f-%s.csv", dumpKind(label, lr), lr.Rate, time.Now().Format("150405"))
	var b strings.Builder
	fmt.Fprintf(&b, "# t0 %d (unix microseconds); times in milliseconds since t0\n", t0.UnixMicro())
	b.WriteString("seq,commit_sent,commit_done,appended,received\n")
	for i := range sent {
		fmt.Fprintf(&b, "%d,%.3f,%.3f,%.3f,%.3f\n", i, ms(sent[i].Sub(t0)), ms(done[i].Sub(t0)), ms(appended[i].Sub(t0)), ms(received[i].Sub(t0)))
	}
	return os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644)
}

func dumpKind(label string, lr *LatencyResult) string {
	k := label
	switch {
	case k != "":
	case lr.Snapshot:
		k = "relay-snapshot"
	default:
		k = "relay-row"
	}
	if lr.Notify {
		k += "-notify"
	}
	return k
}
