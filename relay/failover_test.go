package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestFailover runs two relays (shards 0 and 1 of 2) and four writers against a primary with a
// synchronous streaming standby, and fails over twice while events are committed and not yet
// published: the old primary killed (SIGKILL to all its processes), the standby promoted; then
// the old primary rebuilt as a standby of the new one, on its old port, and failed back the same
// way. Shard 0 and two writers follow the primary with a multi-host URL
// (target_session_attrs=read-write); shard 1 and the two others know one address that moves, as
// a Kubernetes Service, a virtual IP or a DNS name does (pgtest.Proxy), and at each failover
// its connections fall silent first, as to a host gone from the network: that relay notices
// through its round trips' timeout (--query-timeout). Every event whose COMMIT returned must
// reach the independent consumer, in order per aggregate, and each relay must publish events
// committed on each new primary. Before migration 00015 the relays never published again after
// the first promotion: the unlogged wake-up sequence could not be read on the promoted standby.
func TestFailover(t *testing.T) { forEachTracking(t, testFailover) }

// failoverDB is the start of the failover tests: a primary and its streaming standby, the
// outbox database on them (made after the standby, as on a cluster that runs: the standby has it
// from the WAL, not from its base backup; a relation created by the WAL and one copied by the
// backup came back differently from a promotion), a multi-host URL over both, the broker, a
// topic and its independent consumer, and a logged seed.
func failoverDB(ctx context.Context, t *testing.T, synchronous bool) (a, b *pgtest.Server, url string, rng *rand.Rand,
	k *kafkatest.Cluster, topic string, c *collector) {
	t.Helper()
	rng = rand.New(rand.NewPCG(testSeed(t), 0))
	a, b = pgtest.StartWithStandby(ctx, t, synchronous)
	if _, err := a.CreateDatabase(ctx, failoverDBName); err != nil {
		t.Fatal(err)
	}
	newOutboxDB(t, a.URL(failoverDBName))
	k = kafkatest.Start(t, kafkatest.Apache)
	topic = kafkatest.UniqueTopic("relay.failover")
	k.CreateTopic(t, topic, 6)
	return a, b, pgtest.MultiHostURL(failoverDBName, a, b), rng, k, topic, newCollector(t, k, topic)
}

const failoverDBName = "failover"

// failoverMinPending is the fewest events committed and not yet published at a kill (under this
// load 30 to about 1,100 were, when the kill did not wait for more than one).
const failoverMinPending = 10

// failoverQueryTimeout bounds the round trips of the relay behind the moving address, which
// notices its silent connections that way (the default, contract.RelayQueryTimeout, is 30 s).
const failoverQueryTimeout = 3 * time.Second

