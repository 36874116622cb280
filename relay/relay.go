package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// Relay publishes the pending rows of one shard of an outbox table to Kafka. Create it with
// New and run it with Run.
type Relay struct {
	cfg     Config
	log     *slog.Logger
	red     *redactor
	metrics *metrics
	pub     publisher
	trace   *tracing        // nil without --otlp-endpoint
	schemas *schemaRegistry // nil without --schema-registry-url
	mode    trackingMode    // row or snapshot tracking (mode.go)
	lockKey int32
	session string // the token that marks the lock connection's session (session.go)
	// noSessionTimeout: the server has no idle_session_timeout, so lockKeys enforces the lease.
	noSessionTimeout bool
	// layoutSQL holds the shard layout statements of the table, wakeSQL its wake-up protocol.
	layoutSQL outboxdb.LayoutSQL
	wakeSQL   outboxdb.WakeSQL
	claimFor  time.Duration   // how long a claim to wait lasts
	connCfg   *pgx.ConnConfig // the lock connection: fetch and mark run on it
	auxCfg    *pgx.ConnConfig // LISTEN and the pending/lag statistics
	replayCfg *pgx.ConnConfig // replays (replay.go)
	replaySQL outboxdb.ReplaySQL
	// replayRunner names this relay in <table>_replays.runner.
	replayRunner string
	// replaying is set while the replay goroutine runs; Run waits for it in replays.
	replaying atomic.Bool
	// statsQuiet is set by the aux goroutine while the statistics are refreshed only every
	// statsIdleInterval (nothing pending, nothing fetched); the loop, fetching events, ends the
	// aux goroutine's wait with statsWake so that they are measured at once.
	statsQuiet atomic.Bool
	statsWake  atomic.Pointer[context.CancelFunc]
	fetched    atomic.Bool // the loop fetched events since the last measure
	replays    sync.WaitGroup

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

	// Aggregates whose backoff someone ended (kubectl outbox retry and skip, on the table's
	// channel: outboxdb.RetryNotification), from the aux goroutine to the loop: retryAll for
	// every aggregate. retryPending tells the loop, at the cost of an atomic load, that some wait.
	retryMu      sync.Mutex
	retryAggs    map[string]struct{}
	retryAll     bool
	retryPending atomic.Bool

	// Owned by the loop goroutine.
	blocked map[string]blockEntry // by aggregate id
	// planned is when the loop last decided what to fetch (the round's start): a backoff that
	// ended before it was seen ended by that decision, one that ends after it was not (idle).
	planned time.Time
	keys    headerKeys
	// ceSource is the CloudEvents source attribute (--cloudevents-source, or /outbox/<table>).
	ceSource   []byte
	skip       map[string]struct{}
	carry      []*batch // published, outcome known, not yet written to the database
	free       []*batch
	wk         wakeState // the wake-up protocol on the lock connection
	contact    time.Time // when the lock connection's session last answered (lease.go)
	kafkaSeen  time.Time // when a publication or a probe last reached a broker
	dbFailures int
	outages    int
	// refused is why the relay stopped without being asked to (refusal): the server is older
	// than outboxdb.MinServerVersion, or the lock connection does not keep its session. Run
	// returns it.
	refused error
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
	connCfg, err := ConnConfig(cfg.DatabaseURL, "outbox-relay "+cfg.Table.String()+" shard "+shard)
	if err != nil {
		return nil, err
	}
	// A cancelled wait for a bucket lock must end on the server too, not only in the client.
	connCfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, CancelRequestDelay: 0, DeadlineDelay: 2 * time.Second}
	}
	auxCfg, err := ConnConfig(cfg.DatabaseURL, "outbox-relay "+cfg.Table.String()+" shard "+shard+" (listen)")
	if err != nil {
		return nil, err
	}
	replayCfg, err := ConnConfig(cfg.DatabaseURL, "outbox-relay "+cfg.Table.String()+" shard "+shard+" (replay)")
	if err != nil {
		return nil, err
	}
	r := &Relay{
		cfg:          cfg,
		log:          slog.Default(),
		red:          newRedactor(cfg.DatabaseURL, connCfg.Password, cfg.Kafka.SASLPassword, cfg.Schemas.Password),
		metrics:      newMetrics(cfg.Table.String(), cfg.ShardIndex),
		lockKey:      cfg.Table.LockKey(),
		layoutSQL:    outboxdb.LayoutStatements(cfg.Table),
		wakeSQL:      outboxdb.WakeStatements(cfg.Table),
		claimFor:     outboxdb.WakeClaim(cfg.PollInterval),
		connCfg:      connCfg,
		auxCfg:       auxCfg,
		replayCfg:    replayCfg,
		replaySQL:    outboxdb.ReplayStatements(cfg.Table, fetchColumns),
		replayRunner: replayRunner(cfg.ShardIndex),
		wake:         make(chan struct{}, 1),
		layoutWake:   make(chan struct{}, 1),
		blocked:      map[string]blockEntry{},
		keys:         headerKeys{},
		ceSource:     []byte(cmp.Or(cfg.CloudEventsSource, "/outbox/"+cfg.Table.String())),
		skip:         map[string]struct{}{},
	}
	for _, o := range opts {
		o(r)
	}
	if cfg.ShardCount > 0 {
		r.log = r.log.With("table", cfg.Table.String(), "shard", cfg.ShardIndex, "layout", cfg.ShardCount)
	} else {
		r.log = r.log.With("table", cfg.Table.String(), "shard", cfg.ShardIndex, "layout", "follow")
	}
	r.mode = newMode(r)
	if r.pub, err = newKafkaPublisher(&r.cfg); err != nil {
		return nil, err
	}
	if r.schemas, err = newSchemaRegistry(r.cfg.Schemas); err != nil {
		return nil, err
	}
	if r.trace, err = newTracing(&r.cfg, r.log); err != nil {
		return nil, fmt.Errorf("--otlp-endpoint: %w", err)
	}
	return r, nil
}

