package relay

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// appendRange appends events from..to (inclusive) of n aggregates, one transaction per
// sequence number, and records the last sequence number in want.
func appendRange(t testing.TB, url string, n, from, to int, want map[string]int) int {
	t.Helper()
	pool := newPool(t, url)
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for s := from; s <= to; s++ {
		evs := make([]seqEvent, n)
		for a := range n {
			evs[a] = seqEvent{Agg: fmt.Sprintf("agg-%02d", a), Seq: s}
			want[evs[a].Agg] = s
		}
		if err := appendSeq(context.Background(), pool, w, "order", evs); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	return total
}

// TestFencing runs two relay processes for the same shard: only the first holds the shard's
// presence lock and its bucket locks and publishes, the second is not ready and publishes
// nothing while it waits on the presence lock in PostgreSQL. Killed, the first hands over to the second, and everything arrives in order.
func TestFencing(t *testing.T) { forEachTracking(t, testFencing) }

func testFencing(t *testing.T, tracking Tracking) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.fencing")
	k.CreateTopic(t, topic, 6)
	c := newCollector(t, k, topic)
	args := []string{"--brokers", k.Brokers[0], "--default-topic", topic, "--poll-interval", "500ms", "--tracking", string(tracking)}

	a := startProc(t, url, args...)
	waitFor(t, 30*time.Second, "relay A ready", func() bool { return a.status("/readyz") == 200 })
	b := startProc(t, url, args...)
	waitFor(t, 30*time.Second, "relay B running", func() bool { return b.status("/healthz") == 200 })
	waitFor(t, 10*time.Second, "relay B waiting on a bucket lock", func() bool {
		var waiting int
		err := pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = $1::int4::oid`,
			testTable.LockKey()).Scan(&waiting)
		return err == nil && waiting == 1
	})

	if log := b.log(); !strings.Contains(log, "waiting for another relay of this shard index to stop") ||
		strings.Contains(log, "holder_pid=0") {
		t.Errorf("relay B does not say that it waits for the other relay of its shard, and who that is:\n%s", b.logTail(2000))
	}

	want := map[string]int{}
	total := appendRange(t, url, 20, 1, 25, want)
	c.waitDistinct(t, total, time.Minute)
	waitFor(t, 10*time.Second, "rows marked sent", func() bool { return pendingRows(t, pool) == 0 })
	if got := a.metric("outbox_published_total"); got != float64(total) {
		t.Errorf("relay A published %v, want %d", got, total)
	}
	if got := b.metric("outbox_published_total"); got != 0 {
		t.Errorf("relay B published %v while A held the locks", got)
	}
	if got := b.status("/readyz"); got != 503 {
		t.Errorf("relay B /readyz = %d while A holds the locks, want 503", got)
	}
	if got := b.metric("outbox_shard_ready"); got != 0 {
		t.Errorf("relay B outbox_shard_ready = %v", got)
	}

	a.kill()
	start := time.Now()
	waitFor(t, 30*time.Second, "relay B to take over", func() bool { return b.status("/readyz") == 200 })
	t.Logf("relay B took over %s after A was killed", time.Since(start).Round(time.Millisecond))
	total += appendRange(t, url, 20, 26, 50, want)
	c.waitDistinct(t, total, time.Minute)
	waitFor(t, 10*time.Second, "rows marked sent", func() bool { return pendingRows(t, pool) == 0 })
	if dups := checkOrder(t, c.recs, want); dups != 0 {
		t.Errorf("%d duplicates: A was idle when killed", dups)
	}
	if got := b.metric("outbox_published_total"); got != float64(total/2) {
		t.Errorf("relay B published %v, want %d", got, total/2)
	}
	if code := b.terminate(30 * time.Second); code != 0 {
		t.Errorf("relay B exit code %d after SIGTERM", code)
	}
}

// TestReshardFencing: a relay of another shard count whose buckets overlap waits until the
// relay of the old layout is gone, so two layouts never publish at once.
func TestReshardFencing(t *testing.T) { forEachTracking(t, testReshardFencing) }

func testReshardFencing(t *testing.T, tracking Tracking) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.reshard")
	k.CreateTopic(t, topic, 6)
	c := newCollector(t, k, topic)

	old := startRelay(t, withTracking(testConfig(url, k.Brokers, topic), tracking), "old 0/1")
	waitFor(t, 30*time.Second, "old layout ready", old.Ready)
	newCfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	newCfg.ShardCount, newCfg.ShardIndex = 4, 2
	next := startRelay(t, newCfg, "new 2/4")

	want := map[string]int{}
	total := appendRange(t, url, 40, 1, 5, want)
	c.waitDistinct(t, total, time.Minute)
	if next.Ready() {
		t.Fatal("the new layout's relay is ready while the old layout's relay holds its buckets")
	}
	if got := metricValue(t, next.metrics.published); got != 0 {
		t.Fatalf("the new layout's relay published %v events while the old layout ran", got)
	}
	old.stop(t) // a rolling update: the old relay releases its locks on SIGTERM
	waitFor(t, 30*time.Second, "new layout ready", next.Ready)

	var mine int
	if err := pool.QueryRow(context.Background(), `SELECT count(DISTINCT aggregate_id) FROM outbox WHERE `+outboxdb.BucketExpr+` % 4 = 2`).Scan(&mine); err != nil {
		t.Fatal(err)
	}
	if mine == 0 {
		t.Fatal("no aggregate in shard 2 of 4: the test does not exercise the new layout")
	}
	appendRange(t, url, 40, 6, 10, want)
	waitFor(t, 30*time.Second, "shard 2's events to be published", func() bool {
		var left int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE NOT public.outbox_published(id) AND `+outboxdb.BucketExpr+` % 4 = 2`).Scan(&left)
		return left == 0
	})
	var others int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE NOT public.outbox_published(id) AND `+outboxdb.BucketExpr+` % 4 <> 2`).Scan(&others); err != nil {
		t.Fatal(err)
	}
	if others == 0 {
		t.Error("events of other shards were published: shard 2 of 4 went beyond its buckets")
	}
}
