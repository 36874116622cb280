package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-operator/outbox-operator/migrations"
)

// Relay publishes the pending rows of one shard of an outbox table to Kafka. Create it with
// New and run it with Run.
type Relay struct {
	cfg     Config
	log     *slog.Logger
	red     *redactor
	metrics *metrics
	pub     *publisher
	lockKey int32
	// layoutSQL holds the shard layout statements of the table, wakeSQL its wake-up protocol.
	layoutSQL migrations.LayoutSQL
	wakeSQL   migrations.WakeSQL
	curSQL    cursorSQL       // snapshot tracking's cursor set-up
	claimFor  time.Duration   // how long a claim to wait lasts
	connCfg   *pgx.ConnConfig // the lock connection: fetch and mark run on it
	auxCfg    *pgx.ConnConfig // LISTEN and the pending/lag statistics

	running atomic.Bool
	locked  atomic.Bool
	dbOK    atomic.Bool
	wake    chan struct{}
	// layoutWake is signalled when a layout notification arrives.
	layoutWake chan struct{}

	// The tenure the relay publishes under (nil while it stands by) and how to end it; shared
	// by the loop and the aux goroutine.
	tenMu      sync.Mutex
	ten        *tenure
	stopTenure context.CancelFunc
	standbyWhy atomic.Pointer[string] // why the relay does not publish, for /readyz
	// kafkaDown says why the last publication reached no broker; nil once one does. The relay
	// is not ready meanwhile: an outage of Kafka stops it as surely as one of PostgreSQL.
	kafkaDown atomic.Pointer[string]
	// kafkaState is the contract.RelayKafka* state behind kafkaDown ("" when nil); reported, the
	// one the lock connection's application_name carries (reportState).
	kafkaState, reported string
	// cursorWhy (snapshot tracking): why the table's cursor is refused; the relay is not ready
	// while it is set, though it holds its locks, until a tenure takes the cursor.
	cursorWhy atomic.Pointer[string]

	// Owned by the loop goroutine.
	blocked    map[string]blockEntry // by aggregate id
	parked     map[string]int        // snapshot tracking: parked events by aggregate id (nil in row tracking)
	keys       headerKeys
	skip       map[string]struct{}
	carry      []*batch // published, outcome known, not yet written to the database
	free       []*batch
	scratch    writeScratch
	wk         wakeState // the wake-up protocol on the lock connection
	contact    time.Time // when the lock connection's session last answered (lease.go)
	kafkaSeen  time.Time // when a publication or a probe last reached a broker
	dbFailures int
	outages    int
}

// blockEntry holds back the later events of an aggregate whose event failed.
type blockEntry struct {
	until    time.Time
	failures int
}

// Option configures a Relay.
type Option func(*Relay)

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(r *Relay) { r.log = l } }

// New validates cfg and returns a relay ready to Run. It connects to nothing yet.
func New(cfg Config, opts ...Option) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	shard := strconv.Itoa(cfg.ShardIndex)
	if cfg.ShardCount > 0 {
		shard += "/" + strconv.Itoa(cfg.ShardCount)
	}
	connCfg, err := connConfig(cfg.DatabaseURL, "outbox-relay "+cfg.Table.String()+" shard "+shard)
	if err != nil {
		return nil, err
	}
	// A cancelled wait for a bucket lock must end on the server too, not only in the client.
	connCfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, CancelRequestDelay: 0, DeadlineDelay: 2 * time.Second}
	}
	auxCfg, err := connConfig(cfg.DatabaseURL, "outbox-relay "+cfg.Table.String()+" shard "+shard+" (listen)")
	if err != nil {
		return nil, err
	}
	r := &Relay{
		cfg:        cfg,
		log:        slog.Default(),
		red:        newRedactor(cfg.DatabaseURL, connCfg.Password, cfg.Kafka.SASLPassword),
		metrics:    newMetrics(cfg.Table.String(), cfg.ShardIndex),
		lockKey:    cfg.Table.LockKey(),
		layoutSQL:  migrations.LayoutStatements(cfg.Table),
		wakeSQL:    migrations.WakeStatements(cfg.Table),
		curSQL:     newCursorSQL(cfg.Table),
		claimFor:   migrations.WakeClaim(cfg.PollInterval),
		connCfg:    connCfg,
		auxCfg:     auxCfg,
		wake:       make(chan struct{}, 1),
		layoutWake: make(chan struct{}, 1),
		blocked:    map[string]blockEntry{},
		keys:       headerKeys{},
		skip:       map[string]struct{}{},
	}
	for _, o := range opts {
		o(r)
	}
	if cfg.ShardCount > 0 {
		r.log = r.log.With("table", cfg.Table.String(), "shard", cfg.ShardIndex, "layout", cfg.ShardCount)
	} else {
		r.log = r.log.With("table", cfg.Table.String(), "shard", cfg.ShardIndex, "layout", "follow")
	}
	if r.pub, err = newPublisher(&r.cfg); err != nil {
		return nil, err
	}
	return r, nil
}

