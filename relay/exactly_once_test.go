package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// exactlyOnceTopics creates an events topic of partitions and a compacted cursor topic.
func exactlyOnceTopics(t *testing.T, k *kafkatest.Cluster, prefix string, partitions int32) (events, cursors string) {
	t.Helper()
	events, cursors = kafkatest.UniqueTopic(prefix), kafkatest.UniqueTopic(prefix+".cursor")
	k.CreateTopic(t, events, partitions)
	compact := "compact"
	k.CreateTopicWithConfig(t, cursors, 1, map[string]*string{"cleanup.policy": &compact})
	return events, cursors
}

// exactlyOnceDeadLetters makes what the exactly-once tests with poison need: a database with the
// outbox, a broker with the events topic (partitions), its cursor topic and a dead-letter topic,
// the relay binary built, and the arguments of a relay publishing exactly-once that dead-letters
// poison (type "order" routed to the events topic, any other type poison).
func exactlyOnceDeadLetters(t *testing.T, prefix string, partitions int32) (url string, pool *pgxpool.Pool, k *kafkatest.Cluster, events, cursors, dlq string, args []string) {
	t.Helper()
	url = pgtest.NewDatabase(t)
	pool = newOutboxDB(t, url)
	k = kafkatest.Start(t, kafkatest.Apache)
	events, cursors = exactlyOnceTopics(t, k, prefix, partitions)
	dlq = kafkatest.UniqueTopic(prefix + ".dlq")
	k.CreateTopic(t, dlq, 1)
	relayBinary(t)
	args = []string{"--brokers", k.Brokers[0], "--topic-map", "order=" + events, "--batch-size", "200", "--tracking", "snapshot",
		"--delivery", "exactly-once", "--cursor-topic", cursors, "--poison-policy", "dead-letter", "--dead-letter-topic", dlq}
	return url, pool, k, events, cursors, dlq, args
}

// An exactly-once relay publishes every event once to an independent read_committed consumer,
// in order per aggregate, and its cursor record on the cursor topic is the database's cursor.
func TestExactlyOncePublishes(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	k := kafkatest.Start(t, kafkatest.Apache)
	events, cursors := exactlyOnceTopics(t, k, "relay.eos", 6)
	cfg := testConfig(url, k.Brokers, events)
	cfg.Tracking, cfg.Delivery, cfg.CursorTopic = TrackSnapshot, contract.DeliveryExactlyOnce, cursors
	want := map[string]int{}
	n := appendRange(t, url, 20, 1, 30, want)
	startRelay(t, cfg, "relay")
	c := &collector{c: k.NewCommittedConsumer(t, events), byEvent: map[string]int{}}
	c.waitDistinct(t, n, time.Minute)
	waitFor(t, time.Minute, "the backlog to drain", func() bool { return pendingRows(t, pool) == 0 })
	n += appendRange(t, url, 20, 31, 40, want)
	c.waitDistinct(t, n, time.Minute)
	c.poll(t, time.Second)
	if dups := checkOrder(t, c.recs, want); dups != 0 {
		t.Errorf("%d duplicates read committed", dups)
	}
	t.Logf("%d events, %d records read committed", n, len(c.recs))
}

