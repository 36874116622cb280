package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// writerLoad appends events continuously from several goroutines until stop is called. Each
// goroutine owns a disjoint set of aggregates and numbers their events 1, 2, 3, ...
type writerLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	want   map[string]int
	total  atomic.Int64
	err    error
}

func startWriters(t testing.TB, url string, writers, aggsPerWriter, perTx int, pause time.Duration) *writerLoad {
	t.Helper()
	pool := newPool(t, url)
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &writerLoad{cancel: cancel, want: map[string]int{}}
	for wr := range writers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(wr), 99))
			seq := map[string]int{}
			for ctx.Err() == nil {
				evs := make([]seqEvent, 0, perTx)
				next := map[string]int{}
				for range perTx {
					a := fmt.Sprintf("w%d-agg-%03d", wr, rnd.IntN(aggsPerWriter))
					if _, ok := next[a]; !ok {
						next[a] = seq[a]
					}
					next[a]++
					evs = append(evs, seqEvent{Agg: a, Seq: next[a]})
				}
				if err := appendSeq(context.Background(), pool, w, "order", evs); err != nil {
					l.mu.Lock()
					l.err = err
					l.mu.Unlock()
					return
				}
				for a, n := range next {
					seq[a] = n
				}
				l.total.Add(int64(len(evs)))
				l.mu.Lock()
				for a, n := range next {
					l.want[a] = n
				}
				l.mu.Unlock()
				if pause > 0 {
					time.Sleep(pause)
				}
			}
		}()
	}
	return l
}

// stop stops the writers and returns the last sequence number of each aggregate.
func (l *writerLoad) stop(t testing.TB) map[string]int {
	t.Helper()
	l.cancel()
	l.wg.Wait()
	if l.err != nil {
		t.Fatalf("writer: %v", l.err)
	}
	return l.want
}

// TestCrash kills the relay binary with SIGKILL at random moments (the seed is logged;
// OUTBOX_TEST_SEED replays one), at least 20 times, while writers append concurrently, then lets
// a last relay drain the rest: nothing may be lost and, after dropping duplicates by event_id,
// each aggregate's events must arrive in order. After each kill an independent consumer reads
// the topic to its end and the database says which of those events are recorded as published:
// a kill that left events in Kafka but not recorded landed between the broker's acknowledgement
// and the mark (row tracking) or the cursor write (snapshot tracking), the dangerous moment. The
// test requires such kills, and a duplicate on the topic for every event they left unrecorded.
func TestCrash(t *testing.T) { forEachTracking(t, testCrash) }

