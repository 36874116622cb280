package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Keys of the drain measurements, in report order.
const (
	keyCeiling   = "postgres-alone"
	keyTuned     = "baseline-tuned"
	keyDefaults  = "baseline-defaults"
	keyRelay1    = "relay-1"
	keyRelay4    = "relay-4"
	keySnapCeil  = "postgres-alone-snapshot"
	keySnap1     = "relay-snapshot-1"
	keySnap4     = "relay-snapshot-4"
	keyRelay1X   = "relay-1-xmin"
	keySnap1X    = "relay-snapshot-1-xmin"
	keySmall     = "backlog-small"
	keyLarge     = "backlog-large"
	keyBurst     = "backlog-burst"
	keyRetention = "retention"
)

// Results is everything one run measured.
type Results struct {
	Started  time.Time      `json:"started"`
	Finished time.Time      `json:"finished"`
	Scale    float64        `json:"scale"`
	Machine  Machine        `json:"machine"`
	Config   config         `json:"-"`
	Drains   []*DrainResult `json:"drains"`
	Latency  *LatencyResult `json:"latency,omitempty"`
	// LatencyAlways is the latency scenario with every insert notifying (as before wake-ups on
	// demand).
	LatencyAlways *LatencyResult `json:"latencyAlways,omitempty"`
	// LatencyNotify is the latency scenario with a relay woken by notifications (wake-ups on
	// demand: the table keeps its insert trigger).
	LatencyNotify *LatencyResult `json:"latencyNotify,omitempty"`
	// LatencySnapshot is the latency scenario with the relay tracking by snapshot (polling, the
	// default).
	LatencySnapshot *LatencyResult `json:"latencySnapshot,omitempty"`
	// LatencySnapshotNotify is the same with notifications.
	LatencySnapshotNotify *LatencyResult `json:"latencySnapshotNotify,omitempty"`
	Append                *AppendResult  `json:"append,omitempty"`
	// DurableAppend is the append scenario on the durable server.
	DurableAppend *AppendResult    `json:"durableAppend,omitempty"`
	WritePath     *WritePathResult `json:"writePath,omitempty"`
	Reshard       *ReshardResult   `json:"reshard,omitempty"`
	// ReshardSnapshot is the reshard scenario with the relays tracking progress by snapshot.
	ReshardSnapshot *ReshardResult `json:"reshardSnapshot,omitempty"`
	// Debezium is the side by side with Debezium on Kafka Connect.
	Debezium *DebeziumResult `json:"debezium,omitempty"`
	// Idle is the idle scenario: many idle shards on one database.
	Idle *IdleResult `json:"idle,omitempty"`
	// Envelopes is the envelopes scenario: CloudEvents and tracing against none.
	Envelopes *EnvelopesResult `json:"envelopes,omitempty"`
	// TxnCost is the txncost scenario: a Kafka transaction's cost to the broker.
	TxnCost *TxnCostResult `json:"txnCost,omitempty"`
	Notes   []string       `json:"notes,omitempty"`
	// Merged lists the runs of some scenarios merged into this one (-merge-into).
	Merged []MergedRun `json:"merged,omitempty"`
	// Average size of a generated event's payload and headers as stored (jsonb text).
	PayloadBytes float64 `json:"payloadBytes,omitempty"`
	HeaderBytes  float64 `json:"headerBytes,omitempty"`
}

func (r *Results) drain(key string) *DrainResult {
	for _, d := range r.Drains {
		if d.Key == key {
			return d
		}
	}
	return nil
}

func (r *Results) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.Notes = append(r.Notes, msg)
	progress("note: %s", msg)
}

