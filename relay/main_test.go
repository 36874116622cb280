package relay

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/logtest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	kafkatest.StopShared()
	removeBinary()
	os.Exit(code)
}

var testTable = outboxdb.MustParseTable("public.outbox")

// newOutboxDB creates a database with the outbox schema and today's partitions, and returns its
// URL and a pool.
func newOutboxDB(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pgtest.OutboxSchema(ctx, url, testTable, 1); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newTopicDB is the start of most relay tests: a database with the outbox schema, the broker and
// a fresh topic of the given partitions.
func newTopicDB(t testing.TB, prefix string, partitions int32) (url string, pool *pgxpool.Pool, k *kafkatest.Cluster, topic string) {
	t.Helper()
	url = pgtest.NewDatabase(t)
	pool = newOutboxDB(t, url)
	k = kafkatest.Start(t, kafkatest.Apache)
	topic = kafkatest.UniqueTopic(prefix)
	k.CreateTopic(t, topic, partitions)
	return url, pool, k, topic
}

// dropInsertTrigger drops the insert trigger of url's test table (its relays then wake by polling)
// and reports whether it was there.
func dropInsertTrigger(t testing.TB, url string) bool {
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	changed, err := outboxdb.SetNotify(context.Background(), db, testTable, false, 5*time.Second)
	if err != nil {
		t.Fatalf("dropping the insert trigger: %v", err)
	}
	return changed
}

// testConfig is a relay configuration with fast backoffs, for tests.
func testConfig(url string, brokers []string, defaultTopic string) Config {
	c := DefaultConfig()
	c.DatabaseURL = url
	c.Kafka.Brokers = brokers
	c.DefaultTopic = defaultTopic
	c.HTTPAddr = ""
	// The relay's tests were written around notifications, with polling as the fallback; the
	// default, polling alone, has its own (poll_test.go), and the operator's tests run it.
	c.Notify, c.PollInterval = true, time.Second
	c.RetryBackoff = Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	c.OutageBackoff = Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	c.StatsInterval = 200 * time.Millisecond
	return c
}

func newTestLogger(t testing.TB, prefix string, level slog.Level) *slog.Logger {
	out := logtest.Writer(t, prefix)
	if os.Getenv("RELAY_TEST_QUIET") != "" {
		out = io.Discard
	}
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))
}

// running is a relay running in this process.
type running struct {
	*Relay
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startRelay(t testing.TB, cfg Config, name string) *running {
	t.Helper()
	r, err := New(cfg, WithLogger(newTestLogger(t, name+": ", slog.LevelWarn)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rr := &running{Relay: r, cancel: cancel, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(ctx) }()
	t.Cleanup(func() { rr.stop(t) })
	return rr
}

// stop cancels the relay (SIGTERM) and waits for Run to return.
func (rr *running) stop(t testing.TB) {
	rr.once.Do(func() {
		rr.cancel()
		select {
		case err := <-rr.done:
			if err != nil {
				t.Errorf("relay Run: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("relay did not stop within 60s")
		}
	})
}

// seqEvent is the payload of the events the tests write: its aggregate and its sequence number
// within the aggregate (1, 2, 3, ...).
type seqEvent = seqtest.Event

// appendSeq appends, in one transaction, one event per (aggregate, sequence) pair.
func appendSeq(ctx context.Context, pool *pgxpool.Pool, w *outbox.Writer, aggType string, evs []seqEvent) error {
	return seqtest.Append(ctx, pool, w, aggType, evs)
}

// withTracking returns cfg with the tracking mode set.
func withTracking(cfg Config, tr Tracking) Config {
	cfg.Tracking = tr
	return cfg
}

// trackings are the modes the guarantee tests run in.
var trackings = []Tracking{TrackRow, TrackSnapshot}

// forEachTracking runs test once per tracking mode, as a subtest named after it.
func forEachTracking(t *testing.T, test func(t *testing.T, tracking Tracking)) {
	for _, tr := range trackings {
		t.Run(string(tr), func(t *testing.T) { test(t, tr) })
	}
}

// pendingRows counts the events not yet published, in either tracking mode, with the table's
// own SQL function (outbox_pending: unsent rows, or rows no cursor has passed plus parked ones).
func pendingRows(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pool.QueryRow(ctx, `SELECT public.outbox_pending()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Logf("waited %s for %s", d.Round(time.Millisecond), what)
	}
}

// collector reads records from the broker with kafkatest's franz-go consumer until it holds
// the wanted number of distinct event ids.
type collector struct {
	c       *kafkatest.Consumer
	recs    []kafkatest.Record
	byEvent map[string]int
}

func newCollector(t testing.TB, k *kafkatest.Cluster, topics ...string) *collector {
	return &collector{c: k.NewConsumer(t, topics...), byEvent: map[string]int{}}
}

func (c *collector) poll(t testing.TB, wait time.Duration) {
	recs, err := c.c.Poll(context.Background(), wait)
	if err != nil {
		t.Logf("poll: %v", err)
	}
	for _, r := range recs {
		c.recs = append(c.recs, r)
		c.byEvent[r.Headers[HeaderEventID]]++
	}
}

// catchUp reads until the consumer has every record the broker holds in topic now.
func (c *collector) catchUp(t testing.TB, k *kafkatest.Cluster, topic string, timeout time.Duration) {
	t.Helper()
	end := k.EndOffsets(t, topic)
	deadline := time.Now().Add(timeout)
	for {
		next := map[int32]int64{}
		for _, r := range c.recs {
			if r.Topic == topic && r.Offset+1 > next[r.Partition] {
				next[r.Partition] = r.Offset + 1
			}
		}
		behind := false
		for p, o := range end {
			behind = behind || next[p] < o
		}
		if !behind {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the consumer did not reach the end of %s within %s: at %v, end %v", topic, timeout, next, end)
		}
		c.poll(t, 200*time.Millisecond)
	}
}

func (c *collector) waitDistinct(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	c.waitDistinctOr(t, n, timeout, func() {})
}

// waitDistinctOr is waitDistinct that calls explain before failing.
func (c *collector) waitDistinctOr(t testing.TB, n int, timeout time.Duration, explain func()) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for len(c.byEvent) < n {
		if time.Now().After(deadline) {
			// The failure first: explain may end the test itself.
			t.Errorf("read %d distinct events of %d within %s (%d records)", len(c.byEvent), n, timeout, len(c.recs))
			explain()
			t.FailNow()
		}
		c.poll(t, 500*time.Millisecond)
	}
	if d := timeout - time.Until(deadline); d > 5*time.Second {
		t.Logf("waited %s for %d distinct events", d.Round(time.Millisecond), n)
	}
}

// checkOrder checks the records as a consumer with an inbox sees them (seqtest.CheckOrder) and
// returns the number of duplicates.
func checkOrder(t testing.TB, recs []kafkatest.Record, wantPerAgg map[string]int) (dups int) {
	t.Helper()
	return seqtest.CheckOrder(t, recs, wantPerAgg, nil)
}

// checkOrderFrom is checkOrder for aggregates whose first events (up to after[agg]) went elsewhere.
func checkOrderFrom(t testing.TB, recs []kafkatest.Record, wantPerAgg, after map[string]int) (dups int) {
	t.Helper()
	return seqtest.CheckOrder(t, recs, wantPerAgg, after)
}

// metricValue reads a counter or gauge.
func metricValue(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

func newPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