// Ready reports whether the relay holds all its bucket locks, its last database round trip
// succeeded and its last publication reached a broker (what /readyz answers).
func (r *Relay) Ready() bool {
	return r.locked.Load() && r.dbOK.Load() && r.cursorWhy.Load() == nil && r.kafkaDown.Load() == nil
}

func (r *Relay) notReadyReason() string {
	switch {
	case !r.running.Load():
		return "not running"
	case r.cursorWhy.Load() != nil:
		return "not publishing: " + *r.cursorWhy.Load()
	case !r.locked.Load():
		if w := r.standbyWhy.Load(); w != nil && *w != "" {
			return "not publishing: " + *w
		}
		return "waiting for the shard's bucket locks"
	case r.kafkaDown.Load() != nil:
		return *r.kafkaDown.Load()
	default:
		return "last database round trip failed"
	}
}

func (r *Relay) setReady() {
	if r.Ready() {
		r.metrics.ready.Set(1)
	} else {
		r.metrics.ready.Set(0)
	}
}

// Run publishes until ctx ends, then finishes the batch in flight (publish and mark), releases
// its locks and returns nil. PostgreSQL and Kafka outages are retried with backoff, never
// returned; Run returns an error only when it cannot start (the HTTP address is taken).
func (r *Relay) Run(ctx context.Context) error {
	r.log.Info("relay starting", "database", dbTarget(r.cfg.DatabaseURL), "brokers", r.cfg.Kafka.Brokers,
		"batch_size", r.cfg.BatchSize, "poison_policy", string(r.cfg.PoisonPolicy), "tracking", string(r.cfg.Tracking))
	if r.cfg.HTTPAddr != "" {
		stop, err := r.serveHTTP(ctx, r.cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("--http-addr %s: %w", r.cfg.HTTPAddr, err)
		}
		defer stop()
	}
	r.running.Store(true)
	defer r.running.Store(false)

	auxDone := make(chan struct{})
	auxCtx, stopAux := context.WithCancel(ctx)
	go func() {
		defer close(auxDone)
		r.aux(auxCtx)
	}()
	defer func() {
		stopAux()
		<-auxDone
	}()

	// Publishing gets its own context: a SIGTERM lets the batch in flight finish, up to
	// ShutdownTimeout.
	pubCtx, cancelPub := context.WithCancel(context.Background())
	defer cancelPub()
	go func() {
		select {
		case <-ctx.Done():
			t := time.AfterFunc(r.cfg.ShutdownTimeout, cancelPub)
			<-pubCtx.Done()
			t.Stop()
		case <-pubCtx.Done():
		}
	}()

	r.loop(ctx, pubCtx)
	if err := r.pub.close(); err != nil {
		r.log.Warn("closing the kafka writer", "err", r.red.Error(err))
	}
	r.log.Info("relay stopped")
	return nil
}