// scenarioDrain: scenario 1 (drain rate of a backlog) and 5 (relay peak RSS during it). The
// backlog is generated once into a template database; every publisher gets a file copy of it
// and a fresh topic.
func (e *env) scenarioDrain(ctx context.Context, res *Results) {
	n := e.cfg.backlog
	cases := []*DrainResult{
		{Key: keyCeiling, Name: fmt.Sprintf("drain %s: PostgreSQL alone, nothing published", count(n)),
			Method: fmt.Sprintf("full drain by one connection that runs one statement per %s rows: lock the oldest pending rows "+
				"(FOR UPDATE SKIP LOCKED), mark them sent, return their event columns (read and dropped). No Kafka: the PostgreSQL "+
				"work every publisher that marks each row needs, done as cheaply as one statement can", fmtInt(ceilingBatch))},
		{Key: keyTuned, Name: fmt.Sprintf("drain %s: baseline, tuned", count(n)),
			Method: "full drain, from worker start to the commit of the last mark"},
		{Key: keyDefaults, Name: fmt.Sprintf("drain %s: baseline, kafka-go defaults", count(n)),
			Method: fmt.Sprintf("%s window, rows marked / time to the last mark", e.cfg.defaultsWindow)},
		{Key: keyRelay1, Name: fmt.Sprintf("drain %s: relay, 1 shard", count(n)),
			Method: "full drain, from process start to the commit of the last mark"},
		{Key: keyRelay4, Name: fmt.Sprintf("drain %s: relay, 4 shards", count(n)),
			Method: "full drain, 4 processes, from their start to the commit of the last mark"},
		{Key: keySnapCeil, Name: fmt.Sprintf("drain %s: PostgreSQL alone, snapshot reading, nothing published", count(n)),
			Method: fmt.Sprintf("full drain by one connection that reads %s rows per statement in id order (the unsent rows committed in one snapshot, "+
				"every event column, read and dropped) and updates a one-row progress table per batch. No Kafka: the PostgreSQL work of "+
				"snapshot tracking, as cheaply as one statement can", fmtInt(ceilingBatch))},
		{Key: keySnap1, Name: fmt.Sprintf("drain %s: relay, 1 shard, snapshot tracking", count(n)),
			Method: "full drain, from process start to the commit of the cursor write that passed the last event"},
		{Key: keySnap4, Name: fmt.Sprintf("drain %s: relay, 4 shards, snapshot tracking", count(n)),
			Method: "full drain, 4 processes, from their start to the commit of the last cursor write that passed the backlog"},
		{Key: keyRelay1X, Name: fmt.Sprintf("drain %s: relay, 1 shard, xmin held", count(n)),
			Method: "as relay, 1 shard, while another session holds a REPEATABLE READ transaction open (vacuum can remove nothing)"},
		{Key: keySnap1X, Name: fmt.Sprintf("drain %s: relay, 1 shard, snapshot tracking, xmin held", count(n)),
			Method: "as relay, 1 shard, snapshot tracking, while another session holds a REPEATABLE READ transaction open"},
	}
	for _, codec := range compressionCodecs {
		cases = append(cases, &DrainResult{Key: keySnap1 + "-" + codec, Compression: codec,
			Name:   fmt.Sprintf("drain %s: relay, 1 shard, snapshot tracking, %s compression", count(n), codec),
			Method: "as relay, 1 shard, snapshot tracking, with `--compression " + codec + "`"})
	}
	if e.cfg.drains != nil {
		cases = slices.DeleteFunc(cases, func(c *DrainResult) bool { return !e.cfg.drains[c.Key] })
	}
	res.Drains = append(res.Drains, cases...)
	failAll := func(err error) {
		for _, c := range cases {
			c.fail(err)
		}
	}

	const tmpl = "bench_backlog_template"
	progress("scenario drain: generating a backlog of %d events", n)
	url, err := e.createDatabase(ctx, tmpl, 1)
	if err == nil {
		err = fillPending(ctx, url, e.table, n, e.cfg.aggregates, "backlog")
	}
	if err == nil {
		err = vacuumAnalyze(ctx, url, e.table)
	}
	var r idRange
	if err == nil {
		r, err = e.idRange(ctx, url)
	}
	if err == nil {
		err = e.eventSize(ctx, url, res)
	}
	defer e.dropDatabase(context.Background(), tmpl)
	if err != nil {
		failAll(err)
		return
	}

	for _, c := range cases {
		if ctx.Err() != nil {
			c.fail(ctx.Err())
			continue
		}
		db := "bench_" + sanitizeKey(c.Key)
		progress("%s: copying the backlog", c.Name)
		url, err := e.cloneDatabase(ctx, tmpl, db)
		if err != nil {
			c.fail(err)
			continue
		}
		topic, err := e.newTopic(ctx, c.Key)
		if err != nil {
			c.fail(err)
			e.dropDatabase(ctx, db)
			continue
		}
		progress("%s: running", c.Name)
		switch c.Key {
		case keyCeiling:
			e.drainWorker(ctx, c, func(ctx context.Context, finished func()) (int64, error) {
				return runCeiling(ctx, url, e.table, finished)
			}, url, r, 0)
		case keyTuned:
			e.drainBaseline(ctx, c, baselineTuned, url, topic, r, 0)
		case keyDefaults:
			e.drainBaseline(ctx, c, baselineDefaults, url, topic, r, e.cfg.defaultsWindow)
		case keyRelay1:
			e.drainRelays(ctx, c, url, topic, r, 1, false)
		case keyRelay4:
			e.drainRelays(ctx, c, url, topic, r, 4, false)
		case keySnapCeil:
			func() {
				conn, err := pgx.Connect(ctx, url)
				if err == nil {
					e.snap, err = watchSnapshot(ctx, conn, e.table, r)
					conn.Close(context.Background())
				}
				if err != nil {
					c.fail(err)
					return
				}
				defer func() { e.snap = nil }()
				e.drainWorker(ctx, c, func(ctx context.Context, finished func()) (int64, error) {
					return runSnapshotCeiling(ctx, url, e.table, finished)
				}, url, r, 0)
			}()
		case keySnap1:
			e.drainRelays(ctx, c, url, topic, r, 1, true)
		case keySnap1 + "-" + c.Compression:
			e.drainRelays(ctx, c, url, topic, r, 1, true)
		case keySnap4:
			e.drainRelays(ctx, c, url, topic, r, 4, true)
		case keyRelay1X, keySnap1X:
			func() {
				hold, err := holdXmin(ctx, url)
				if err != nil {
					c.fail(err)
					return
				}
				defer hold()
				e.drainRelays(ctx, c, url, topic, r, 1, c.Key == keySnap1X)
			}()
		}
		if c.Measured {
			if c.TopicBytes, err = e.topicBytes(ctx, topic); err != nil {
				progress("%s: the topic's size: %v", c.Name, err)
			}
		}
		e.dropDatabase(context.Background(), db)
		e.deleteTopic(context.Background(), topic)
	}
}

