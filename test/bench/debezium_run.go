package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// topicWatch is an independent consumer that records when each record of a topic arrives.
type topicWatch struct {
	cl       *kgo.Client
	cancel   context.CancelFunc
	done     chan struct{}
	once     sync.Once
	mu       sync.Mutex
	arrivals []time.Time
	appended []time.Time // the records' timestamps: the broker's append times on a LogAppendTime topic
}

func (e *env) watchTopic(ctx context.Context, topic string) (*topicWatch, error) {
	cl, err := e.newTopicConsumer(topic)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &topicWatch{cl: cl, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			fetches := cl.PollFetches(ctx)
			now := time.Now()
			w.mu.Lock()
			fetches.EachRecord(func(r *kgo.Record) {
				w.arrivals = append(w.arrivals, now)
				w.appended = append(w.appended, r.Timestamp)
			})
			w.mu.Unlock()
		}
	}()
	return w, nil
}

func (w *topicWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.arrivals)
}

func (w *topicWatch) at(i int) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.arrivals[i]
}

// close stops the consumer; a second call does nothing.
func (w *topicWatch) appendedAt(i int) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.appended[i]
}

func (w *topicWatch) close() {
	w.once.Do(func() {
		w.cancel()
		<-w.done
		w.cl.Close()
	})
}