// loop holds the lock connection: connect and take the shard index's presence lock, wait for
// a layout this relay may publish, take its buckets, pump; when the layout changes, finish the
// batch in flight, give the buckets back and wait again. On a database failure back off,
// reconnect and lock again before anything else is fetched or marked.
func (r *Relay) loop(ctx, pubCtx context.Context) {
	var (
		conn *pgx.Conn
		held *tenure // the buckets conn holds
	)
	defer func() {
		if conn != nil {
			r.release(conn)
		}
		r.locked.Store(false)
		r.dbOK.Store(false)
		r.setReady()
	}()
	for ctx.Err() == nil {
		var err error
		if conn == nil {
			if conn, err = r.connect(ctx); err != nil {
				return // ctx ended
			}
			r.wk = newWakeState()
			r.reported = "" // a new connection carries its usual name
		}
		if held == nil {
			held, err = r.takeTenure(ctx, conn)
		}
		if err == nil {
			err = r.serve(ctx, pubCtx, conn, held)
			if err == nil {
				if ctx.Err() != nil {
					return // shut down cleanly: release gives everything back
				}
				// The layout changed: the batch in flight is recorded; give the buckets back.
				err = r.standDownBuckets(conn, held)
				held = nil
				if err == nil {
					continue
				}
			}
		}
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return
		}
		r.dbOK.Store(false)
		r.dbFailures++
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || conn.IsClosed() {
			// The lock connection is gone or in doubt: so are the locks. Nothing is fetched or
			// marked before they are taken again.
			_ = conn.Close(context.Background())
			conn, held = nil, nil
			r.locked.Store(false)
		}
		r.setReady()
		d := r.cfg.OutageBackoff.Delay(r.dbFailures)
		r.log.Warn("database round trip failed; retrying", "err", r.red.Error(err), "retry_in", d.Round(time.Millisecond).String(),
			"lock_connection_lost", conn == nil, "unrecorded_batches", len(r.carry))
		if !sleepCtx(ctx, d) {
			if conn != nil && held != nil && len(r.carry) > 0 {
				_ = r.pump(ctx, pubCtx, conn, held) // record what was published before stopping
			}
			return
		}
	}
}

