package relay

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestZombie runs two relay processes for one shard, A publishing under a load that keeps it
// busy and B standing by, and makes each a zombie in turn, while publishing:
//
//  1. A's lock connection is terminated (pg_terminate_backend) while A keeps running: B takes
//     the shard, A reconnects and stands by;
//  2. B, now publishing, is frozen with SIGSTOP: PostgreSQL ends its silent session after the
//     lock lease (idle_session_timeout; on PostgreSQL 13, which has none, A, waiting for the
//     shard, ends it), A takes the shard; B is resumed with SIGCONT and stands by.
//
// The observers are PostgreSQL's pg_locks (who holds the shard's presence lock) and an
// independent consumer: nothing is lost, each aggregate's events arrive in order once
// duplicates are dropped, and no event committed after a takeover is published twice, which is
// what a zombie that went on publishing after losing its shard would do (it may only publish
// again what it fetched before).
func TestZombie(t *testing.T) { forEachTracking(t, testZombie) }

func testZombie(t *testing.T, tracking Tracking) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.zombie")
	k.CreateTopic(t, topic, 6)
	relayBinary(t)
	c := newCollector(t, k, topic)
	const lease = 3 * time.Second
	args := []string{"--brokers", k.Brokers[0], "--default-topic", topic, "--batch-size", "200", "--poll-interval", "500ms",
		"--lock-lease", lease.String(), "--tracking", string(tracking)}

	a := startProc(t, url, args...)
	waitFor(t, 30*time.Second, "relay A holding the shard", func() bool { return presenceHolder(t, pool) != 0 })
	pidA := presenceHolder(t, pool)
	b := startProc(t, url, args...)
	waitFor(t, 30*time.Second, "relay B waiting for the shard", func() bool { return presenceWaiters(t, pool) == 1 })

	load := startWriters(t, url, 2, 100, 10, 10*time.Millisecond)
	busy := func(what string) { // the relay in charge publishes at the writers' rate
		n := len(c.byEvent) + 1500
		waitFor(t, time.Minute, what, func() bool { c.poll(t, 200*time.Millisecond); return len(c.byEvent) >= n })
	}
	busy("relay A publishing")

	// 1. A's lock connection is terminated while A publishes.
	var ok bool
	if err := pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pidA).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pidA, ok, err)
	}
	start := time.Now()
	waitFor(t, 30*time.Second, "relay B to take the shard", func() bool { h := presenceHolder(t, pool); return h != 0 && h != pidA })
	pidB := presenceHolder(t, pool)
	took1, after1 := time.Since(start), maxID(t, pool)
	waitFor(t, 30*time.Second, "relay A to stand by again", func() bool { return presenceWaiters(t, pool) == 1 })
	busy("relay B publishing")
	c.catchUp(t, k, topic, time.Minute)
	if n := dupsAbove(t, pool, c, after1); n != 0 {
		t.Errorf("%d events committed after relay B took the shard were published twice: relay A went on publishing after its session was terminated", n)
	}

	// 2. B is frozen while it publishes, then resumed.
	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	waitFor(t, lease+30*time.Second, "relay A to take the shard from frozen relay B", func() bool {
		h := presenceHolder(t, pool)
		return h != 0 && h != pidB
	})
	took2, after2 := time.Since(start), maxID(t, pool)
	// PostgreSQL counts the lease from B's last statement, a round trip (at most a poll interval,
	// 500 ms) before the freeze: A may take over that much sooner, never much sooner.
	if took2 < lease-time.Second {
		t.Errorf("relay A took the shard %s after relay B froze, well before the lease of %s ran out", took2, lease)
	}
	busy("relay A publishing")
	if err := b.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "resumed relay B to stand by", func() bool { return presenceWaiters(t, pool) == 1 })
	busy("relay A publishing after relay B resumed")

	want := load.stop(t)
	total := int(load.total.Load())
	waitFor(t, time.Minute, "the backlog to drain", func() bool { return pendingRows(t, pool) == 0 })
	c.waitDistinct(t, total, time.Minute)
	c.catchUp(t, k, topic, time.Minute)
	dups := checkOrder(t, c.recs, want)
	if n := dupsAbove(t, pool, c, after2); n != 0 {
		t.Errorf("%d events committed after relay A took the shard were published twice: frozen relay B published after it resumed", n)
	}
	if len(c.byEvent) != total {
		t.Errorf("%d distinct events on the topic, %d written", len(c.byEvent), total)
	}
	t.Logf("0 lost, 0 reordered: %d events, %d duplicates; relay B took the shard %s after relay A's session was terminated, "+
		"relay A took it %s after relay B froze (lease %s)", total, dups, took1.Round(time.Millisecond), took2.Round(time.Millisecond), lease)
	a.terminate(30 * time.Second)
	b.terminate(30 * time.Second)
}

// presenceHolder returns the backend pid holding shard 0's presence lock, 0 if none.
func presenceHolder(t testing.TB, pool *pgxpool.Pool) int32 {
	t.Helper()
	var pid int32
	if err := pool.QueryRow(context.Background(), `SELECT coalesce((SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2), 0)`, testTable.LockKey(), outboxdb.PresenceLock).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// presenceWaiters returns how many sessions wait for shard 0's presence lock.
func presenceWaiters(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2`, testTable.LockKey(), outboxdb.PresenceLock).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func maxID(t testing.TB, pool *pgxpool.Pool) int64 {
	t.Helper()
	var id int64
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(max(id), 0) FROM outbox`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// dupsAbove counts the events with an id above id that the consumer received more than once.
func dupsAbove(t testing.TB, pool *pgxpool.Pool, c *collector, id int64) int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id::text FROM outbox WHERE id > $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var e string
		if err := rows.Scan(&e); err != nil {
			t.Fatal(err)
		}
		if c.byEvent[e] > 1 {
			n++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
