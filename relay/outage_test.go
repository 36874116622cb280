package relay

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// resilientWriters append events like startWriters, but survive a database restart: a failed
// transaction is retried with the same event ids unless its first event turns out committed,
// so the expected sequence stays exact.
type resilientWriters struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	want   map[string]int
	// issued is the last sequence number of each aggregate that a writer's transaction carried,
	// committed or not (yet).
	issued map[string]int
	total  int
	fails  int
	// unconfirmed holds the events of transactions whose COMMIT's wait for the synchronous
	// standby was cancelled (the writer's timeout): PostgreSQL committed them locally, said so
	// with a warning, and does not promise that the standby has them.
	unconfirmed map[seqEvent]bool
	notices     map[uint32]int // by backend pid: such warnings received
}

// syncWaitCancelled is the start of the warning PostgreSQL sends when a COMMIT's wait for
// synchronous replication ends by a cancel: the transaction committed locally only.
const syncWaitCancelled = "canceling wait for synchronous replication"

// unconfirmedEvents is a copy of the events whose commits the standby may not have.
func (l *resilientWriters) unconfirmedEvents() map[seqEvent]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.unconfirmed)
}

func startResilientWriters(t testing.TB, url string, writers, aggs, perTx int, pause time.Duration) *resilientWriters {
	t.Helper()
	return startResilientWritersFrom(t, url, 0, writers, aggs, perTx, pause)
}

// startResilientWritersFrom is startResilientWriters with the writers numbered from first (their
// aggregates are w<number>-agg-NNN), so that groups of writers on different URLs of one database
// own disjoint aggregates.
func startResilientWritersFrom(t testing.TB, url string, first, writers, aggs, perTx int, pause time.Duration) *resilientWriters {
	t.Helper()
	l := &resilientWriters{want: map[string]int{}, issued: map[string]int{}, unconfirmed: map[seqEvent]bool{}, notices: map[uint32]int{}}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		if strings.HasPrefix(n.Message, syncWaitCancelled) {
			l.mu.Lock()
			l.notices[c.PID()]++
			l.mu.Unlock()
		}
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	// notices returns how many warnings conn's backend sent so far.
	notices := func(conn *pgxpool.Conn) int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.notices[conn.Conn().PgConn().PID()]
	}
	for wr := first; wr < first+writers; wr++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			seq := map[string]int{}
			for i := 0; ctx.Err() == nil; i++ {
				next := map[string]int{}
				evs := make([]outbox.Event, 0, perTx)
				sevs := make([]seqEvent, 0, perTx) // evs' payloads
				for j := range perTx {
					a := fmt.Sprintf("w%d-agg-%03d", wr, (i*perTx+j)%aggs)
					if _, ok := next[a]; !ok {
						next[a] = seq[a]
					}
					next[a]++
					sevs = append(sevs, seqEvent{Agg: a, Seq: next[a]})
					p, _ := json.Marshal(sevs[len(sevs)-1])
					evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: a, EventType: "Seq", Payload: p, EventID: newUUID()})
				}
				l.mu.Lock()
				for a, n := range next {
					l.issued[a] = max(l.issued[a], n)
				}
				l.mu.Unlock()
				for {
					// Bounded, as an application's transactions are: a connection to a host
					// that vanished answers nothing (TestAddressMoves).
					tctx, tcancel := context.WithTimeout(context.Background(), 10*time.Second)
					conn, err := pool.Acquire(tctx)
					if err == nil {
						before := notices(conn)
						err = pgx.BeginFunc(tctx, conn, func(tx pgx.Tx) error {
							_, err := w.AppendBatch(tctx, tx, evs)
							return err
						})
						if notices(conn) > before {
							l.mu.Lock()
							for _, ev := range sevs {
								l.unconfirmed[ev] = true
							}
							l.mu.Unlock()
						}
						conn.Release()
					}
					tcancel()
					if err == nil {
						break
					}
					l.mu.Lock()
					l.fails++
					l.mu.Unlock()
					// Committed after all (the answer was lost)?
					var n int
					for {
						qctx, qcancel := context.WithTimeout(context.Background(), 5*time.Second)
						err = pool.QueryRow(qctx, `SELECT count(*) FROM outbox WHERE event_id = $1::uuid`, evs[0].EventID).Scan(&n)
						qcancel()
						if err == nil {
							break
						}
						time.Sleep(100 * time.Millisecond)
					}
					if n > 0 {
						break
					}
				}
				for a, n := range next {
					seq[a] = n
				}
				l.mu.Lock()
				l.total += len(evs)
				for a, n := range next {
					l.want[a] = n
				}
				l.mu.Unlock()
				time.Sleep(pause)
			}
		}()
	}
	return l
}

// issuedSeqs is a copy of the last sequence number of each aggregate that a writer's
// transaction carried so far, committed or not: an event with a higher number belongs to a
// transaction begun after the call.
func (l *resilientWriters) issuedSeqs() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.issued)
}

func (l *resilientWriters) stop() (map[string]int, int, int) {
	l.cancel()
	l.wg.Wait()
	return l.want, l.total, l.fails
}