// scenarioBacklog: scenario 2, the relay's drain rate must not depend on how many rows are
// pending or how many sent rows are kept. A single-shard relay runs idle; each round commits a
// batch of pending events in one transaction and times the drain from that commit.
func (e *env) scenarioBacklog(ctx context.Context, res *Results) {
	e.backlogRuns(ctx, res, false)
	e.backlogRuns(ctx, res, true)
}

// backlogRuns runs the backlog scenario under row or snapshot tracking.
func (e *env) backlogRuns(ctx context.Context, res *Results, snapshot bool) {
	key, name := func(k string) string { return k }, func(n string) string { return n }
	if snapshot {
		key = func(k string) string { return k + "-snapshot" }
		name = func(n string) string { return n + ", snapshot tracking" }
	}
	small, large := e.cfg.smallPending, e.cfg.largePending
	smallRes := &DrainResult{Key: keySmall, Name: fmt.Sprintf("relay, %s pending", count(small)),
		Method: fmt.Sprintf("median of %d rounds, each committed in one transaction; from that commit to the commit of the last mark", e.cfg.rounds)}
	largeRes := &DrainResult{Key: keyLarge, Name: fmt.Sprintf("relay, %s pending", count(large)),
		Method: "one round as above; the inserting transaction runs ANALYZE, so the planner's statistics are those " +
			"autovacuum gathers while a backlog builds up over time"}
	burstRes := &DrainResult{Key: keyBurst, Name: fmt.Sprintf("relay, %s pending in one burst", count(large)),
		Method: "one round as above, ANALYZE just before the insert while every row was sent: the statistics of a quiet " +
			"system that a sudden burst meets, until autovacuum analyzes the partition again"}
	retRes := &DrainResult{Key: keyRetention, Name: fmt.Sprintf("relay, %s pending + %s sent rows kept", count(small), count(e.cfg.sentRows)),
		Method: fmt.Sprintf("median of %d rounds as for %s pending, with the sent rows spread over %d daily partitions, vacuumed and analyzed",
			e.cfg.rounds, count(small), e.cfg.retentionDays)}
	for _, r := range []*DrainResult{smallRes, largeRes, burstRes, retRes} {
		r.Key, r.Name = key(r.Key), name(r.Name)
	}
	res.Drains = append(res.Drains, smallRes, largeRes, burstRes, retRes)

	// Pending backlogs of two sizes in an otherwise empty table.
	func() {
		const db = "bench_backlog"
		defer e.dropDatabase(context.Background(), db)
		fail := func(err error) {
			for _, r := range []*DrainResult{smallRes, largeRes, burstRes} {
				if !r.Measured && r.Err == "" {
					r.fail(err)
				}
			}
		}
		url, err := e.createDatabase(ctx, db, 1)
		if err != nil {
			fail(err)
			return
		}
		g, topic, err := e.idleRelay(ctx, url, key(keySmall), snapshot)
		if err != nil {
			fail(err)
			return
		}
		defer e.deleteTopic(context.Background(), topic)
		for _, step := range []struct {
			res  *DrainResult
			spec rounds
		}{
			{smallRes, rounds{n: small, count: e.cfg.rounds, stats: statsAsIs}},
			{largeRes, rounds{n: large, count: 1, stats: statsCurrent}},
			{burstRes, rounds{n: large, count: 1, stats: statsBefore, limit: e.cfg.burstLimit}},
		} {
			if step.spec.n > small {
				progress("%s: inserting %d pending events in one transaction", step.res.Name, step.spec.n)
			}
			var rr roundsResult
			step.spec.snapshot = snapshot
			rr, err = e.runRounds(ctx, url, g, step.spec, step.res.Name)
			if err != nil {
				break
			}
			setRounds(step.res, step.spec.n, rr)
			if step.spec.n > small {
				if rss, rerr := g.peakRSS(); rerr == nil {
					step.res.PeakRSS = rss
				}
			}
		}
		if serr := g.stop(); err == nil {
			err = serr
		}
		if err != nil {
			fail(err)
		}
	}()

	// Small rounds again with millions of sent rows kept in daily partitions.
	func() {
		const db = "bench_retention"
		defer e.dropDatabase(context.Background(), db)
		url, err := e.createDatabase(ctx, db, e.cfg.retentionDays)
		if err == nil {
			progress("%s: generating %d sent rows over %d days", retRes.Name, e.cfg.sentRows, e.cfg.retentionDays)
			err = fillSent(ctx, url, e.table, e.cfg.sentRows, e.cfg.aggregates, e.cfg.retentionDays)
		}
		if err == nil {
			err = vacuumAnalyze(ctx, url, e.table)
		}
		if err != nil {
			retRes.fail(err)
			return
		}
		g, topic, err := e.idleRelay(ctx, url, key(keyRetention), snapshot)
		if err != nil {
			retRes.fail(err)
			return
		}
		defer e.deleteTopic(context.Background(), topic)
		rr, err := e.runRounds(ctx, url, g, rounds{n: small, count: e.cfg.rounds, stats: statsAsIs, snapshot: snapshot}, retRes.Name)
		if serr := g.stop(); err == nil {
			err = serr
		}
		if err != nil {
			retRes.fail(err)
			return
		}
		setRounds(retRes, small, rr)
	}()
}

