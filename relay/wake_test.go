package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// notifyCounter is an independent observer of the table's channel: it counts what PostgreSQL
// delivers to a LISTEN of its own.
type notifyCounter struct {
	n    atomic.Int64
	stop context.CancelFunc
	done chan struct{}
}

func countNotifications(t testing.TB, url string) *notifyCounter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{testTable.Channel()}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	nc := &notifyCounter{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(nc.done)
		defer conn.Close(context.Background())
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			if n.Payload == "" {
				nc.n.Add(1)
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-nc.done })
	return nc
}

// claimActive reads, as a writer's trigger does, whether a relay claims a wait now.
func claimActive(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (bool, error) {
	var on bool
	err := q.QueryRow(ctx, `SELECT last_value > date_part('epoch', clock_timestamp()) * 1000 FROM `+testTable.Derived("wake_until")).Scan(&on)
	return on, err
}

// A writer that inserted while no relay claimed a wait (so it will not notify) and commits only
// after the relay claimed, fetched and went idle: the relay publishes it within milliseconds,
// not after its poll interval (a minute here), and no notification was involved.
func TestWakeWriterInFlightAtClaim(t *testing.T) { forEachTracking(t, testWakeWriterInFlightAtClaim) }

func testWakeWriterInFlightAtClaim(t *testing.T, tracking Tracking) {
	url, pool, k, topic := newTopicDB(t, "relay.wake", 3)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, outboxdb.WakeStatements(testTable).Woke); err != nil { // no claim: writers do not notify
		t.Fatal(err)
	}
	notes := countNotifications(t, url)
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := w.Append(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "a-1", EventType: "Late",
		Payload: []byte(`{}`), EventID: newUUID()}); err != nil {
		t.Fatal(err)
	}

	cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	cfg.PollInterval = time.Minute
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "the relay to claim a wait", func() bool { return metricValue(t, r.metrics.claims) >= 1 })
	if on, err := claimActive(ctx, pool); err != nil || !on {
		t.Fatalf("the database shows no claim after the relay claimed: %v %v", on, err)
	}
	committed := time.Now()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	c := newCollector(t, k, topic)
	c.waitDistinct(t, 1, 10*time.Second)
	t.Logf("published %s after its commit (poll interval %s); notifications seen: %d", time.Since(committed).Round(time.Millisecond), cfg.PollInterval, notes.n.Load())
	if n := notes.n.Load(); n != 0 {
		t.Errorf("%d notifications: the writer read no claim, so none should have been sent", n)
	}
}

// Many writers race the relay's claim: each inserts, waits a random few milliseconds and
// commits, in bursts separated by quiet gaps that let the relay go idle. With a poll interval of
// a minute, every burst must reach Kafka (an independent consumer) within seconds. Reports how
// many writers inserted while no claim lived and committed while one did: the race the claim's
// watch closes.
func TestWakeRaceBursts(t *testing.T) { forEachTracking(t, testWakeRaceBursts) }