func testCrash(t *testing.T, tracking Tracking) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.crash")
	k.CreateTopic(t, topic, 6)
	relayBinary(t) // build before the clock starts
	c := newCollector(t, k, topic)

	load := startWriters(t, url, 2, 100, 10, 10*time.Millisecond)
	args := []string{"--brokers", k.Brokers[0], "--default-topic", topic, "--batch-size", "200", "--tracking", string(tracking)}
	// At least 22 kills; more, up to 44, until one landed between acknowledgement and record
	// (each does with a probability of about a fifth). With -short (the version matrix in make
	// test) at least 8: the dangerous moment is still required.
	minKills, maxKills := 22, 44
	if testing.Short() {
		minKills = 8
	}
	kills := 0
	rnd := rand.New(rand.NewPCG(testSeed(t), 2))
	start := time.Now()
	publishedAtKill := 0
	recorded := map[string]bool{}   // events the database records as published
	unrecorded := map[string]bool{} // events in Kafka but not recorded at a kill
	inWindow := 0
	for i := 0; i < minKills || inWindow == 0 && i < maxKills; i++ {
		kills++
		publishedAtKill += killAtRandom(t, url, args, rnd, i)
		if n := unrecordedAtKill(t, pool, c, k, topic, recorded, unrecorded); n > 0 {
			inWindow++
		}
	}
	want := load.stop(t)
	total := int(load.total.Load())
	t.Logf("%d SIGKILLs in %s while %d events were written; the killed relays had published %d",
		kills, time.Since(start).Round(time.Millisecond), total, publishedAtKill)
	if publishedAtKill == 0 {
		t.Fatal("no relay published anything before it was killed: the test does not exercise crashes")
	}
	if inWindow == 0 {
		t.Fatalf("no kill landed between the broker's acknowledgement and the %s: the test did not hit the dangerous moment", recordName(tracking))
	}

	last := startProc(t, url, args...)
	waitFor(t, 2*time.Minute, "the backlog to drain", func() bool { return pendingRows(t, pool) == 0 })
	if code := last.terminate(30 * time.Second); code != 0 {
		t.Errorf("relay exit code %d after SIGTERM", code)
	}
	c.waitDistinct(t, total, 2*time.Minute)
	c.poll(t, time.Second)
	dups := checkOrder(t, c.recs, want)
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != total || len(c.byEvent) != total {
		t.Errorf("%d rows, %d distinct events on the topic, %d written", rows, len(c.byEvent), total)
	}
	t.Logf("0 lost, 0 reordered: %d events, %d records, %d duplicates (%.2f%%); %d of %d kills landed between the broker's "+
		"acknowledgement and the %s, leaving %d events in Kafka unrecorded",
		total, len(c.recs), dups, 100*float64(dups)/float64(total), inWindow, kills, recordName(tracking), len(unrecorded))
	if dups < len(unrecorded) {
		t.Errorf("%d events were in Kafka but not recorded at a kill, yet only %d duplicates arrived: they were recorded without being published again", len(unrecorded), dups)
	}
}

func recordName(tr Tracking) string {
	if tr == TrackSnapshot {
		return "cursor write"
	}
	return "mark"
}

// unrecordedAtKill reads the topic to its end (the killed relay publishes nothing more) and
// asks the database which of the events on it are recorded as published: it returns how many
// are not, adding them to unrecorded and the others to recorded.
func unrecordedAtKill(t *testing.T, pool *pgxpool.Pool, c *collector, k *kafkatest.Cluster, topic string, recorded, unrecorded map[string]bool) int {
	t.Helper()
	// The killed relay's statements may still commit on the server (a round trip it sent just
	// before it died, its cursor write or marks among them): wait until its sessions are gone.
	waitFor(t, 30*time.Second, "the killed relay's sessions to end", func() bool {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE $1`, "outbox-relay %").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	c.catchUp(t, k, topic, 30*time.Second)
	var candidates []string
	for id := range c.byEvent {
		if !recorded[id] {
			candidates = append(candidates, id)
		}
	}
	rows, err := pool.Query(context.Background(), `SELECT event_id::text, coalesce(outbox_published(id), false) FROM outbox WHERE event_id = ANY($1::uuid[])`, candidates)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id string
		var published bool
		if err := rows.Scan(&id, &published); err != nil {
			t.Fatal(err)
		}
		if published {
			recorded[id] = true
		} else {
			unrecorded[id] = true
			n++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// killAtRandom starts a relay binary with args and kills it with SIGKILL at a random moment:
// sometimes before it is ready, mostly while it publishes. It returns what the relay had
// published by its own count.
func killAtRandom(t *testing.T, url string, args []string, rnd *rand.Rand, i int) int {
	t.Helper()
	p := startProc(t, url, args...)
	if rnd.IntN(5) > 0 {
		deadline := time.Now().Add(15 * time.Second)
		for p.status("/readyz") != 200 && time.Now().Before(deadline) && !p.exited() {
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(time.Duration(50+rnd.IntN(1000)) * time.Millisecond)
	published := max(int(p.metric("outbox_published_total")), 0)
	if p.exited() {
		t.Fatalf("relay %d exited by itself:\n%s", i, p.logTail(3000))
	}
	p.kill()
	return published
}
