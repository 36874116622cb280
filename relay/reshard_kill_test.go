package relay

import (
	"context"
	"database/sql"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestReshardRelayKilled: the relay holding every bucket is killed in the middle of a reshard
// (1 -> 4 shards), after the change was requested and before it released its buckets (it is
// frozen first, so the moment is certain; the layout row says so), under load, with relay
// processes following the layout as the operator runs them. The switch, retried as the operator
// retries it, goes through once the killed relay's session is gone; the relay restarts (as its
// pod would) into the new layout; every shard is held (pg_locks), and the consumer receives every
// event, in order per aggregate after dropping duplicates (the killed relay's batch in flight,
// published but not recorded, comes again).
func TestReshardRelayKilled(t *testing.T) { forEachTracking(t, testReshardRelayKilled) }

func testReshardRelayKilled(t *testing.T, tracking Tracking) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.reshard.kill")
	k.CreateTopic(t, topic, 6)
	relayBinary(t)
	c := newCollector(t, k, topic)
	if ok, err := outboxdb.SwitchLayout(ctx, db, testTable, 1); err != nil || !ok {
		t.Fatalf("first layout: %v, %v", ok, err)
	}
	args := func(i int) []string {
		return []string{"--brokers", k.Brokers[0], "--default-topic", topic, "--batch-size", "100", "--poll-interval", "500ms",
			"--tracking", string(tracking), "--shard-count", "0", "--shard-index", itoa(i)}
	}
	procs := make([]*proc, 4)
	for i := range procs {
		procs[i] = startProc(t, url, args(i)...)
	}
	waitFor(t, 30*time.Second, "shard 0 of 1 ready", func() bool { return procs[0].status("/readyz") == 200 })
	load := startWriters(t, url, 2, 100, 10, 10*time.Millisecond)
	busy := func(what string) {
		n := len(c.byEvent) + 1500
		waitFor(t, time.Minute, what, func() bool { c.poll(t, 200*time.Millisecond); return len(c.byEvent) >= n })
	}
	busy("relay 0 publishing")

	// Frozen, relay 0 cannot stand down: the reshard is requested and stays in the middle.
	if err := procs[0].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := outboxdb.RequestLayout(ctx, db, testTable, 4); err != nil {
		t.Fatal(err)
	}
	if ok, err := outboxdb.SwitchLayout(ctx, db, testTable, 4); err != nil || ok {
		t.Fatalf("the switch went through while relay 0 held its buckets: %v, %v", ok, err)
	}
	l, err := outboxdb.ReadLayout(ctx, db, testTable)
	if err != nil || l.RequestedAt.IsZero() || !l.ReleasedAt.IsZero() {
		t.Fatalf("not in the middle of the reshard: %+v, %v", l, err)
	}
	procs[0].kill()
	killed := time.Now()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if ok, err := outboxdb.RetrySwitch(rctx, outboxdb.RealClock{}, db, testTable, 4, 20*time.Millisecond, 0); err != nil || !ok {
		t.Fatalf("the switch after relay 0 was killed: %v, %v", ok, err)
	}
	t.Logf("switched to 4 shards %s after relay 0 was killed in the middle of the reshard", time.Since(killed).Round(time.Millisecond))
	procs[0] = startProc(t, url, args(0)...) // its pod restarts
	waitFor(t, time.Minute, "every shard of 4 held", func() bool {
		locks, err := outboxdb.ReadRelayLocks(ctx, db, testTable)
		return err == nil && len(locks.Holders()) == 4
	})
	busy("the 4 shards publishing")

	want := load.stop(t)
	total := int(load.total.Load())
	waitFor(t, time.Minute, "the backlog to drain", func() bool { return pendingRows(t, pool) == 0 })
	c.waitDistinct(t, total, time.Minute)
	c.catchUp(t, k, topic, time.Minute)
	dups := checkOrder(t, c.recs, want)
	if len(c.byEvent) != total {
		t.Errorf("%d distinct events on the topic, %d written", len(c.byEvent), total)
	}
	for i, p := range procs {
		if p.status("/readyz") != 200 {
			t.Errorf("relay %d not ready after the reshard: %s", i, p.logTail(500))
		}
	}
	t.Logf("0 lost, 0 reordered: %d events, %d duplicates (relay 0's batch in flight when killed)", total, dups)
}