// connect opens the lock connection and takes the presence lock of the relay's shard index,
// retrying with backoff until it succeeds or ctx ends. A second relay of the same index waits
// here.
func (r *Relay) connect(ctx context.Context) (*pgx.Conn, error) {
	for attempt := 1; ; attempt++ {
		conn, err := pgx.ConnectConfig(ctx, r.connCfg)
		if err == nil {
			tuneSession(ctx, conn)
			if _, lerr := conn.Exec(ctx, leaseSQL(r.cfg.LockLease)); lerr != nil {
				r.log.Warn("the lock connection runs without a lease (idle_session_timeout needs PostgreSQL 14): a frozen relay keeps its shard locked until it resumes or its connection is terminated",
					"err", r.red.Error(lerr))
			}
			if err = TuneFetchSession(ctx, conn); err == nil {
				err = lockKeys(ctx, conn, r.lockKey, []int32{int32(migrations.PresenceLock + r.cfg.ShardIndex)}, func(_ int32, holder int32) {
					r.log.Info("waiting for another relay of this shard index to stop", "holder_pid", holder)
				})
			}
			if err == nil {
				r.dbOK.Store(true)
				r.dbFailures = 0
				r.touched()
				r.setReady()
				return conn, nil
			}
			_ = conn.Close(context.Background())
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		d := r.cfg.OutageBackoff.Delay(attempt)
		r.log.Warn("cannot connect to the database; retrying", "err", r.red.Error(err), "retry_in", d.Round(time.Millisecond).String())
		if !sleepCtx(ctx, d) {
			return nil, ctx.Err()
		}
	}
}

// release gives every lock back and closes the lock connection.
func (r *Relay) release(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !conn.IsClosed() {
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err == nil && r.locked.Load() {
			r.log.Info("released the shard's bucket locks")
		}
	}
	_ = conn.Close(ctx)
	r.locked.Store(false)
}

// pump runs the pipelined relay loop on the lock connection until ctx ends (returns nil after
// recording the batch in flight) or a database round trip fails (returns its error, keeping
// the outcome of published batches in r.carry to record after reconnecting).
//
// Each iteration is one round trip that records the outcome of the previous batch and fetches
// the next one (excluding the rows in flight), then waits for the batch in flight, then starts
// publishing the fetched batch without the events of aggregates that just failed. So batch N+1
// is fetched while batch N is being published, and published only once N's outcome is known.
func (r *Relay) pump(ctx, pubCtx context.Context, conn *pgx.Conn, ten *tenure) error {
	record := r.carry
	r.carry = nil
	var cur *batch // in flight
	for {
		r.reportState(conn)
		start := time.Now()
		stopping := ctx.Err() != nil
		var fetched *batch
		if !stopping {
			fetched = r.getBatch()
			select { // rows committed before this fetch need no further wake-up
			case <-r.wake:
			default:
			}
		}
		if fetched != nil || len(record) > 0 {
			if err := r.roundTrip(conn, ten, record, cur, fetched); err != nil {
				r.putBatch(fetched)
				r.carryOver(record, cur, func(b *batch) { r.settle(b) })
				return err
			}
			record = r.roundTripOK(record)
		}
		var (
			outage     bool
			lastFailed map[string]struct{} // aggregates that failed in the batch that was in flight
		)
		if cur != nil {
			leaseErr := r.await(conn, cur.done)
			lastFailed, outage = r.settle(cur)
			record = append(record, cur)
			cur = nil
			if leaseErr != nil {
				r.putBatch(fetched)
				r.carryOver(record, nil, nil)
				return leaseErr
			}
		}
		if stopping {
			if len(record) == 0 {
				r.endClaim(conn)
				return nil
			}
			continue // one more round trip records the last batch
		}
		if outage {
			// Every broker is unreachable: the prefetched rows wait for the next fetch.
			r.putBatch(fetched)
			r.backOffOutage(ctx, conn, start, record)
			continue
		}
		full := fetched != nil && len(fetched.rows) == r.cfg.BatchSize
		if fetched != nil && len(fetched.rows) > 0 && ctx.Err() == nil {
			r.prepare(fetched, time.Now(), lastFailed)
			switch {
			case len(fetched.msgs) > 0:
				if err := r.leaseHeld(conn); err != nil {
					r.putBatch(fetched)
					r.carryOver(record, nil, nil)
					return err
				}
				cur = fetched
				go r.publish(pubCtx, cur)
			case fetched.hasOutcome(): // poison rows under block only
				fetched.settled = true
				record = append(record, fetched)
			default: // every row waits behind a failed event
				r.putBatch(fetched)
			}
		} else {
			r.putBatch(fetched)
		}
		r.metrics.tick.Observe(time.Since(start).Seconds())
		if cur == nil && !full && !needsRecord(record) && !r.claimBeforeIdle() {
			r.probeKafka(ctx)
			r.waitIdle(ctx, conn)
		}
	}
}

// backOffOutage waits, every broker being unreachable, before the next round (the relay backs
// off as a whole; no event is charged).
func (r *Relay) backOffOutage(ctx context.Context, conn *pgx.Conn, start time.Time, record []*batch) {
	r.outages++
	d := r.cfg.OutageBackoff.Delay(r.outages)
	r.metrics.tick.Observe(time.Since(start).Seconds())
	err := r.lastOutageErr(record)
	what := "kafka unreachable; retrying"
	if refused(err) {
		what = "kafka refused the relay (credentials, permissions, TLS or a missing topic); retrying"
	}
	r.log.Warn(what, "err", r.red.Error(err), "retry_in", d.Round(time.Millisecond).String())
	_ = r.sleepLeased(ctx, conn, d) // a session gone fails the next round trip, which reconnects
}

// roundTripOK notes a round trip that succeeded and releases the batches it recorded.
func (r *Relay) roundTripOK(record []*batch) []*batch {
	r.touched()
	r.dbOK.Store(true)
	r.dbFailures = 0
	r.setReady()
	for _, b := range record {
		r.putBatch(b)
	}
	return record[:0]
}

// carryOver keeps, after a failed round trip, the outcome of the batches in record and of cur
// (once its publication ends and settle has turned it into row states) to write after
// reconnecting. The failed round trip may have committed before the connection broke.
func (r *Relay) carryOver(record []*batch, cur *batch, settle func(*batch)) {
	if cur != nil {
		<-cur.done
		settle(cur)
		record = append(record, cur)
	}
	for _, b := range record {
		b.retried = true
	}
	r.carry = record
}

func needsRecord(bs []*batch) bool {
	for _, b := range bs {
		if b.hasOutcome() {
			return true
		}
	}
	return false
}

func (r *Relay) lastOutageErr(bs []*batch) error {
	for i := len(bs) - 1; i >= 0; i-- {
		if bs[i].outageErr != nil {
			return bs[i].outageErr
		}
	}
	return errors.New("kafka unreachable")
}

// idle waits for a notification, d, the end of an aggregate's backoff, or ctx, and reports
// whether a notification ended it.
// It pings conn every lease beat, and returns early if a ping fails (the next round trip then
// fails and reconnects).
func (r *Relay) idle(ctx context.Context, conn *pgx.Conn, d time.Duration) bool {
	now := time.Now()
	for _, e := range r.blocked {
		if w := e.until.Sub(now); w > 0 && w < d {
			d = w
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	beat := time.NewTicker(r.leaseBeat())
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-r.wake:
			return true
		case <-t.C:
			return false
		case <-beat.C:
			if err := r.ping(conn); err != nil {
				return false
			}
		}
	}
}

func (r *Relay) signalWake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// roundTrip sends, in one round trip and one implicit transaction on the lock connection, the
// outcome of the batches in record and, when into is not nil, the fetch of the next batch.
func (r *Relay) roundTrip(conn *pgx.Conn, ten *tenure, record []*batch, cur, into *batch) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	var pb pgx.Batch
	for _, b := range record {
		r.queueRecord(&pb, ten, b)
	}
	wakeDone := r.queueWake(&pb, into != nil)
	if into != nil {
		var inflight []int64
		if cur != nil {
			inflight = cur.inflight
		}
		sql, args := ten.q.fetchArgs(ten.buckets, inflight, r.blockedIDs(time.Now()))
		pb.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			var fds []pgconn.FieldDescription
			for rows.Next() {
				if fds == nil {
					fds = rows.FieldDescriptions() // only valid once the query ran
				}
				if err := into.scanRow(rows.RawValues(), fds); err != nil {
					return err
				}
			}
			return rows.Err()
		})
	}
	if pb.Len() == 0 {
		return nil
	}
	if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
		return err
	}
	wakeDone()
	return nil
}

