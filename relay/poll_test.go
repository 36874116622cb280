package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outbox"
)

// Wake-ups by polling (migration 00010): the table has no insert trigger and the relay polls
// every 20 ms without listening. Two cases, each checked by an independent consumer:
//
//   - A writer draws its event's id and stays open while the relay polls: the relay opens a
//     batch (snapshot tracking) or fetches (row tracking) once (the id sequence moved), finds
//     nothing committed, and then polls with the quiet check only while the writer is open (under
//     snapshot tracking no batch, no snapshot, no transaction id; under row tracking one small
//     statement instead of the fetch). The writer then commits, which moves nothing the relay
//     could see but the end of its transaction: the event must still arrive within the bound.
//   - Sporadic single-event transactions at random gaps (seed logged): each arrives within the
//     bound of its commit.
//
// The bound is 2 s, a hundred poll intervals (a relay that slept through an event would wait
// for another writer or, with the default interval, 10 s).
func TestWakeByPolling(t *testing.T) { forEachTracking(t, testWakeByPolling) }

func testWakeByPolling(t *testing.T, tracking Tracking) {
	url, pool, k, topic := newTopicDB(t, "relay.poll", 3)
	ctx := context.Background()
	if !dropInsertTrigger(t, url) {
		t.Fatal("the table had no insert trigger to drop")
	}
	notes := countNotifications(t, url)
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	cfg.Notify, cfg.PollInterval = false, 20*time.Millisecond
	cfg.IdlePollInterval = 0 // this test counts quiet polls at the poll interval; TestIdleBackoff backs off
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "the relay to publish", r.Ready)
	c := newCollector(t, k, topic)
	const bound = 2 * time.Second

	// The writer open across polls.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := w.Append(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "open", EventType: "Late",
		Payload: []byte(`{}`), EventID: newUUID()}); err != nil {
		t.Fatal(err)
	}
	quietBefore := metricValue(t, r.metrics.quietPolls)
	time.Sleep(300 * time.Millisecond) // 15 poll intervals with the writer open, by design
	quietWhileOpen := metricValue(t, r.metrics.quietPolls) - quietBefore
	if quietWhileOpen < 3 {
		t.Fatalf("%.0f quiet polls while the writer was open: the relay fetched on (nearly) every poll", quietWhileOpen)
	}
	committed := time.Now()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitDistinct(t, 1, bound)
	late := time.Since(committed)

	// Sporadic writers.
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)
	const n = 60
	var worst time.Duration
	for i := range n {
		time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond)
		if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: fmt.Sprintf("a-%d", i%7), Seq: i}}); err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		for len(c.byEvent) < 2+i && time.Since(at) < bound {
			c.poll(t, 100*time.Millisecond)
		}
		if len(c.byEvent) < 2+i {
			var id int64
			var published *bool
			var seq int64
			var cursor string
			_ = pool.QueryRow(ctx, `SELECT id, outbox_published(id) FROM outbox ORDER BY id DESC LIMIT 1`).Scan(&id, &published)
			_ = pool.QueryRow(ctx, `SELECT pg_sequence_last_value('outbox_id_seq')`).Scan(&seq)
			_ = pool.QueryRow(ctx, `SELECT string_agg(format('%s floor %s next %s last %s', snap, snap_floor, next_snap, last_id), '; ') FROM outbox_relay_cursor`).Scan(&cursor)
			t.Fatalf("event %d (id %d, seq %d) not at the consumer %s after its commit: published per the database %v; quiet polls %.0f, published %.0f; cursor %s",
				i, id, seq, bound, published, metricValue(t, r.metrics.quietPolls), metricValue(t, r.metrics.published), cursor)
		}
		worst = max(worst, time.Since(at))
	}
	if n := notes.n.Load(); n != 0 {
		t.Errorf("%d notifications from a table without its insert trigger", n)
	}
	t.Logf("%s: the writer open across polls published %s after its commit (%.0f quiet polls while it was open); %d sporadic events, the slowest %s after its commit; %.0f quiet polls in all",
		tracking, late.Round(time.Millisecond), quietWhileOpen, n, worst.Round(time.Millisecond), metricValue(t, r.metrics.quietPolls))
}

// An idle relay that polls backs off (contract.IdlePollInterval): after an idle spell of T it
// waits T/16 between polls, up to --idle-poll-interval (250 ms here, reached after 4 s), and the
// first fetch that finds events brings it back to its poll interval (10 ms). The observer is
// PostgreSQL: the start of each statement of the relay's lock connection (pg_stat_activity's
// query_start of the session holding the shard's advisory locks, sampled every 2 ms), not the
// relay's metrics. The event committed after the idle spell must reach an independent consumer.
func TestIdleBackoff(t *testing.T) { forEachTracking(t, testIdleBackoff) }