// An exactly-once relay whose cursor topic does not exist is not ready and says what to do;
// once the topic exists it publishes every event once.
func TestExactlyOnceMissingCursorTopic(t *testing.T) {
	url := pgtest.NewDatabase(t)
	newOutboxDB(t, url)
	k := kafkatest.Start(t, kafkatest.Apache)
	events := kafkatest.UniqueTopic("relay.eosmissing")
	k.CreateTopic(t, events, 3)
	cursors := kafkatest.UniqueTopic("relay.eosmissing.cursor")
	cfg := testConfig(url, k.Brokers, events)
	cfg.Tracking, cfg.Delivery, cfg.CursorTopic = TrackSnapshot, contract.DeliveryExactlyOnce, cursors
	want := map[string]int{}
	n := appendRange(t, url, 5, 1, 10, want)
	r := startRelay(t, cfg, "relay")
	waitFor(t, time.Minute, "the relay to say the cursor topic is missing", func() bool {
		return strings.Contains(r.mode.refusal(), "the cursor topic "+cursors+" does not exist")
	})
	t.Logf("not ready: %s", r.mode.refusal())
	compact := "compact"
	k.CreateTopicWithConfig(t, cursors, 1, map[string]*string{"cleanup.policy": &compact})
	c := &collector{c: k.NewCommittedConsumer(t, events), byEvent: map[string]int{}}
	c.waitDistinct(t, n, time.Minute)
	c.poll(t, 500*time.Millisecond)
	if dups := checkOrder(t, c.recs, want); dups != 0 {
		t.Errorf("%d duplicates read committed", dups)
	}
	if why := r.mode.refusal(); why != "" {
		t.Errorf("still refused after publishing: %s", why)
	}
}