// queueRecord queues the statements that write b's outcome: sent_at for the acknowledged rows,
// attempts and error (and sent_at for dead-lettered ones) for the others. They are the same
// under every layout; ten is where the relay's statements live.
func (r *Relay) queueRecord(pb *pgx.Batch, ten *tenure, b *batch) {
	var (
		ids      []int64
		lo, hi   time.Time
		fIDs     []int64
		fCreated []time.Time
		fInc     []int32
		fErr     []string
		fSent    []bool
		fLo, fHi time.Time
	)
	for i := range b.rows {
		row := &b.rows[i]
		switch row.state {
		case rowSent:
			if len(ids) == 0 || row.createdAt.Before(lo) {
				lo = row.createdAt
			}
			if len(ids) == 0 || row.createdAt.After(hi) {
				hi = row.createdAt
			}
			ids = append(ids, row.id)
		case rowFailed, rowDeadSent:
			if len(fIDs) == 0 || row.createdAt.Before(fLo) {
				fLo = row.createdAt
			}
			if len(fIDs) == 0 || row.createdAt.After(fHi) {
				fHi = row.createdAt
			}
			fIDs = append(fIDs, row.id)
			fCreated = append(fCreated, row.createdAt)
			fInc = append(fInc, row.inc)
			fErr = append(fErr, row.errText)
			fSent = append(fSent, row.state == rowDeadSent)
		}
	}
	if len(ids) > 0 {
		want, retried := len(ids), b.retried
		pb.Queue(ten.q.mark, ids, lo, hi).Exec(func(ct pgconn.CommandTag) error {
			if n := int(ct.RowsAffected()); n != want && !retried {
				r.log.Warn("marked fewer rows sent than were acknowledged: the others were already sent (by a relay that ran before the locks were taken?)",
					"acknowledged", want, "marked", n)
			}
			return nil
		})
	}
	if len(fIDs) > 0 {
		pb.Queue(ten.q.record, fIDs, fCreated, fInc, fErr, fSent, fLo, fHi)
	}
}

// blockedIDs returns the aggregates whose backoff has not ended, and forgets the entries that
// ended long ago.
func (r *Relay) blockedIDs(now time.Time) []string {
	if len(r.blocked) == 0 {
		r.metrics.blocked.Set(0)
		return nil
	}
	ids := make([]string, 0, len(r.blocked))
	for id, e := range r.blocked {
		switch {
		case e.until.After(now):
			ids = append(ids, id)
		case now.Sub(e.until) > r.cfg.RetryBackoff.Max:
			delete(r.blocked, id)
		}
	}
	sort.Strings(ids)
	r.metrics.blocked.Set(float64(len(ids)))
	return ids
}