func testIdleBackoff(t *testing.T, tracking Tracking) {
	url, pool, k, topic := newTopicDB(t, "relay.idle", 3)
	ctx := context.Background()
	dropInsertTrigger(t, url)
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	const ceiling = 250 * time.Millisecond
	cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	cfg.Notify, cfg.PollInterval, cfg.IdlePollInterval = false, 10*time.Millisecond, ceiling
	cfg.StatsInterval = time.Hour // only the lock connection's statements: none of the stats connection's
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "the relay to publish", r.Ready)
	c := newCollector(t, k, topic)

	var pid int
	waitFor(t, 10*time.Second, "the session holding the shard's advisory locks", func() bool {
		return pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1`).Scan(&pid) == nil
	})
	polls := watchStatements(t, url, pid)

	if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: "a", Seq: 0}}); err != nil {
		t.Fatal(err)
	}
	c.waitDistinct(t, 1, 10*time.Second)
	spell := time.Now() // the relay's idle spell begins about now (its first empty fetch)

	// Idle until the spell passes 16 times the ceiling and then some: the relay polls at the
	// ceiling. Before that, the waits grow.
	waitFor(t, time.Minute, "an idle spell of 6 s", func() bool { return time.Since(spell) > 6*time.Second })
	idle := polls.since(spell)
	var late []time.Duration // gaps of the last 2 s, at the ceiling
	for i := 1; i < len(idle); i++ {
		if idle[i].Sub(spell) > 4*time.Second+ceiling {
			late = append(late, idle[i].Sub(idle[i-1]))
		}
	}
	if len(late) < 3 {
		t.Fatalf("%d polls in the last 2 s of a 6 s idle spell (%d in all): the relay stopped polling", len(late), len(idle))
	}
	// The median gap, not each: on a loaded machine a poll (or the sampler) may come late.
	sorted := slices.Clone(late)
	slices.Sort(sorted)
	if g := sorted[len(sorted)/2]; g < ceiling-ceiling/5 || g > ceiling+ceiling/2 {
		t.Errorf("a median gap of %s between polls late in the idle spell, want about %s: %s", g.Round(time.Millisecond), ceiling, gaps(idle))
	}
	// 16 at 10 ms, then about 16 ln(4 s / 160 ms) = 51 up to the ceiling, 8 at it: about 75,
	// against 600 at 10 ms without backoff.
	if len(idle) > 150 {
		t.Errorf("%d polls in 6 idle seconds: no backoff (%s)", len(idle), gaps(idle))
	}

	// The first event after the spell arrives within the ceiling (and the consumer's fetch), and
	// the relay polls fast again.
	if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: "a", Seq: 1}}); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	c.waitDistinct(t, 2, ceiling+5*time.Second)
	latency := time.Since(committed)
	waitFor(t, 10*time.Second, "300 ms after the event", func() bool { return time.Since(committed) > ceiling+300*time.Millisecond })
	// Past the wait the event ended: about 28 polls at 10 ms; a relay still backed off would poll
	// once or twice.
	after := polls.since(committed.Add(ceiling + 20*time.Millisecond))
	if len(after) < 5 {
		t.Fatalf("%d statements in the 280 ms after the event's fetch: the relay did not come back to its poll interval (%s)", len(after), gaps(after))
	}
	t.Logf("%s: %d polls in 6 idle seconds, the last ones %s apart (ceiling %s); the event after the spell at the consumer %s after its commit; then %d polls in 280 ms",
		tracking, len(idle), gaps(idle[len(idle)-len(late)-1:]), ceiling, latency.Round(time.Millisecond), len(after))
}

// statementStarts is what watchStatements saw: the start of each statement of one session
// (query_start in pg_stat_activity), on the server's clock, those less than 3 ms apart (one
// round trip's statements) counted once.
type statementStarts struct {
	mu     sync.Mutex
	starts []time.Time
}

// since returns the starts at or after from.
func (s *statementStarts) since(from time.Time) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, _ := slices.BinarySearchFunc(s.starts, from, func(a, b time.Time) int { return a.Compare(b) })
	return slices.Clone(s.starts[i:])
}

// watchStatements samples pid's query_start every 2 ms until the test ends. The server and the
// test share the machine's clock.
func watchStatements(t *testing.T, url string, pid int) *statementStarts {
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	s := &statementStarts{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var last time.Time
		for ctx.Err() == nil {
			var start time.Time
			if err := conn.QueryRow(ctx, `SELECT query_start FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&start); err == nil &&
				!start.Equal(last) {
				s.mu.Lock()
				if n := len(s.starts); n == 0 || start.Sub(s.starts[n-1]) >= 3*time.Millisecond {
					s.starts = append(s.starts, start)
				}
				s.mu.Unlock()
				last = start
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close(context.Background())
	})
	return s
}

// gaps renders the gaps between starts, for a failure message.
func gaps(starts []time.Time) string {
	var b strings.Builder
	for i := 1; i < len(starts); i++ {
		fmt.Fprintf(&b, "%s ", starts[i].Sub(starts[i-1]).Round(time.Millisecond))
	}
	return strings.TrimSpace(b.String())
}