// waitCount waits until the watch has seen n records. It fails when none arrived for stall, or
// when alive reports the publisher dead.
func (w *topicWatch) waitCount(ctx context.Context, n int, what string, alive func() error, stall time.Duration) error {
	last, lastMove, lastReport := -1, time.Now(), time.Now()
	for {
		got := w.count()
		if got >= n {
			return nil
		}
		if err := alive(); err != nil {
			return err
		}
		if got != last {
			last, lastMove = got, time.Now()
		} else if time.Since(lastMove) > stall {
			return fmt.Errorf("%s: %d of %d records on the topic, none for %s", what, got, n, stall)
		}
		if time.Since(lastReport) >= 10*time.Second {
			lastReport = time.Now()
			progress("%s: %s of %s records received", what, fmtInt(float64(got)), fmtInt(float64(n)))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// peerRig is what one publisher of the side by side runs against: its database and topic on
// the run's server (kept until the scenario's end, for the interleaved rounds), how to start it
// and how to find its PostgreSQL backends.
type peerRig struct {
	p        *PeerResult
	db, url  string
	topic    string
	opts     relayOptions
	start    func() (publisher, error)
	backends func() (map[int]bool, error)
	cleanups []func()
}

// close drops what preparePeer created, in reverse order.
func (r *peerRig) close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

// preparePeer creates p's database and topic on srv (and, for Debezium, its publication and
// replication slot) and says how to start it. On an error it has dropped what it created.
func (e *env) preparePeer(ctx context.Context, srv *pgtest.Server, p *PeerResult) (rig *peerRig, err error) {
	rig = &peerRig{p: p, db: "bench_peer_" + sanitizeKey(p.Key)}
	defer func() {
		if err != nil {
			rig.close()
		}
	}()
	if rig.url, err = createDatabaseOn(ctx, srv, e.table, rig.db, 1); err != nil {
		return nil, err
	}
	rig.cleanups = append(rig.cleanups, func() { dropDatabaseOn(context.Background(), srv, rig.db) })
	if rig.topic, err = e.newAppendTimeTopic(ctx, p.Key); err != nil {
		return nil, err
	}
	rig.cleanups = append(rig.cleanups, func() { e.deleteTopic(context.Background(), rig.topic) })
	rig.opts = relayOptions{snapshot: p.snapshot()}
	if p.Key == peerRelayEOS {
		compact := "compact"
		if rig.opts.cursorTopic, err = e.newTopicWith(ctx, p.Key+".cursors", map[string]*string{"cleanup.policy": &compact}); err != nil {
			return nil, err
		}
		rig.cleanups = append(rig.cleanups, func() { e.deleteTopic(context.Background(), rig.opts.cursorTopic) })
	}
	if p.Key != peerDebezium {
		rig.backends = func() (map[int]bool, error) { return relayBackendsOn(ctx, srv) }
		rig.start = func() (publisher, error) { return e.startPeerRelay(ctx, rig, p.Key, rig.opts) }
		return rig, nil
	}
	if err := createPublication(ctx, rig.url, e.table.Ident()); err != nil {
		return nil, fmt.Errorf("create publication: %w", err)
	}
	port, err := pgtest.FreePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(e.tmp, "connect-"+p.Key)
	env := e.debeziumEnv(srv, rig.db, rig.topic, port)
	rig.cleanups = append(rig.cleanups, func() {
		_, _ = runScript(env, "clean", dir)
		dropSlot(context.Background(), srv)
	})
	rig.start = func() (publisher, error) { return startConnect(env, dir) }
	rig.backends = func() (map[int]bool, error) { return debeziumBackends(ctx, srv) }
	// The first start creates the replication slot (snapshot.mode=no_data): only what is
	// committed from then on is Debezium's to publish, as the relay's backlog is.
	progress("%s: first start (creates the replication slot)", p.Name)
	c, err := rig.start()
	if err == nil {
		err = c.stop()
	}
	if err != nil {
		return nil, err
	}
	return rig, nil
}

// startPeerRelay starts a relay for rig's table under label and returns once it is ready. The
// relay connects as the publishers' role (cost.go); everyone else as the server's user.
func (e *env) startPeerRelay(ctx context.Context, rig *peerRig, label string, opts relayOptions) (publisher, error) {
	r, err := e.startRelay(ctx, label, withUser(rig.url, publisherRole), rig.topic, opts)
	if err != nil {
		return nil, err
	}
	pub := &relayPub{g: relayGroup{r}}
	if err := r.waitReady(ctx, time.Minute); err != nil {
		_ = pub.stop()
		return nil, err
	}
	return pub, nil
}

// runPeer measures one publisher on its fresh database and topic of srv (rig): cold start, the
// drain of a backlog, latency at each rate, and then checks everything it published.
func (e *env) runPeer(ctx context.Context, srv *pgtest.Server, d *DebeziumResult, rig *peerRig) {
	p, url, db, topic := rig.p, rig.url, rig.db, rig.topic
	start, backends := rig.start, rig.backends
	w, err := e.watchTopic(ctx, topic)
	if err != nil {
		p.fail(err)
		return
	}
	defer w.close()

	// Cold start: one event committed while the publisher is stopped.
	if err := e.insertProbe(ctx, url); err != nil {
		p.fail(err)
		return
	}
	t0 := time.Now()
	pub, err := start()
	if err != nil {
		p.fail(err)
		return
	}
	p.ReadyMs = since(t0, time.Now())
	if err := w.waitCount(ctx, 1, p.Name+": cold start", pub.alive, time.Minute); err != nil {
		_ = pub.stop()
		p.fail(err)
		return
	}
	p.ColdStartMs = since(t0, w.appendedAt(0))
	p.ColdArriveMs = since(t0, w.at(0))
	progress("%s: cold start to the first event appended by the broker %.0f ms, received %.0f ms (ready after %.0f ms)",
		p.Name, p.ColdStartMs, p.ColdArriveMs, p.ReadyMs)
	if err := pub.stop(); err != nil {
		p.fail(err)
		return
	}

	// The drain: a backlog written while the publisher is stopped, then a start.
	progress("%s: writing a backlog of %d events in transactions of %d", p.Name, d.Backlog, d.Chunk)
	if err := insertChunks(ctx, url, e, d.Backlog, d.Chunk); err != nil {
		p.fail(err)
		return
	}
	var cur publisher
	cg := cpuGroups{pgMaster: postmasterPid(srv.DataDir), kafka: e.kafkaPid, relay: func() []int {
		if cur == nil {
			return nil
		}
		return cur.pids()
	}}
	base := w.count()
	// -statements: what the publisher's drain ran, named (its backends' CPU beside it).
	reportStatements := func() {}
	if e.cfg.statements > 0 {
		sconn, err := pgx.Connect(ctx, url)
		if err != nil {
			p.fail(err)
			return
		}
		defer sconn.Close(context.Background())
		reportStatements = e.statementsTop(ctx, sconn, p.Name+": drain")
	}
	before := cg.snapshot()
	t0 = time.Now()
	cur, err = start()
	if err != nil {
		p.fail(err)
		return
	}
	defer func() { _ = cur.stop() }()
	if cg.pgRelay, err = backends(); err != nil {
		p.fail(err)
		return
	}
	if err := w.waitCount(ctx, base+int(d.Backlog), p.Name+": drain", cur.alive, time.Minute); err != nil {
		p.fail(err)
		return
	}
	// Debezium may replace its first walsender once it has checked the slot: count the one
	// that streams too (a backend that appeared during the window counts in full).
	refresh := func() {
		if pids, err := backends(); err == nil {
			for pid := range pids {
				cg.pgRelay[pid] = true
			}
		}
	}
	refresh()
	usage := usageSince(before, cg.snapshot())
	reportStatements()
	first, last := w.at(base), w.at(base+int(d.Backlog)-1)
	dr := &PeerDrain{Events: d.Backlog, Seconds: last.Sub(t0).Seconds(), FirstMs: since(t0, first), CPU: &usage}
	dr.Rate = float64(dr.Events) / dr.Seconds
	if s := last.Sub(first).Seconds(); s > 0 {
		dr.SteadyRate = float64(dr.Events-1) / s
	}
	p.Drain = dr
	progress("%s: drained %d events in %.2fs = %.0f events/s (first after %.0f ms; %.0f events/s from the first to the last)",
		p.Name, dr.Events, dr.Seconds, dr.Rate, dr.FirstMs, dr.SteadyRate)
	w.close()

	// Latency at each rate, the publisher running.
	for _, rate := range d.Rates {
		lr := &LatencyResult{Rate: rate, Writers: 8, Snapshot: p.snapshot()}
		if p.Key != peerDebezium {
			lr.PollMs = ms(contract.PollInterval)
		}
		p.Latency = append(p.Latency, lr)
		refresh()
		if err := e.peerLatency(ctx, srv, lr, p.Key, url, topic, cg, cur); err != nil {
			lr.Err = err.Error()
			progress("%s: latency at %.0f/s: FAILED: %v", p.Name, rate, err)
		}
	}
	if len(d.Rates) > 0 {
		lr := &LatencyResult{Rate: d.Rates[0], Writers: 8, Snapshot: p.snapshot()}
		if p.Key != peerDebezium {
			lr.PollMs = ms(contract.PollInterval)
		}
		p.LatencyAsync = lr
		progress("%s: latency with synchronous_commit=off for the writers", p.Name)
		err := setDatabase(ctx, srv, db, "synchronous_commit", "off")
		refresh()
		if err == nil {
			err = e.peerLatency(ctx, srv, lr, p.Key+"-async", url, topic, cg, cur)
		}
		if err != nil {
			lr.Err = err.Error()
			progress("%s: latency with synchronous_commit=off: FAILED: %v", p.Name, err)
		}
		// Back to the default for what follows (the notified relay, the interleaved rounds):
		// with it off, a walsender sees a commit only at the WAL writer's next flush.
		if err := setDatabase(ctx, srv, db, "synchronous_commit", "on"); err != nil {
			p.fail(err)
		}
	}
	if rss, err := cur.rss(); err == nil {
		p.PeakRSS = rss
	}
	if err := cur.stop(); err != nil {
		p.fail(err)
	}
	if p.Key != peerDebezium && p.Key != peerRelayEOS && len(d.Rates) > 0 {
		// The relay's other wake-up: notifications (the operator's spec.publish.notify); for
		// the at-least-once relays (exactly-once wakes up as snapshot tracking does).
		if err := e.peerNotifyLatency(ctx, srv, d, rig, &cg); err != nil {
			p.fail(err)
		}
	}
	progress("%s: checking every event on the topic against the database", p.Name)
	chk, err := e.checkOutput(ctx, url, topic)
	if err != nil {
		p.fail(fmt.Errorf("check the output: %w", err))
		return
	}
	p.Check = chk
	progress("%s: %s", p.Name, chk.summary())
}

// peerNotifyLatency measures the relay's latency at each rate once more, woken by notifications:
// the table gets its insert trigger and the relay runs with --notify.
func (e *env) peerNotifyLatency(ctx context.Context, srv *pgtest.Server, d *DebeziumResult, rig *peerRig, cg *cpuGroups) error {
	p, url, topic, backends := rig.p, rig.url, rig.topic, rig.backends
	// The writers' synchronous_commit is back on since runPeer's window with it off.
	if err := e.setNotify(ctx, url, true); err != nil {
		return err
	}
	pub, err := e.startPeerRelay(ctx, rig, p.Key+"-notify", relayOptions{snapshot: p.snapshot(), notify: true})
	if err != nil {
		return err
	}
	defer func() { _ = pub.stop() }()
	cg.relay = pub.pids
	if cg.pgRelay, err = backends(); err != nil {
		return err
	}
	for _, rate := range d.Rates {
		lr := &LatencyResult{Rate: rate, Writers: 8, Snapshot: p.snapshot(), Notify: true, PollMs: ms(contract.NotifyPollInterval)}
		p.LatencyNotify = append(p.LatencyNotify, lr)
		progress("%s: latency at %.0f/s, woken by notifications", p.Name, rate)
		if err := e.peerLatency(ctx, srv, lr, p.Key, url, topic, *cg, pub); err != nil {
			lr.Err = err.Error()
			progress("%s: latency at %.0f/s, notified: FAILED: %v", p.Name, rate, err)
		}
	}
	return pub.stop()
}

// peerLatency runs measureLatency against a publisher that is already running, the consumer
// starting after what the topic already holds, an observer on srv counting its cost.
func (e *env) peerLatency(ctx context.Context, srv *pgtest.Server, lr *LatencyResult, label, url, topic string, cg cpuGroups, pub publisher) error {
	from, err := e.endOffsets(ctx, topic)
	if err != nil {
		return err
	}
	if e.cfg.statements > 0 {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		defer e.statementsTop(ctx, conn, fmt.Sprintf("latency at %.0f/s", lr.Rate))()
	}
	obs, err := newPGObserver(ctx, srv, "")
	if err != nil {
		return err
	}
	defer obs.close()
	return e.measureLatency(ctx, lr, latencyTarget{url: url, topic: topic, from: from, cg: cg, alive: pub.alive, peakRSS: pub.rss, label: label, obs: obs})
}

// topicEnds returns the offset at the end of each of topic's partitions.
func (e *env) topicEnds(ctx context.Context, topic string) (map[int32]int64, error) {
	ends, err := e.admin.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out, nil
}

// endOffsets returns the offsets at topic's end, by partition, as a consumer's starting
// offsets: a consumer starting there reads only what is appended from now on, whenever its
// first fetch goes out.
func (e *env) endOffsets(ctx context.Context, topic string) (map[int32]kgo.Offset, error) {
	ends, err := e.topicEnds(ctx, topic)
	if err != nil {
		return nil, err
	}
	from := map[int32]kgo.Offset{}
	for p, o := range ends {
		from[p] = kgo.NewOffset().At(o)
	}
	if len(from) == 0 {
		return nil, errors.New("no end offsets for the topic")
	}
	return from, nil
}

// insertProbe commits one event.
func (e *env) insertProbe(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, e.seqInsert(), "order-probe", seqPayload(-1, "order-probe"))
	return err
}

// insertChunks commits n generated events in transactions of chunk.
func insertChunks(ctx context.Context, url string, e *env, n int64, chunk int) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	start, lastReport := time.Now(), time.Now()
	for done := int64(0); done < n; done += int64(chunk) {
		m := min(int64(chunk), n-done)
		if err := insertPending(ctx, conn, e.table, done+1, m, e.cfg.aggregates); err != nil {
			return fmt.Errorf("insert the backlog: %w", err)
		}
		if time.Since(lastReport) >= 10*time.Second || done+m == n {
			lastReport = time.Now()
			progress("backlog: %d/%d rows (%.0f rows/s)", done+m, n, float64(done+m)/time.Since(start).Seconds())
		}
	}
	return nil
}

func dropDatabaseOn(ctx context.Context, srv *pgtest.Server, name string) {
	admin, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// setDatabase sets a parameter for the new sessions of database db (ALTER DATABASE ... SET).
func setDatabase(ctx context.Context, srv *pgtest.Server, db, name, value string) error {
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s SET %s = %s", pgx.Identifier{db}.Sanitize(), pgx.Identifier{name}.Sanitize(), value))
	return err
}