func testFailover(t *testing.T, tracking Tracking) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const db = failoverDBName
	a, b, url, rng, k, topic, c := failoverDB(ctx, t, true)
	addr := pgtest.NewProxy(t, a)
	urls := []string{url, addr.URL(db)}
	styles := []string{"multi-host URL", "moving address"}
	var relays []*running
	for i := range 2 {
		cfg := withTracking(testConfig(urls[i], k.Brokers, topic), tracking)
		cfg.ShardCount, cfg.ShardIndex = 2, i
		cfg.MaxPayloadBytes = 2000
		cfg.QueryTimeout = failoverQueryTimeout
		relays = append(relays, startRelay(t, cfg, fmt.Sprintf("shard %d", i)))
	}
	for _, r := range relays {
		waitFor(t, 30*time.Second, "relays ready", r.Ready)
	}
	// A poison event (its payload over the relays' limit) is held back before the failovers and
	// must still be held back, not published and not lost, after them.
	aPool := newPool(t, a.URL(db))
	if _, err := aPool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', 'poison-1', 'Big', jsonb_build_object('pad', repeat('x', 3000)))`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the poison event held back", func() bool { return poisonHeld(t, aPool, tracking) })
	// Which shard publishes each writer's aggregates: the table's bucket expression, computed by
	// the database.
	const writers, aggs = 4, 64
	shardOf := map[string]int{}
	rows, err := aPool.Query(ctx, `SELECT a, `+outboxdb.BucketOf("a")+` % 2
FROM generate_series(0, $1 - 1) AS w, generate_series(0, $2 - 1) AS g, format('w%s-agg-%s', w, lpad(g::text, 3, '0')) AS a`, writers, aggs)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var agg string
		var shard int
		if err := rows.Scan(&agg, &shard); err != nil {
			t.Fatal(err)
		}
		shardOf[agg] = shard
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	aPool.Close()
	pause := time.Duration(1+rng.IntN(3)) * time.Millisecond
	loads := []*resilientWriters{
		startResilientWritersFrom(t, urls[0], 0, writers/2, aggs, 10, pause),
		startResilientWritersFrom(t, urls[1], writers/2, writers/2, aggs, 10, pause),
	}

	// failOver kills primary while the relays are busy and promotes standby; the moving address
	// falls silent before the kill and moves to the standby once it is promoted.
	failOver := func(step string, primary, standby *pgtest.Server) {
		t.Helper()
		pool := newPool(t, primary.URL(db))
		// The dangerous moment: the relays publishing, and events committed that they have not
		// published yet (the database says so, not the relays).
		waitFor(t, time.Minute, step+": a synchronous standby streaming", func() bool { return syncStandby(t, pool, false) })
		seen := len(c.byEvent)
		waitFor(t, time.Minute, step+": the relays publishing under load", func() bool {
			c.poll(t, 100*time.Millisecond)
			return len(c.byEvent) >= seen+500+rng.IntN(1000)
		})
		// At least failoverMinPending of them, so that the kill finds batches in flight or
		// unrecorded rather than the odd event committed a moment before (a failback once found 1).
		var pending int
		waitFor(t, time.Minute, step+": events committed and not yet published", func() bool {
			pending = pendingRows(t, pool)
			return pending >= failoverMinPending
		})
		if !syncStandby(t, pool, true) {
			t.Fatalf("%s: the primary has no synchronous standby streaming at the kill", step)
		}
		pool.Close()
		addr.Cut()
		if err := primary.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		if err := standby.Promote(ctx); err != nil {
			t.Fatal(err)
		}
		promoted := time.Now()
		addr.MoveTo(standby)
		// What the writers had begun by now (committed or not): a later event was committed on
		// the new primary. (Their commits that returned are too few: a transaction committed on
		// the old primary, and published from it, may not have told its writer yet.)
		before := map[string]int{}
		for _, l := range loads {
			maps.Copy(before, l.issuedSeqs())
		}
		t.Logf("%s: primary :%d killed with %d events pending (the moving address silent); standby :%d promoted in %s, the address moved to it",
			step, primary.Port, pending, standby.Port, promoted.Sub(killed).Round(time.Millisecond))
		// Published again, by each relay: an event of its shard that no writer had begun when the
		// standby was promoted.
		fresh := [2]time.Duration{}
		waitFor(t, 2*time.Minute, step+": an event committed on the new primary published by each shard", func() bool {
			c.poll(t, 100*time.Millisecond)
			for _, r := range c.recs[max(0, len(c.recs)-4000):] {
				var ev seqEvent
				if json.Unmarshal(r.Value, &ev) == nil && ev.Seq > before[ev.Agg] && before[ev.Agg] > 0 && fresh[shardOf[ev.Agg]] == 0 {
					fresh[shardOf[ev.Agg]] = time.Since(promoted)
				}
			}
			return fresh[0] > 0 && fresh[1] > 0
		})
		for i, d := range fresh {
			t.Logf("%s: shard %d (%s) publishing again within %s after the promotion", step, i, styles[i], d.Round(100*time.Millisecond))
		}
		for _, r := range relays {
			waitFor(t, time.Minute, step+": relays ready on the new primary", r.Ready)
		}
	}

	failOver("failover", a, b)
	// The old primary comes back as a standby of the new one, on its old port, and the next
	// failover returns to it.
	port := a.Port
	a.Close()
	a2, err := b.NewStandby(ctx, pgtest.StandbyOptions{Name: "pg_a", Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a2.Close)
	if err := b.SetSynchronous(ctx, "pg_a"); err != nil {
		t.Fatal(err)
	}
	failOver("failback", b, a2)

	want, total, fails := map[string]int{}, 0, 0
	for _, l := range loads {
		w, n, f := l.stop()
		for a, s := range w {
			want[a] = s
		}
		total, fails = total+n, fails+f
	}
	pool := newPool(t, a2.URL(db))
	waitFor(t, 2*time.Minute, "the backlog to drain on the last primary, but for the poison event", func() bool { return pendingRows(t, pool) == 1 })
	unconfirmed := map[seqEvent]bool{}
	for _, l := range loads {
		maps.Copy(unconfirmed, l.unconfirmedEvents())
	}
	c.waitDistinctOr(t, total, 2*time.Minute, func() { explainMissing(t, pool, k, topic, c, want, unconfirmed) })
	c.poll(t, 500*time.Millisecond)
	dups := checkOrder(t, c.recs, want)
	var parked int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_parked WHERE aggregate_id <> 'poison-1'`).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if parked != 0 {
		t.Errorf("%d events parked by a failover: a failover is not their fault", parked)
	}
	if !poisonHeld(t, pool, tracking) {
		t.Error("the poison event is no longer held back after the failovers")
	}
	if c.byEvent[poisonID(t, pool)] > 0 {
		t.Error("the poison event was published")
	}
	t.Logf("%d events through two failovers (%d writer transactions retried, %d events whose COMMIT's wait for the standby was cancelled), 0 lost, 0 reordered, %d duplicates",
		total, fails, len(unconfirmed), dups)
	assertCursorConsistent(t, pool, tracking)
}

// assertCursorConsistent checks, under snapshot tracking, that the cursor rows on the server
// cover every bucket once and belong to it (the identity check accepts a promoted standby).
func assertCursorConsistent(t *testing.T, pool *pgxpool.Pool, tracking Tracking) {
	t.Helper()
	if tracking != TrackSnapshot {
		return
	}
	var buckets, distinct int
	var same bool
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT b), bool_and(c.system_identifier = s.system_identifier)
FROM outbox_relay_cursor AS c CROSS JOIN LATERAL unnest(c.buckets) AS b, pg_control_system() AS s`).Scan(&buckets, &distinct, &same); err != nil {
		t.Fatal(err)
	}
	if buckets != 256 || distinct != 256 || !same {
		t.Errorf("cursor after the failovers: %d bucket entries, %d distinct, same system %v; want 256, 256, true", buckets, distinct, same)
	}
}

