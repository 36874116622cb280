package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestGracefulShutdown sends SIGTERM to the relay binary in the middle of a backlog: it must
// exit 0 having marked every event the broker acknowledged (so the next relay publishes no
// duplicate) and released its locks. It also checks outbox_pending and outbox_lag_seconds
// while the backlog is there.
func TestGracefulShutdown(t *testing.T) { forEachTracking(t, testGracefulShutdown) }

func testGracefulShutdown(t *testing.T, tracking Tracking) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.sigterm")
	k.CreateTopic(t, topic, 6)
	// A snapshot relay fetches SnapshotFetchFactor batches a round trip: it once drained 20,000
	// events in 0.23 s, before the test had seen its first backlog measurement.
	n := 20_000
	if tracking == TrackSnapshot {
		n = 100_000
	}
	insertBacklog(t, url, n, 1000, "order")
	time.Sleep(1100 * time.Millisecond) // let the backlog age a little

	args := []string{"--brokers", k.Brokers[0], "--default-topic", topic, "--batch-size", "25", "--tracking", string(tracking)}
	p := startProc(t, url, args...)
	waitFor(t, 30*time.Second, "publishing", func() bool { return p.metric("outbox_published_total") >= 1000 })
	// The relay measures its backlog as its tenure starts, and every 5 s.
	pendingMetric := `outbox_pending{shard="0",table="public.outbox"}`
	waitFor(t, 10*time.Second, "the first backlog measurement", func() bool { return p.metric(pendingMetric) > 0 })
	pending, lag := p.metric(pendingMetric), p.metric(`outbox_lag_seconds{shard="0",table="public.outbox"}`)
	if pending < float64(n)/2 || pending > float64(n) {
		t.Errorf("outbox_pending = %v at the start of a %d backlog", pending, n)
	}
	if lag < 1 {
		t.Errorf("outbox_lag_seconds = %v with a backlog older than 1 s", lag)
	}
	if code := p.terminate(30 * time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	if log := p.log(); !strings.Contains(log, "released the shard's bucket locks") {
		t.Errorf("no lock release in the log:\n%s", p.logTail(2000))
	}
	var sent int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE public.outbox_published(id)`).Scan(&sent); err != nil {
		t.Fatal(err)
	}
	if sent == 0 || sent == n {
		t.Fatalf("%d of %d sent at SIGTERM: the test did not stop the relay mid-backlog", sent, n)
	}
	c := newCollector(t, k, topic)
	c.waitDistinct(t, sent, time.Minute)
	c.poll(t, 2*time.Second)
	if len(c.recs) != sent {
		t.Errorf("%d records on the topic, %d rows marked sent: the relay left acknowledged events unmarked", len(c.recs), sent)
	}
	t.Logf("SIGTERM after %d of %d events: every acknowledged event marked", sent, n)

	next := startProc(t, url, args...)
	waitFor(t, 2*time.Minute, "the rest to drain", func() bool { return pendingRows(t, pool) == 0 })
	next.terminate(30 * time.Second)
	c.waitDistinct(t, n, time.Minute)
	c.poll(t, time.Second)
	if len(c.recs) != n {
		t.Errorf("%d records for %d events: a graceful restart duplicated %d", len(c.recs), n, len(c.recs)-n)
	}
}