// TestPostgresRestart restarts a dedicated PostgreSQL server twice while writers append and the
// relay publishes: the relay loses its lock connection, reconnects, takes its bucket locks
// again and drains the backlog; nothing is lost and the order per aggregate holds.
func TestPostgresRestart(t *testing.T) { forEachTracking(t, testPostgresRestart) }

func testPostgresRestart(t *testing.T, tracking Tracking) {
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	url := srv.NewDatabase(t)
	pool := newOutboxDB(t, url)
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.pgrestart")
	k.CreateTopic(t, topic, 6)
	c := newCollector(t, k, topic)

	r := startRelay(t, withTracking(testConfig(url, k.Brokers, topic), tracking), "relay")
	waitFor(t, 30*time.Second, "relay ready", r.Ready)
	load := startResilientWriters(t, url, 2, 50, 10, 5*time.Millisecond)
	for i := range 2 {
		time.Sleep(1500 * time.Millisecond)
		start := time.Now()
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		t.Logf("restart %d: PostgreSQL back after %s", i+1, time.Since(start).Round(time.Millisecond))
		waitFor(t, 30*time.Second, "relay ready again (locks taken again)", r.Ready)
		t.Logf("restart %d: relay ready %s after the restart began", i+1, time.Since(start).Round(time.Millisecond))
	}
	time.Sleep(time.Second)
	want, total, fails := load.stop()
	waitFor(t, time.Minute, "the backlog to drain", func() bool { return pendingRows(t, pool) == 0 })
	c.waitDistinct(t, total, time.Minute)
	c.poll(t, 500*time.Millisecond)
	dups := checkOrder(t, c.recs, want)
	t.Logf("%d events (%d writer transactions retried), 0 lost, 0 reordered, %d duplicates", total, fails, dups)
}

// TestKafkaOutage stops a dedicated Apache Kafka broker for 30 s while writers append: the
// relay backs off (without counting attempts against the events), keeps its locks, and drains
// the backlog in order once the broker is back. The two tracking modes run at once, each on its
// own broker and database: the test is mostly the outage's wait.
func TestKafkaOutage(t *testing.T) {
	forEachTracking(t, func(t *testing.T, tracking Tracking) {
		t.Parallel()
		testKafkaOutage(t, tracking)
	})
}

func testKafkaOutage(t *testing.T, tracking Tracking) {
	if testing.Short() {
		t.Skip("stops a broker for 30 s")
	}
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	k := kafkatest.NewApache(t)
	topic := kafkatest.UniqueTopic("relay.outage")
	k.CreateTopic(t, topic, 6)

	cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	cfg.KafkaProbeInterval = time.Second
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "relay ready", r.Ready)
	load := startResilientWriters(t, url, 2, 50, 10, 20*time.Millisecond)
	time.Sleep(2 * time.Second)
	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Log("broker stopped")
	time.Sleep(30 * time.Second) // the outage the relay must ride out
	pendingDuring := pendingRows(t, pool)
	if r.Ready() {
		t.Error("relay ready during a broker outage: readiness must say that it cannot publish")
	}
	if got := r.notReadyReason(); !strings.HasPrefix(got, "kafka unreachable") {
		t.Errorf("not ready because %q, want kafka unreachable", got)
	}
	if err := k.StartAgain(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitFor(t, time.Minute, "relay ready again once the broker is back", r.Ready)
	t.Logf("broker back after %s with %d events pending", back.Sub(stopped).Round(time.Millisecond), pendingDuring)
	if pendingDuring == 0 {
		t.Error("nothing pending after 30 s without a broker: the outage did not happen")
	}
	time.Sleep(time.Second)
	want, total, _ := load.stop()
	waitFor(t, 2*time.Minute, "the backlog to drain", func() bool { return pendingRows(t, pool) == 0 })
	t.Logf("backlog drained %s after the broker came back", time.Since(back).Round(time.Millisecond))
	c := newCollector(t, k, topic)
	c.waitDistinct(t, total, time.Minute)
	c.poll(t, 500*time.Millisecond)
	dups := checkOrder(t, c.recs, want)
	var maxAttempts int
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(max(attempts), 0) FROM outbox`).Scan(&maxAttempts); err != nil {
		t.Fatal(err)
	}
	if maxAttempts != 0 {
		t.Errorf("an outage counted %d attempts against an event: a long outage would make events poison", maxAttempts)
	}
	var parked int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_parked`).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if parked != 0 {
		t.Errorf("an outage parked %d events: it is not their fault", parked)
	}
	if got := metricValue(t, r.metrics.publishErrors); got == 0 {
		t.Error("outbox_publish_errors_total stayed 0 through the outage")
	}
	t.Logf("%d events, 0 lost, 0 reordered, %d duplicates", total, dups)

	// Idle, the relay learns of an outage, and of its end, by asking the brokers.
	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the idle relay not ready while the broker is down", func() bool { return !r.Ready() })
	if err := k.StartAgain(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the idle relay ready again once the broker is back", r.Ready)
}
