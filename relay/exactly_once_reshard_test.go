package relay

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestExactlyOnceReshard: exactly-once relay processes following the layout, as the operator
// runs them, resharded 1 -> 4 -> 2 -> 1 under load, with a fault at each switch, at a moment the
// test confirms from the broker and the database:
//   - 1 -> 4 and 2 -> 1: a relay of the old layout is SIGKILLed (again, at random moments,
//     until a kill leaves its committed cursor record ahead of the database's cursor rows: it
//     died between a commit and the database's copy), and the switch goes through while it is
//     down; the new layout's first tenure must adopt the old layout's record;
//   - 4 -> 2: a relay of the old layout is frozen (SIGSTOP) while its transaction is open (the
//     broker's state for its transactional id), loses its buckets after the lock lease, the
//     switch goes through, and it is resumed only once a relay of the new layout is publishing:
//     the new layout fenced the old layout's ids, so its commit is refused.
//
// An independent read_committed consumer reads every event once, in order per aggregate; the
// records a read_uncommitted consumer sees beyond them (aborted) are counted.
func TestExactlyOnceReshard(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	k := kafkatest.Start(t, kafkatest.Apache)
	events, cursors := exactlyOnceTopics(t, k, "relay.eosreshard", 6)
	relayBinary(t)
	c := &collector{c: k.NewCommittedConsumer(t, events), byEvent: map[string]int{}}
	rnd := rand.New(rand.NewPCG(testSeed(t), 5))
	adm, closeAdm := admin(t, k)
	defer closeAdm()
	var sys string
	if err := pool.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sys); err != nil {
		t.Fatal(err)
	}

	if ok, err := outboxdb.SwitchLayout(ctx, db, testTable, 1); err != nil || !ok {
		t.Fatalf("first layout: %v, %v", ok, err)
	}
	args := func(i int) []string {
		return []string{"--brokers", k.Brokers[0], "--default-topic", events, "--batch-size", "100", "--tracking", "snapshot",
			"--delivery", "exactly-once", "--cursor-topic", cursors, "--lock-lease", "3s", "--shard-count", "0", "--shard-index", itoa(i)}
	}
	procs := make([]*proc, 4)
	for i := range procs {
		procs[i] = startProc(t, url, args(i)...)
	}
	readyOnly := func(want int) func() bool {
		return func() bool {
			for i, p := range procs {
				if (p.status("/readyz") == 200) != (i < want) {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, time.Minute, "shard 0 of 1 ready", readyOnly(1))
	load := startWriters(t, url, 2, 100, 10, 10*time.Millisecond)
	busy := func(what string) {
		n := len(c.byEvent) + 1000
		waitFor(t, time.Minute, what, func() bool { c.poll(t, 200*time.Millisecond); return len(c.byEvent) >= n })
	}
	gen := func() int64 {
		l, err := outboxdb.ReadLayout(ctx, db, testTable)
		if err != nil {
			t.Fatal(err)
		}
		return l.Generation
	}
	reshard := func(n int32) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if _, err := outboxdb.Reshard(rctx, db, testTable, n, 20*time.Millisecond); err != nil {
			t.Fatalf("reshard to %d: %v", n, err)
		}
	}
	// killAhead kills shard index of count at random moments (restarting it in between) until a
	// kill leaves its committed cursor record ahead of the database's cursor rows; it stays down.
	killAhead := func(index, count int) int {
		t.Helper()
		g := gen()
		shard := txnShardID(sys, "public.outbox", g, index, count)
		for try := 1; try <= 30; try++ {
			before := procs[index].metric("outbox_published_total")
			waitFor(t, time.Minute, "relay "+itoa(index)+" publishing", func() bool {
				return procs[index].metric("outbox_published_total") > before
			})
			time.Sleep(time.Duration(rnd.IntN(300)) * time.Millisecond)
			procs[index].kill()
			if shardAhead(t, k, cursors, pool, shard) {
				return try
			}
			procs[index] = startProc(t, url, args(index)...)
		}
		t.Fatalf("no kill of %s left its cursor record ahead of the database's in 30 tries: the test did not hit the dangerous moment", shard)
		return 0
	}

	busy("1 shard publishing")
	tries := killAhead(0, 1)
	reshard(4)
	procs[0] = startProc(t, url, args(0)...) // its pod restarts
	waitFor(t, time.Minute, "exactly shards 0..3 ready", readyOnly(4))
	t.Logf("1 -> 4: the relay of 1 shard killed with its cursor record ahead of the database's (kill %d), the switch made while it was down", tries)
	busy("4 shards publishing")

	// 4 -> 2 with a relay of the old layout frozen inside a transaction.
	z := rnd.IntN(4)
	zid := txnShardID(sys, "public.outbox", gen(), z, 4)
	frozen := false
	for try := 0; try < 200 && !frozen; try++ {
		time.Sleep(time.Duration(rnd.IntN(30)) * time.Millisecond)
		if err := procs[z].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		// A commit the relay sent just before it stopped may reach the coordinator after the
		// first look: the second, a moment later, sees it completing.
		frozen = txnState(t, adm, zid) == "Ongoing"
		if frozen {
			time.Sleep(100 * time.Millisecond)
			frozen = txnState(t, adm, zid) == "Ongoing"
		}
		if !frozen {
			if err := procs[z].cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !frozen {
		t.Fatalf("no freeze of %s landed inside an open transaction in 200 tries: the test did not hit the dangerous moment", zid)
	}
	frozenAt := time.Now()
	var version int
	if err := db.QueryRowContext(ctx, `SHOW server_version_num`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 140000 {
		// PostgreSQL 13 has no idle_session_timeout, which ends the frozen relay's lock session
		// after the lease on 14 and later: the test ends it, as a DBA would, once it is the
		// only holder left (the others stood down for the reshard).
		locks, err := outboxdb.ReadRelayLocks(ctx, db, testTable)
		if err != nil {
			t.Fatal(err)
		}
		pid := locks.Buckets[int16(z)]
		go func() {
			deadline := time.Now().Add(time.Minute)
			for time.Now().Before(deadline) {
				if l, err := outboxdb.ReadRelayLocks(ctx, db, testTable); err == nil && slices.Equal(l.Holders(), []int32{pid}) {
					_, err := db.ExecContext(ctx, `SELECT pg_terminate_backend($1)`, pid)
					t.Logf("PostgreSQL %d: ended the frozen relay's lock session (%d): %v", version, pid, err)
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	reshard(2)
	t.Logf("4 -> 2: switched %s after relay %d was frozen inside a transaction", time.Since(frozenAt).Round(time.Millisecond), z)
	other := 1 - min(z, 1) // a relay of the new layout that is not the frozen one
	base := procs[other].metric("outbox_published_total")
	waitFor(t, time.Minute, "a relay of the new layout publishing", func() bool {
		return procs[other].status("/readyz") == 200 && procs[other].metric("outbox_published_total") > base
	})
	if err := procs[z].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the resumed relay to end its tenure", func() bool {
		l := procs[z].log()
		return strings.Contains(l, "the shard's producer publishes no more") || strings.Contains(l, "lock_connection_lost=true")
	})
	t.Logf("the resumed relay %d: %s", z, lastLine(procs[z].log(), "publishes no more", "lock_connection_lost=true"))
	waitFor(t, time.Minute, "exactly shards 0..1 ready", readyOnly(2))
	busy("2 shards publishing")
	// Nothing in this load fails for itself, so nothing is ever parked: the resumed relay's
	// fenced batch, committed by nobody, must not be parked by its next tenure (a shard of the
	// new layout when it is relay 0 or 1), which would publish its events again.
	for i, p := range procs {
		if l := lastLine(p.log(), "parked events"); l != "" {
			t.Errorf("relay %d parked events, with nothing failing for itself: %s", i, l)
		}
	}

	// 2 -> 1 with a relay of the old layout killed after a commit, before the database's copy.
	victim := rnd.IntN(2)
	tries = killAhead(victim, 2)
	reshard(1)
	procs[victim] = startProc(t, url, args(victim)...)
	waitFor(t, time.Minute, "exactly shard 0 ready", readyOnly(1))
	t.Logf("2 -> 1: relay %d killed with its cursor record ahead of the database's (kill %d), the switch made while it was down", victim, tries)
	busy("1 shard publishing again")

	want := load.stop(t)
	total := int(load.total.Load())
	waitFor(t, 2*time.Minute, "the backlog to drain", func() bool { return pendingRows(t, pool) == 0 })
	c.waitDistinct(t, total, 2*time.Minute)
	c.poll(t, time.Second)
	dups := checkOrder(t, c.recs, want)
	t.Logf("%d events: %d records read committed, %d duplicates; %d records read uncommitted (aborted ones included)",
		total, len(c.recs), dups, readAll(t, k, events))
	if dups != 0 {
		t.Errorf("%d duplicates read committed, want 0", dups)
	}
}

// txnState is the broker's state of a transactional id (Ongoing: a transaction is open).
func txnState(t *testing.T, adm *kadm.Client, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := adm.DescribeTransactions(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return d[id].State
}

// shardAhead reads shard's last committed cursor record and says whether it is ahead of the
// database's cursor rows for some of its buckets: the shard ended between a commit and the
// database's copy, which the next tenure of its buckets must follow.
func shardAhead(t *testing.T, k *kafkatest.Cluster, cursors string, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, shard string) bool {
	t.Helper()
	rec := committedRecord(t, k, cursors, shard)
	if rec == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT buckets, coalesce(snap::text, ''), coalesce(next_snap::text, ''), last_id FROM outbox_relay_cursor`)
	if err != nil {
		t.Fatal(err)
	}
	var groups []*cursorGroup
	for rows.Next() {
		var g cursorGroup
		var snap, next string
		if err := rows.Scan(&g.buckets, &snap, &next, &g.last); err != nil {
			t.Fatal(err)
		}
		g.snap, g.next = unmarked(snap), unmarked(next)
		groups = append(groups, &g)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	adopt, _, _, err := reconcileCursor(groups, []txnCursor{*rec})
	if err != nil {
		t.Fatal(fmt.Errorf("%s: %w", shard, err))
	}
	return len(adopt) > 0
}

// readAll counts the records of topic, read uncommitted.
func readAll(t *testing.T, k *kafkatest.Cluster, topic string) int {
	t.Helper()
	all := k.NewConsumer(t, topic)
	n := 0
	for {
		recs, err := all.Poll(context.Background(), time.Second)
		if err != nil || len(recs) == 0 {
			return n
		}
		n += len(recs)
	}
}

// committedRecord is shard's last committed cursor record (nil: none).
func committedRecord(t *testing.T, k *kafkatest.Cluster, cursors, shard string) *txnCursor {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, found, err := readCursor(ctx, KafkaConfig{Brokers: k.Brokers}, cursors, []byte(shard))
	if err != nil {
		t.Fatal(err)
	}
	if !found {
		return nil
	}
	rec, err := decodeCursor(shard, v)
	if err != nil {
		t.Fatal(err)
	}
	return &rec
}