// TestExactlyOnceCrash kills an exactly-once relay binary with SIGKILL at random moments (the
// seed is logged; OUTBOX_TEST_SEED replays one), at least 20 times, while writers append
// concurrently, then lets a last relay drain the rest. An independent read_committed consumer
// must read every event exactly once, in order per aggregate. After each kill the broker says
// whether a transaction was left open (a partition's last stable offset below its end): the
// test requires such kills, the dangerous moment, and counts the aborted records a
// read_uncommitted consumer sees. Poison events, written throughout, go to the dead-letter topic
// in the transactions of their batches: each must be read there once and recorded in
// outbox_dead_lettered once, and the test requires a kill that left a committed record with
// dead letters the database had not recorded yet.
func TestExactlyOnceCrash(t *testing.T) {
	url, pool, k, events, cursors, dlq, args := exactlyOnceDeadLetters(t, "relay.eoscrash", 6)
	c := &collector{c: k.NewCommittedConsumer(t, events), byEvent: map[string]int{}}
	dead := &collector{c: k.NewCommittedConsumer(t, dlq), byEvent: map[string]int{}}
	load := startWriters(t, url, 2, 100, 10, 10*time.Millisecond)
	// Events of a type no topic is mapped to, every few ms: poison, dead-lettered in the
	// transactions of their batches, and recorded in outbox_dead_lettered after the commit.
	poison := startPoisonWriter(t, url, 20*time.Millisecond)
	minKills, maxKills := 20, 40
	if testing.Short() {
		minKills = 8
	}
	rnd := rand.New(rand.NewPCG(testSeed(t), 3))
	adm, closeAdm := admin(t, k)
	defer closeAdm()
	kills, open, ahead, deadAhead, published := 0, 0, 0, 0, 0
	for i := 0; i < minKills || (open == 0 || ahead == 0 || deadAhead == 0) && i < maxKills; i++ {
		kills++
		published += killAtRandom(t, url, args, rnd, i)
		if openTransaction(t, adm, events) {
			open++
		}
		if cursorAhead(t, k, cursors, pool) {
			ahead++
		}
		if deadLettersAhead(t, k, cursors, pool) {
			deadAhead++
		}
	}
	want := load.stop(t)
	poisoned := poison.stop(t)
	total := int(load.total.Load())
	t.Logf("%d SIGKILLs while %d events were written (and %d poison events); the killed relays had published %d; %d kills left a transaction open, "+
		"%d a committed cursor record ahead of the database's cursor, %d one with dead letters the database had not recorded", kills, total, poisoned, published, open, ahead, deadAhead)
	if published == 0 {
		t.Fatal("no relay published anything before it was killed: the test does not exercise crashes")
	}
	if open == 0 || ahead == 0 || deadAhead == 0 {
		t.Fatal("no kill landed inside an open transaction, or none between a commit and the database's copy (of a batch with dead letters): the test did not hit the dangerous moments")
	}
	last := startProc(t, url, args...)
	waitFor(t, 2*time.Minute, "the backlog to drain", func() bool { return pendingRows(t, pool) == 0 })
	c.waitDistinct(t, total, 2*time.Minute)
	if code := last.terminate(30 * time.Second); code != 0 {
		t.Errorf("relay exit code %d after SIGTERM", code)
	}
	c.poll(t, time.Second)
	dups := checkOrder(t, c.recs, want)
	uncommitted := readAll(t, k, events)
	t.Logf("%d events: %d records read committed, %d duplicates; %d records read uncommitted (%d aborted)",
		total, len(c.recs), dups, uncommitted, uncommitted-len(c.recs))
	if dups != 0 {
		t.Errorf("%d duplicates read committed, want 0", dups)
	}
	// Every poison event once on the dead-letter topic, and recorded as dead-lettered.
	dead.waitDistinct(t, poisoned, 2*time.Minute)
	dead.poll(t, time.Second)
	var recorded int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_dead_lettered`).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d poison events: %d records on the dead-letter topic read committed, %d recorded in outbox_dead_lettered", poisoned, len(dead.recs), recorded)
	if len(dead.recs) != poisoned || recorded != poisoned {
		t.Errorf("%d poison events, %d dead letters read committed, %d recorded dead-lettered: want each once", poisoned, len(dead.recs), recorded)
	}
}

// poisonWriter appends, every pause, one event of a type no topic is mapped to.
type poisonWriter struct {
	cancel context.CancelFunc
	done   chan struct{}
	n      int
	err    error
}

func startPoisonWriter(t *testing.T, url string, pause time.Duration) *poisonWriter {
	t.Helper()
	pool := newPool(t, url)
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &poisonWriter{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		seq := map[string]int{}
		for ctx.Err() == nil {
			a := fmt.Sprintf("poison-%d", p.n%10)
			seq[a]++
			if p.err = appendSeq(context.Background(), pool, w, "unrouted", []seqEvent{{Agg: a, Seq: seq[a]}}); p.err != nil {
				return
			}
			p.n++
			time.Sleep(pause)
		}
	}()
	return p
}

// stop stops the writer and returns how many events it wrote.
func (p *poisonWriter) stop(t *testing.T) int {
	t.Helper()
	p.cancel()
	<-p.done
	if p.err != nil {
		t.Fatal(p.err)
	}
	return p.n
}

// deadLettersAhead says whether the one shard's last committed cursor record carries dead
// letters that outbox_dead_lettered does not have: a kill between the commit of a batch that
// dead-lettered events and the database's copy.
func deadLettersAhead(t *testing.T, k *kafkatest.Cluster, cursors string, pool *pgxpool.Pool) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := committedRecord(t, k, cursors, oneShardID(t, pool))
	if rec == nil || len(rec.Dead) == 0 {
		return false
	}
	ids := make([]int64, len(rec.Dead))
	for i, d := range rec.Dead {
		ids[i] = d.ID
	}
	var recorded int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_dead_lettered WHERE id = ANY($1)`, ids).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	return recorded < len(ids)
}

func admin(t *testing.T, k *kafkatest.Cluster) (*kadm.Client, func()) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	return kadm.NewClient(cl), cl.Close
}

// openTransaction asks the broker whether a partition of topic has a transaction open: its last
// stable offset below its end.
func openTransaction(t *testing.T, adm *kadm.Client, topic string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	stable, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	open := false
	ends.Each(func(o kadm.ListedOffset) {
		if s, ok := stable.Lookup(o.Topic, o.Partition); ok && s.Offset < o.Offset {
			open = true
		}
	})
	return open
}

// cursorAhead says whether the one shard's last committed cursor record is ahead of the
// database's cursor row: a kill between a transaction's commit and the database's copy, which
// the next relay must follow.
func cursorAhead(t *testing.T, k *kafkatest.Cluster, cursors string, pool *pgxpool.Pool) bool {
	t.Helper()
	return shardAhead(t, k, cursors, pool, oneShardID(t, pool))
}