// block holds back the aggregate's later events for d.
func (r *Relay) block(aggID []byte, d time.Duration, failures int) {
	r.blocked[string(aggID)] = blockEntry{until: time.Now().Add(d), failures: failures}
}

func (r *Relay) topicFor(aggType []byte) (string, bool) {
	if t, ok := r.cfg.TopicMap[string(aggType)]; ok {
		return t, true
	}
	if r.cfg.DefaultTopic != "" {
		return r.cfg.DefaultTopic, true
	}
	return "", false
}

// prepare decides, row by row in id order, what to publish: it skips the events of aggregates
// that are blocked or failed in the batch before (and the later events of an aggregate one of
// whose events is skipped, poison or dead-lettered in this batch), deals with poison events,
// and builds the messages.
func (r *Relay) prepare(b *batch, now time.Time, lastFailed map[string]struct{}) {
	clear(r.skip)
	b.msgs = b.msgs[:0]
	b.msgRows = b.msgRows[:0]
	b.sizes = b.sizes[:0]
	b.hdrs = b.hdrs[:0]
	b.inflight = b.inflight[:0]
	for i := range b.rows {
		row := &b.rows[i]
		if _, ok := r.skip[string(row.aggID)]; ok {
			row.state = rowSkipped
			continue
		}
		if n := r.parked[string(row.aggID)]; n > 0 && !b.pos.parked {
			// Snapshot tracking: the aggregate has parked events; this one waits behind them.
			row.state = rowSkipped
			r.skip[string(row.aggID)] = struct{}{}
			continue
		}
		_, failed := lastFailed[string(row.aggID)]
		entry, retrying := r.blocked[string(row.aggID)]
		if failed || retrying && entry.until.After(now) {
			row.state = rowSkipped
			r.skip[string(row.aggID)] = struct{}{}
			continue
		}
		if retrying {
			// An aggregate whose event failed is retried with that event alone, so that a failure
			// is charged to the event that causes it, not to its successors sharing its request.
			r.skip[string(row.aggID)] = struct{}{}
		}
		topic, known := r.topicFor(row.aggType)
		hstart := len(b.hdrs)
		var hdrErr error
		b.hdrs, hdrErr = appendEventHeaders(b.hdrs, row, r.keys)
		if hdrErr != nil {
			b.hdrs = b.hdrs[:hstart+4] // the standard headers only
		}
		size := messageSize(row.aggID, row.payload, b.hdrs[hstart:])
		reason, detail := "", ""
		switch {
		case !known:
			reason, detail = reasonNoTopic, fmt.Sprintf("poison: no topic for aggregate type %q (not in --topic-map, and no --default-topic)", row.aggType)
		case len(row.payload) > r.cfg.MaxPayloadBytes:
			reason, detail = reasonOversized, fmt.Sprintf("poison: payload of %d bytes exceeds --max-payload-bytes %d", len(row.payload), r.cfg.MaxPayloadBytes)
		case size > r.pub.callBytes:
			reason, detail = reasonOversized, fmt.Sprintf("poison: message of about %d bytes (payload and headers) exceeds the %d bytes a produce request may carry", size, r.pub.callBytes)
		case hdrErr != nil:
			reason, detail = reasonBadHeaders, "poison: "+hdrErr.Error()
		case int(row.attempts) >= r.cfg.MaxAttempts:
			reason, detail = reasonMaxAttempts, fmt.Sprintf("poison: failed %d times (--max-attempts %d)", row.attempts, r.cfg.MaxAttempts)
		}
		row.poison = reason
		row.topic = topic
		if reason != "" {
			r.metrics.poison.WithLabelValues(reason, string(r.cfg.PoisonPolicy)).Inc()
			switch {
			case r.cfg.PoisonPolicy == PoisonDeadLetter:
				r.log.Warn("poison event: dead-lettering it", "reason", reason, "detail", detail, "id", row.id,
					"event_id", string(row.eventID), "aggregate_type", string(row.aggType), "aggregate_id", string(row.aggID),
					"dead_letter_topic", r.cfg.DeadLetterTopic)
				row.errText = "dead-lettered to " + r.cfg.DeadLetterTopic + ": " + detail
				b.hdrs = append(b.hdrs, kafka.Header{Key: HeaderError, Value: []byte(detail)})
				if known {
					b.hdrs = append(b.hdrs, kafka.Header{Key: HeaderOriginalTopic, Value: []byte(topic)})
				}
				value := row.payload
				if size > r.pub.callBytes {
					// Too large for any produce request: the dead letter carries the headers and the
					// error; the payload stays in the outbox row.
					value = nil
				}
				row.topic = r.cfg.DeadLetterTopic
				r.addMessage(b, i, row, value, b.hdrs[hstart:len(b.hdrs):len(b.hdrs)])
				// Later events of the aggregate wait until the dead letter is acknowledged.
				r.skip[string(row.aggID)] = struct{}{}
				continue
			case reason != reasonMaxAttempts:
				r.publishErrorsInc(1)
				b.hdrs = b.hdrs[:hstart]
				row.state = rowFailed
				row.inc = 1
				row.errText = detail
				r.block(row.aggID, r.cfg.RetryBackoff.Longest(), int(row.attempts)+1)
				r.skip[string(row.aggID)] = struct{}{}
				r.log.Warn("poison event: blocking its aggregate", "reason", reason, "detail", detail, "id", row.id,
					"event_id", string(row.eventID), "aggregate_type", string(row.aggType), "aggregate_id", string(row.aggID),
					"attempts", row.attempts+1)
				continue
			default:
				// Under block, an event that failed max-attempts times is retried (at the longest
				// backoff, see settle).
				r.log.Warn("poison event: retrying it", "reason", reason, "detail", detail, "id", row.id,
					"event_id", string(row.eventID), "aggregate_type", string(row.aggType), "aggregate_id", string(row.aggID))
			}
		}
		r.addMessage(b, i, row, row.payload, b.hdrs[hstart:len(b.hdrs):len(b.hdrs)])
	}
}