// Ready reports whether the relay holds all its bucket locks, its last database round trip
// succeeded and its last publication reached a broker (what /readyz answers).
func (r *Relay) Ready() bool {
	return r.locked.Load() && r.dbOK.Load() && r.mode.refusal() == "" && r.kafkaDown.Load() == nil && r.registryDown() == ""
}

// registryDown says why the schema registry could not be asked last ("" when it answered, or
// the relay frames nothing).
func (r *Relay) registryDown() string {
	if r.schemas == nil {
		return ""
	}
	if d := r.schemas.down.Load(); d != nil {
		return *d
	}
	return ""
}

func (r *Relay) notReadyReason() string {
	switch {
	case !r.running.Load():
		return "not running"
	case r.mode.refusal() != "":
		return "not publishing: " + r.mode.refusal()
	case !r.locked.Load():
		if w := r.standbyWhy.Load(); w != nil && *w != "" {
			return "not publishing: " + *w
		}
		return "waiting for the shard's bucket locks"
	case r.kafkaDown.Load() != nil:
		return *r.kafkaDown.Load()
	case r.registryDown() != "":
		return r.registryDown()
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
// returned; Run returns an error only when it cannot start (the HTTP address is taken), the
// server is older than outboxdb.MinServerVersion (an *outboxdb.UnsupportedServerError) or the
// lock connection does not keep its session (a *SessionNotKeptError).
func (r *Relay) Run(ctx context.Context) error {
	r.log.Info("relay starting", "database", DBTarget(r.cfg.DatabaseURL), "brokers", r.cfg.Kafka.Brokers,
		"batch_size", r.cfg.BatchSize, "poison_policy", string(r.cfg.PoisonPolicy), "tracking", string(r.cfg.Tracking),
		"procs", runtime.GOMAXPROCS(0))
	if r.cfg.HTTPAddr != "" {
		stop, err := r.serveHTTP(ctx, r.cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("--http-addr %s: %w", r.cfg.HTTPAddr, err)
		}
		defer stop()
	}
	r.running.Store(true)
	defer r.running.Store(false)
	defer r.trace.shutdown() // the spans buffered, exported last

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

	auxDone := make(chan struct{})
	auxCtx, stopAux := context.WithCancel(ctx)
	go func() {
		defer close(auxDone)
		r.aux(auxCtx, pubCtx)
	}()

	r.loop(ctx, pubCtx)
	stopAux()
	<-auxDone
	r.replays.Wait() // a replay in flight finishes its batch (under pubCtx) and commits it
	if err := r.pub.close(); err != nil {
		r.log.Warn("closing the kafka writer", "err", r.red.Error(err))
	}
	if r.refused != nil {
		return r.refused
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
		switch {
		case conn != nil && sessionNotKept(r.refused):
			_ = conn.Close(context.Background()) // no unlock: the session's locks may be another relay's
		case conn != nil:
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
				if refusal(err) {
					r.refused = err
				}
				return // ctx ended, the server is too old, or the connection keeps no session
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
		if refusal(err) {
			r.refused = err
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
				r.recordCarried(ctx, pubCtx, conn, held)
			}
			return
		}
	}
}

// recordCarried records, on stopping (ctx has ended), what was published before the last round
// trip failed: a tracker of the tenure pumps, which fetches nothing once ctx has ended.
func (r *Relay) recordCarried(ctx, pubCtx context.Context, conn *pgx.Conn, ten *tenure) {
	bctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	tr, err := r.mode.begin(bctx, conn, ten)
	cancel()
	if err != nil {
		return
	}
	_ = r.pump(ctx, pubCtx, conn, ten, tr)
}

// connect opens the lock connection and takes the presence lock of the relay's shard index,
// retrying with backoff until it succeeds or ctx ends. A second relay of the same index waits
// here. A server older than outboxdb.MinServerVersion ends it with that error.
func (r *Relay) connect(ctx context.Context) (*pgx.Conn, error) {
	for attempt := 1; ; attempt++ {
		conn, err := pgx.ConnectConfig(ctx, r.connCfg)
		if err == nil {
			if err = outboxdb.CheckServerVersionConn(ctx, conn); err != nil {
				_ = conn.Close(context.Background())
				if refusal(err) {
					return nil, err
				}
			}
		}
		if err == nil {
			tuneSession(ctx, conn)
			_, lerr := conn.Exec(ctx, leaseSQL(r.cfg.LockLease))
			if lerr != nil && !r.noSessionTimeout {
				r.log.Info("the server has no idle_session_timeout (PostgreSQL 13): a relay waiting for a lock ends a holder's session idle for longer than the lease itself",
					"err", r.red.Error(lerr))
			}
			r.noSessionTimeout = lerr != nil
			presence := int32(outboxdb.PresenceLock + r.cfg.ShardIndex)
			if err = TuneFetchSession(ctx, conn); err == nil {
				err = r.checkFreshSession(ctx, conn)
			}
			if err == nil {
				err = lockKeys(ctx, conn, r.lockKey, []int32{presence}, r.waitLease(), func(_ int32, holder int32) {
					r.log.Info("waiting for another relay of this shard index to stop", "holder_pid", holder)
				})
			}
			if err == nil {
				err = r.markSession(ctx, conn, presence)
			}
			if sessionNotKept(err) {
				// No unlock: the locks of that session may be another relay's.
				_ = conn.Close(context.Background())
				return nil, err
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

// refusal reports whether err ends the relay, since no retry mends it: a server older than
// outboxdb.MinServerVersion, or a lock connection that does not keep its session.
func refusal(err error) bool {
	var unsupported *outboxdb.UnsupportedServerError
	return errors.As(err, &unsupported) || sessionNotKept(err)
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

var errSkipped = errors.New("not published: an earlier event of its aggregate failed in this batch")

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