// TestFailoverAsync fails over to an asynchronous standby that lags (its WAL receiver stopped
// with SIGSTOP while writers commit and the relay publishes), in both tracking modes, once
// publishing at once and once with --wait-for-standbys 1. The new primary's outbox table is
// the truth afterwards: every event in it must reach the consumer, in order per aggregate, and
// an event that reached the consumer but not the new primary ("phantom": its transaction was
// lost with the old primary) is counted. Publishing at once, phantoms are what asynchronous
// replication costs (measured, logged); waiting for the standby, there must be none. With
// -short (the version matrix in make test) only the guarantee runs: waiting for the standby.
func TestFailoverAsync(t *testing.T) {
	waits := []int{0, 1}
	if testing.Short() {
		waits = []int{1}
	}
	for _, tr := range trackings {
		for _, wait := range waits {
			t.Run(fmt.Sprintf("%s/wait-for-standbys=%d", tr, wait), func(t *testing.T) { testFailoverAsync(t, tr, wait) })
		}
	}
}

func testFailoverAsync(t *testing.T, tracking Tracking, standbys int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const db = failoverDBName
	a, b, url, rng, k, topic, c := failoverDB(ctx, t, false)
	cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	cfg.WaitForStandbys = standbys
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "relay ready", r.Ready)
	load := startResilientWriters(t, url, 4, 64, 10, time.Duration(1+rng.IntN(3))*time.Millisecond)
	seen := len(c.byEvent)
	waitFor(t, time.Minute, "the relay publishing under load", func() bool {
		c.poll(t, 100*time.Millisecond)
		return len(c.byEvent) >= seen+500
	})

	// The standby falls behind: its WAL receiver stops while the writers go on committing.
	sb, err := pgx.Connect(ctx, b.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var receiver int
	if err := sb.QueryRow(ctx, `SELECT pid FROM pg_stat_wal_receiver`).Scan(&receiver); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(receiver, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(receiver, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	written := load.Written()
	waitFor(t, time.Minute, "1,000 more events committed on the primary alone", func() bool { return load.Written() >= written+1000 })
	primary := newPool(t, a.URL(db))
	var lagBytes int64
	var pendingAtKill int
	if err := primary.QueryRow(ctx, `SELECT pg_current_wal_lsn() - replay_lsn FROM pg_stat_replication`).Scan(&lagBytes); err != nil {
		t.Fatal(err)
	}
	pendingAtKill = pendingRows(t, primary)
	primary.Close()
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	c.poll(t, 200*time.Millisecond)
	publishedAtKill := len(c.byEvent)
	// The WAL the stopped receiver holds in its socket but has not written goes with it: SIGKILL.
	// The standby's postmaster takes that for a crash: it ends every backend, sb's too, and
	// recovers what the standby had flushed. Until sb is gone the restart has not begun, and a
	// connection made before it would see a standby about to refuse pg_promote (57P03).
	resumed = true
	if err := syscall.Kill(receiver, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the standby's crash restart (its backends ended)", func() bool {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		defer pcancel()
		return sb.Ping(pctx) != nil
	})
	sb.Close(ctx)
	waitFor(t, time.Minute, "the standby back in recovery", func() bool {
		conn, err := pgx.Connect(ctx, b.URL("postgres"))
		if err != nil {
			return false
		}
		defer conn.Close(ctx)
		var rec bool
		return conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&rec) == nil && rec
	})
	if err := b.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	if standbys > 0 {
		// The new primary needs a standby before a relay that waits for one publishes: the old
		// primary comes back as one.
		port := a.Port
		a.Close()
		a2, err := b.NewStandby(ctx, pgtest.StandbyOptions{Name: "pg_a", Port: port})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a2.Close)
	}
	t.Logf("primary killed %d WAL bytes ahead of the standby, %d events pending on it; standby promoted", lagBytes, pendingAtKill)
	if lagBytes <= 0 {
		t.Fatalf("the standby did not lag (%d bytes): the failover loses nothing, the test shows nothing", lagBytes)
	}
	written = load.Written()
	waitFor(t, time.Minute, "writers committing on the new primary", func() bool { return load.Written() >= written+500 })
	_, total, fails := load.stop()

	pool := newPool(t, b.URL(db))
	waitFor(t, 2*time.Minute, "the backlog to drain on the new primary", func() bool { return pendingRows(t, pool) == 0 })
	t.Logf("publishing again and drained %s after the promotion", time.Since(promoted).Round(time.Millisecond))
	// The truth: the events the new primary has, in each aggregate's order.
	have := map[string]seqEvent{}
	rows, err := pool.Query(ctx, `SELECT event_id::text, payload FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var p []byte
		if err := rows.Scan(&id, &p); err != nil {
			t.Fatal(err)
		}
		var ev seqEvent
		if err := json.Unmarshal(p, &ev); err != nil {
			t.Fatal(err)
		}
		have[id] = ev
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	missing := func() int {
		n := 0
		for id := range have {
			if c.byEvent[id] == 0 {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(2 * time.Minute)
	for missing() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d events of the new primary never reached the consumer", missing())
		}
		c.poll(t, 500*time.Millisecond)
	}
	phantoms := 0
	last := map[string]int{}
	for id := range c.byEvent {
		if _, ok := have[id]; !ok {
			phantoms++
		}
	}
	first := map[string]bool{} // as a consumer with an inbox sees them: duplicates dropped
	for _, rec := range c.recs {
		id := rec.Headers[HeaderEventID]
		ev, ok := have[id]
		if !ok || first[id] {
			continue
		}
		first[id] = true
		if ev.Seq < last[ev.Agg] {
			t.Errorf("%s: event %d after %d", ev.Agg, ev.Seq, last[ev.Agg])
		}
		last[ev.Agg] = max(last[ev.Agg], ev.Seq)
	}
	lost := total - len(have)
	t.Logf("%d events committed by the writers (%d retried), %d on the new primary (%d lost with the old primary: asynchronous replication), "+
		"%d published before the kill; %d phantom events (published, not on the new primary)", total, fails, len(have), max(lost, 0), publishedAtKill, phantoms)
	if standbys > 0 && phantoms > 0 {
		t.Errorf("--wait-for-standbys %d published %d events the promoted standby does not have", standbys, phantoms)
	}
	if lost <= 0 {
		t.Errorf("no committed event was lost with the old primary: the standby did not miss what the relay could have published")
	}
}

// Written is how many events the writers have committed so far.
func (l *resilientWriters) Written() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// poisonHeld reports whether the poison event of aggregate poison-1 is held back as its tracking
// mode holds it: unsent with failed attempts (row), or parked (snapshot).
func poisonHeld(t testing.TB, pool *pgxpool.Pool, tracking Tracking) bool {
	t.Helper()
	q := `SELECT count(*) = 1 FROM outbox WHERE aggregate_id = 'poison-1' AND sent_at IS NULL AND attempts > 0`
	if tracking == TrackSnapshot {
		q = `SELECT count(*) = 1 FROM outbox_parked WHERE aggregate_id = 'poison-1'`
	}
	var held bool
	if err := pool.QueryRow(context.Background(), q).Scan(&held); err != nil {
		t.Fatal(err)
	}
	return held
}

func poisonID(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(), `SELECT event_id::text FROM outbox WHERE aggregate_id = 'poison-1'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// syncStandby reports whether the primary has a synchronous standby that streams, and logs what
// it says of its standbys when log is set (just before a kill: a synchronous failover test whose
// standby is not "sync" shows nothing about synchronous replication).
func syncStandby(t *testing.T, pool *pgxpool.Pool, log bool) bool {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT application_name, state, sync_state,
  coalesce(pg_current_wal_lsn() - flush_lsn, -1)::int8, current_setting('synchronous_standby_names'), current_setting('synchronous_commit')
FROM pg_stat_replication`)
	if err != nil {
		t.Logf("pg_stat_replication: %v", err)
		return false
	}
	defer rows.Close()
	sync := false
	for rows.Next() {
		var name, state, syncState, names, commit string
		var lag int64
		if err := rows.Scan(&name, &state, &syncState, &lag, &names, &commit); err != nil {
			t.Logf("pg_stat_replication: %v", err)
			return false
		}
		sync = sync || state == "streaming" && syncState == "sync" && commit == "on"
		if log {
			t.Logf("standby %s: %s, %s, %d bytes not flushed; synchronous_standby_names %q, synchronous_commit %s", name, state, syncState, lag, names, commit)
		}
	}
	return rows.Err() == nil && sync
}

// explainMissing logs, for events the writers committed that the consumer has not read, what
// the database holds of them: absent (the writers' count was wrong, or the commit was lost), or
// present and marked sent (published, or so the relay thought), or still unsent.
func explainMissing(t *testing.T, pool *pgxpool.Pool, k *kafkatest.Cluster, topic string, c *collector, want map[string]int,
	unconfirmed map[seqEvent]bool) {
	t.Helper()
	// A second consumer reads the topic from its start to its end offsets now: what it finds
	// that the collector did not was in the broker all along.
	again := newCollector(t, k, topic)
	again.catchUp(t, k, topic, time.Minute)
	t.Logf("the collector read %d records (%d distinct events), a fresh consumer %d (%d distinct); end offsets %v",
		len(c.recs), len(c.byEvent), len(again.recs), len(again.byEvent), k.EndOffsets(t, topic))
	seen := map[string]map[int]bool{}
	for _, r := range again.recs {
		var ev seqEvent
		if json.Unmarshal(r.Value, &ev) == nil {
			if seen[ev.Agg] == nil {
				seen[ev.Agg] = map[int]bool{}
			}
			seen[ev.Agg][ev.Seq] = true
		}
	}
	n := 0
	for agg, last := range want {
		for seq := 1; seq <= last; seq++ {
			if seen[agg][seq] {
				continue
			}
			n++
			if n > 40 {
				continue
			}
			var what string
			err := pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('id %s txid %s created %s sent %s attempts %s error %s',
  id, txid, created_at, sent_at, attempts, error), '; '), 'absent')
FROM outbox WHERE aggregate_id = $1 AND (payload->>'seq')::int = $2`, agg, seq).Scan(&what)
			if err != nil {
				what = err.Error()
			}
			if unconfirmed[seqEvent{Agg: agg, Seq: seq}] {
				what += " (its COMMIT's wait for the synchronous standby was cancelled: committed locally only)"
			}
			t.Logf("missing %s #%d: %s", agg, seq, what)
		}
	}
	t.Logf("%d events committed by the writers are missing from the consumer", n)
}