func (r *Relay) addMessage(b *batch, i int, row *row, value []byte, hdrs []kafka.Header) {
	row.state = rowInFlight
	b.msgs = append(b.msgs, kafka.Message{Topic: row.topic, Key: row.aggID, Value: value, Headers: hdrs})
	b.msgRows = append(b.msgRows, i)
	b.sizes = append(b.sizes, messageSize(row.aggID, value, hdrs))
	b.inflight = append(b.inflight, row.id)
}

var errSkipped = errors.New("not published: an earlier event of its aggregate failed in this batch")

// publish writes b's messages in chunks that fit one produce request per partition. A chunk
// is written only after the previous one's outcome is known, without the events of aggregates
// that failed in it. It runs on its own goroutine and closes b.done.
func (r *Relay) publish(ctx context.Context, b *batch) {
	defer close(b.done)
	n := len(b.msgs)
	b.errs = append(b.errs[:0], make([]error, n)...)
	var failed map[string]struct{}
	for start := 0; start < n; {
		end, size := start, 0
		for end < n && (end == start || size+b.sizes[end] <= r.pub.callBytes) {
			size += b.sizes[end]
			end++
		}
		msgs, errs := b.msgs[start:end], b.errs[start:end]
		if failed != nil {
			b.tmpMsgs, b.tmpIdx = b.tmpMsgs[:0], b.tmpIdx[:0]
			for k := range msgs {
				if _, ok := failed[string(msgs[k].Key)]; ok {
					errs[k] = errSkipped
					continue
				}
				b.tmpMsgs = append(b.tmpMsgs, msgs[k])
				b.tmpIdx = append(b.tmpIdx, k)
			}
			b.tmpErrs = append(b.tmpErrs[:0], make([]error, len(b.tmpMsgs))...)
			if !r.pub.write(ctx, b.tmpMsgs, b.tmpErrs, &r.scratch) {
				b.tainted = true
			}
			for j, k := range b.tmpIdx {
				errs[k] = b.tmpErrs[j]
			}
		} else if !r.pub.write(ctx, msgs, errs, &r.scratch) {
			b.tainted = true
		}
		for k := range msgs {
			if errs[k] != nil && errs[k] != errSkipped {
				if failed == nil {
					failed = map[string]struct{}{}
				}
				failed[string(msgs[k].Key)] = struct{}{}
			}
		}
		start = end
	}
}