func testWakeRaceBursts(t *testing.T, tracking Tracking) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	url, pool, k, topic := newTopicDB(t, "relay.wakerace", 3)
	cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	cfg.PollInterval = time.Minute
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "relay ready", r.Ready)
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	c := newCollector(t, k, topic)
	const (
		minBursts, maxBursts = 30, 600
		wantInWindow         = 3
		writers              = 8
	)
	var inWindow, total atomic.Int64
	ctx := context.Background()
	worst := time.Duration(0)
	bursts := 0
	for b := 0; b < maxBursts && (b < minBursts || inWindow.Load() < wantInWindow); b++ {
		bursts++
		delays := make([]time.Duration, writers)
		for i := range delays {
			delays[i] = time.Duration(rng.IntN(15_000)) * time.Microsecond
		}
		gap := time.Duration(20+rng.IntN(80)) * time.Millisecond
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for i := range writers {
			wg.Go(func() {
				errs <- raceWriter(ctx, pool, w, fmt.Sprintf("agg-%d-%d", b, i), delays[i], &inWindow)
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		total.Add(writers)
		start := time.Now()
		c.waitDistinct(t, int(total.Load()), 10*time.Second)
		worst = max(worst, time.Since(start))
		time.Sleep(gap) // quiet: the relay claims and waits
	}
	dups := len(c.recs) - len(c.byEvent)
	t.Logf("%d bursts of %d writers: all %d events published; %d writers inserted with no claim and committed under one; slowest burst %s after its last commit; %d duplicates; %.0f claims",
		bursts, writers, total.Load(), inWindow.Load(), worst.Round(time.Millisecond), dups, metricValue(t, r.metrics.claims))
	if dups != 0 {
		t.Errorf("%d duplicates in normal operation", dups)
	}
	if inWindow.Load() == 0 {
		t.Errorf("no writer hit the window between a claim and its fetch in %d bursts: the test did not exercise the race", bursts)
	}
}

// raceWriter appends one event, waits d, and commits; it counts itself in inWindow when no claim
// lived right after its insert and one lived right before its commit.
func raceWriter(ctx context.Context, pool *pgxpool.Pool, w *outbox.Writer, agg string, d time.Duration, inWindow *atomic.Int64) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := w.Append(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: agg, EventType: "Race",
			Payload: []byte(`{}`), EventID: newUUID()}); err != nil {
			return err
		}
		before, err := claimActive(ctx, tx)
		if err != nil {
			return err
		}
		time.Sleep(d)
		after, err := claimActive(ctx, tx)
		if err != nil {
			return err
		}
		if !before && after {
			inWindow.Add(1)
		}
		return nil
	})
}

// While the relay drains a backlog it never waits, so writers committing meanwhile send no
// notification at all (counted by an independent listener).
func TestNoNotificationsWhileDraining(t *testing.T) {
	forEachTracking(t, testNoNotificationsWhileDraining)
}

func testNoNotificationsWhileDraining(t *testing.T, tracking Tracking) {
	url, pool, k, topic := newTopicDB(t, "relay.wakedrain", 6)
	const backlog = 60_000
	insertBacklog(t, url, backlog, 5_000, "order")
	cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "the relay to publish", func() bool { return metricValue(t, r.metrics.published) > 0 })
	notes := countNotifications(t, url)
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	txs := 0
	// Paced by the relay's own counter (cheap to read); the evidence is the independent listener.
	for metricValue(t, r.metrics.published) < backlog*3/4 {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.Append(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("w-%d", txs%50),
				EventType: "During", Payload: []byte(`{}`), EventID: newUUID()})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		txs++
	}
	seen := notes.n.Load()
	waitFor(t, 2*time.Minute, "the backlog to drain", func() bool { return pendingRows(t, pool) == 0 })
	t.Logf("%d transactions committed while the relay drained: %d notifications; %.0f claims", txs, seen, metricValue(t, r.metrics.claims))
	if txs < 50 {
		t.Fatalf("only %d transactions during the drain: the test did not load the relay", txs)
	}
	if seen != 0 {
		t.Errorf("%d notifications from %d transactions while the relay was busy, want 0", seen, txs)
	}
}

// A relay that stops publishing ends its claim at once: writers stop notifying (read from the
// database, as a writer's trigger reads it), rather than when the claim would expire.
func TestWakeClaimEndsWhenTheRelayStops(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.wakestop", 1)
	cfg := testConfig(url, k.Brokers, topic)
	cfg.PollInterval = time.Minute // a claim would otherwise live for two minutes
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "the relay to claim a wait", func() bool { return metricValue(t, r.metrics.claims) >= 1 })
	ctx := context.Background()
	if on, err := claimActive(ctx, pool); err != nil || !on {
		t.Fatalf("no claim while the relay waits: %v %v", on, err)
	}
	r.stop(t)
	if on, err := claimActive(ctx, pool); err != nil || on {
		t.Fatalf("a claim lives after the relay stopped: %v %v", on, err)
	}
}