// oneShardID is the shard id of the current layout's one shard of public.outbox.
func oneShardID(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sys string
	var gen int64
	if err := pool.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sys); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(generation), 0) FROM outbox_relay_layout`).Scan(&gen); err != nil {
		t.Fatal(err)
	}
	return txnShardID(sys, "public.outbox", gen, 0, 1)
}

// TestExactlyOnceFrozenRelay: a relay frozen (SIGSTOP) with a transaction open, at a moment the
// broker confirms (a partition's last stable offset below its end), loses its lock connection
// after the lock lease; a second relay takes the shard, fences its transactional id (the broker
// aborts the frozen relay's transaction) and publishes. Resumed (SIGCONT), the first relay's
// transaction cannot commit (refused as fenced, or left to the abort) and it publishes nothing
// more. An independent read_committed consumer reads
// every event once. The freeze moments are random (the seed is logged).
func TestExactlyOnceFrozenRelay(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	k := kafkatest.Start(t, kafkatest.Apache)
	events, cursors := exactlyOnceTopics(t, k, "relay.eosfrozen", 6)
	relayBinary(t)
	c := &collector{c: k.NewCommittedConsumer(t, events), byEvent: map[string]int{}}
	load := startWriters(t, url, 2, 100, 10, 10*time.Millisecond)
	args := []string{"--brokers", k.Brokers[0], "--default-topic", events, "--batch-size", "200", "--tracking", "snapshot",
		"--delivery", "exactly-once", "--cursor-topic", cursors, "--lock-lease", "3s"}
	rnd := rand.New(rand.NewPCG(testSeed(t), 4))
	adm, closeAdm := admin(t, k)
	defer closeAdm()

	a := startProc(t, url, args...)
	waitFor(t, time.Minute, "the first relay to publish", func() bool { return a.metric("outbox_published_total") > 0 })
	frozen := false
	for try := 0; try < 200 && !frozen; try++ {
		time.Sleep(time.Duration(rnd.IntN(30)) * time.Millisecond)
		if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		if frozen = openTransaction(t, adm, events); !frozen {
			if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !frozen {
		t.Fatal("no freeze landed inside an open transaction in 200 tries: the test did not hit the dangerous moment")
	}
	b := startProc(t, url, args...)
	waitFor(t, time.Minute, "the second relay to take the shard and publish", func() bool { return b.metric("outbox_published_total") > 0 })
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The resumed relay's transaction cannot commit (the proof is the consumer's count below).
	// Resumed, it either meets the refusal first and says so, or first finds its lock connection
	// gone, once its batch's publication ended (carryOver waits for it): either line orders the
	// check after its attempt.
	waitFor(t, time.Minute, "the resumed relay to end its tenure", func() bool {
		l := a.log()
		return strings.Contains(l, "the shard's producer publishes no more") || strings.Contains(l, "lock_connection_lost=true")
	})
	want := load.stop(t)
	total := int(load.total.Load())
	waitFor(t, 2*time.Minute, "the backlog to drain", func() bool { return pendingRows(t, pool) == 0 })
	c.waitDistinct(t, total, 2*time.Minute)
	c.poll(t, time.Second)
	dups := checkOrder(t, c.recs, want)
	t.Logf("%d events, %d records read committed, %d duplicates; the resumed relay: %s", total, len(c.recs), dups,
		lastLine(a.log(), "publishes no more", "lock_connection_lost=true"))
	if dups != 0 {
		t.Errorf("%d duplicates read committed, want 0", dups)
	}
}

// lastLine returns the last line of log that holds one of words.
func lastLine(log string, words ...string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		for _, w := range words {
			if strings.Contains(lines[i], w) {
				return lines[i]
			}
		}
	}
	return ""
}