// settle turns the outcome of b's publication into row states, blocks the aggregates that
// failed and returns them. outage reports that every message failed for want of a reachable
// broker; then no aggregate is blocked and no attempt is counted: the relay backs off as a whole.
func (r *Relay) settle(b *batch) (failed map[string]struct{}, outage bool) {
	if b.settled {
		return nil, false
	}
	b.settled = true
	attempted, unreachable := 0, 0
	for k := range b.msgs {
		if err := b.errs[k]; err != errSkipped {
			attempted++
			if transient(err) || refused(err) {
				unreachable++
				b.outageErr = err
			}
		}
	}
	outage = attempted > 0 && unreachable == attempted
	if !outage {
		r.outages = 0
	}
	if attempted > 0 {
		r.kafkaReached(outage, b.outageErr)
	}
	var (
		published, errorsN int
		firstErr           string
		firstRow           *row
		firstDelay         time.Duration
	)
	for k := range b.msgs {
		row := &b.rows[b.msgRows[k]]
		err := b.errs[k]
		switch {
		case err == errSkipped:
			row.state = rowSkipped
		case err == nil && row.topic == r.cfg.DeadLetterTopic && row.poison != "" && r.cfg.PoisonPolicy == PoisonDeadLetter:
			row.state = rowDeadSent
			row.inc = 1
			delete(r.blocked, string(row.aggID))
		case err == nil:
			row.state = rowSent
			published++
			delete(r.blocked, string(row.aggID))
		default:
			if _, seen := failed[string(row.aggID)]; seen {
				// A later event of an aggregate whose earlier event failed in the same request:
				// the failure is charged to the earlier one; this one waits, untouched.
				row.state = rowSkipped
				continue
			}
			errorsN++
			row.state = rowFailed
			row.err = err
			msg := r.red.Error(err)
			if row.topic == r.cfg.DeadLetterTopic && row.poison != "" {
				msg = "dead-letter publish to " + row.topic + " failed: " + msg
			} else {
				msg = "publish to " + row.topic + " failed: " + msg
			}
			row.errText = truncate(msg, 2000)
			if failed == nil {
				failed = map[string]struct{}{}
			}
			failed[string(row.aggID)] = struct{}{}
			if outage {
				row.inc = 0 // not the event's fault
				continue
			}
			e := r.blocked[string(row.aggID)]
			n := e.failures + 1
			if transient(err) || refused(err) { // the cluster's, or its refusal of the relay
				row.inc = 0
			} else {
				row.inc = 1
				n = max(n, int(row.attempts)+1)
			}
			d := r.cfg.RetryBackoff.Delay(n)
			if int(row.attempts)+int(row.inc) >= r.cfg.MaxAttempts {
				d = r.cfg.RetryBackoff.Longest()
			}
			r.block(row.aggID, d, n)
			if firstErr == "" {
				firstErr, firstRow, firstDelay = msg, row, d
			}
			r.log.Debug("publish failed; holding back the aggregate's later events", "err", msg, "id", row.id,
				"event_id", string(row.eventID), "aggregate_id", string(row.aggID), "attempts", int(row.attempts)+int(row.inc),
				"retry_in", d.Round(time.Millisecond).String())
		}
	}
	if firstRow != nil {
		r.log.Warn("publish failed; holding back the later events of the failed aggregates", "events", errorsN,
			"err", firstErr, "first_id", firstRow.id, "first_event_id", string(firstRow.eventID),
			"first_aggregate_id", string(firstRow.aggID), "attempts", int(firstRow.attempts)+int(firstRow.inc),
			"retry_in", firstDelay.Round(time.Millisecond).String())
	}
	// Rows skipped mid-flight belong to failed aggregates already; make sure of it.
	for k := range b.msgs {
		if b.errs[k] == errSkipped {
			if failed == nil {
				failed = map[string]struct{}{}
			}
			failed[string(b.rows[b.msgRows[k]].aggID)] = struct{}{}
		}
	}
	r.metrics.published.Add(float64(published))
	r.publishErrorsInc(errorsN)
	return failed, outage
}

func (r *Relay) publishErrorsInc(n int) {
	if n > 0 {
		r.metrics.publishErrors.Add(float64(n))
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// sleepCtx sleeps for d or until ctx ends; it reports whether it slept the whole time.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