// idleRelay starts one single-shard relay with default settings on a fresh topic and waits
// until it is ready.
func (e *env) idleRelay(ctx context.Context, dbURL, key string, snapshot bool) (relayGroup, string, error) {
	topic, err := e.newTopic(ctx, key)
	if err != nil {
		return nil, "", err
	}
	p, err := e.startRelay(ctx, key, dbURL, topic, relayOptions{batchSize: e.cfg.relayBatch, snapshot: snapshot})
	if err != nil {
		e.deleteTopic(context.Background(), topic)
		return nil, "", err
	}
	g := relayGroup{p}
	if err := p.waitReady(ctx, time.Minute); err != nil {
		_ = g.stop()
		e.deleteTopic(context.Background(), topic)
		return nil, "", err
	}
	return g, topic, nil
}

func setRounds(r *DrainResult, n int64, rr roundsResult) {
	r.Rounds = rr.rates
	r.Rate = median(rr.rates)
	r.Events = n
	if rr.partial > 0 {
		r.Events = rr.partial
		r.Method += fmt.Sprintf("; stopped waiting %s after the commit, when %s of %s rows were marked: the rate is over those",
			rr.limit, fmtInt(float64(rr.partial)), count(n))
	}
	r.Seconds = float64(r.Events) / r.Rate
	r.Plan = rr.plan
	r.Measured = true
}

// eventSize records the average payload and headers of the generated events, as stored.
func (e *env) eventSize(ctx context.Context, dbURL string, res *Results) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, "SELECT avg(octet_length(payload::text)), avg(octet_length(headers::text)) FROM "+e.table.Ident()).
		Scan(&res.PayloadBytes, &res.HeaderBytes)
}

// idRange returns the ids the table holds.
func (e *env) idRange(ctx context.Context, dbURL string) (idRange, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return idRange{}, err
	}
	defer conn.Close(ctx)
	var r idRange
	err = conn.QueryRow(ctx, "SELECT min(id), max(id) FROM "+e.table.Ident()).Scan(&r.lo, &r.hi)
	return r, err
}

func sanitizeKey(k string) string {
	b := []byte(k)
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// median of a non-empty slice.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// count formats an event count as 10k, 1M, 2.5M.
func count(n int64) string {
	switch {
	case n >= 1_000_000 && n%100_000 == 0:
		return trimZero(fmt.Sprintf("%.1f", float64(n)/1e6)) + "M"
	case n >= 1000 && n%100 == 0:
		return trimZero(fmt.Sprintf("%.1f", float64(n)/1e3)) + "k"
	default:
		return fmt.Sprint(n)
	}
}

func trimZero(s string) string {
	if len(s) > 2 && s[len(s)-2:] == ".0" {
		return s[:len(s)-2]
	}
	return s
}
