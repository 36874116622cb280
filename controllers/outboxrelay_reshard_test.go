package controllers

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// TestReshardUnderLoad reshards the way users do, through the API: the scale subresource (what
// kubectl scale, an HPA and KEDA write) moves an OutboxRelay from 1 to 4 to 2 shards while
// writers append continuously to 1,000 aggregates. Real relays stand in for the pods. An
// independent consumer must see every event, each aggregate's in order, without duplicates, and
// status must report each change's publishing pause.
func TestReshardUnderLoad(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	ns := s.env.CreateNamespace(t, "reshard")
	url := pgtest.NewDatabase(t)
	s.createSecret(t, ns, "shop-db", map[string]string{"url": url})
	s.createRelay(t, newRelay(ns, "orders", "shop-db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Shards = 1
		r.Spec.Topics = nil
		r.Spec.DefaultTopic = "test.events"
	}))
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionShardsSettled, metav1.ConditionTrue, v1alpha1.ReasonShardsSettled)

	k := kafkatest.NewKfake(t)
	pods := startFollowers(t, url, k.Brokers, 4)
	eventually(t, 30*time.Second, func() error {
		if !pods[0].Ready() {
			return errorf("relays ready: %s; want shard 0 of 1", readyFollowers(pods))
		}
		return nil
	})
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	load := seqtest.StartLoad(context.Background(), pool, w, "order", 1000, 4, 10, 2*time.Millisecond)

	from := int32(1)
	for _, to := range []int32{4, 2} {
		before := load.Written()
		eventually(t, 30*time.Second, func() error {
			if load.Written() < before+2000 {
				return errorf("%d events written under %d shards", load.Written()-before, from)
			}
			return nil
		})
		relay := s.getRelay(t, ns, "orders")
		scale := &autoscalingv1.Scale{}
		if err := s.c.SubResource("scale").Get(ctx, relay, scale); err != nil {
			t.Fatal(err)
		}
		scale.Spec.Replicas = to
		if err := s.c.SubResource("scale").Update(ctx, relay, client.WithSubResourceBody(scale)); err != nil {
			t.Fatal(err)
		}
		relay = s.waitResharded(t, ns, "orders", from, to)
		t.Logf("%d -> %d shards under load: publishing paused %d ms", from, to, ptr.Deref(relay.Status.LastReshard.PauseMilliseconds, -1))
		eventually(t, 30*time.Second, func() error {
			for i, p := range pods {
				if p.Ready() != (int32(i) < to) {
					return errorf("relays ready: %s; want shards 0..%d", readyFollowers(pods), to-1)
				}
			}
			return nil
		})
		from = to
	}
	before := load.Written()
	eventually(t, 30*time.Second, func() error {
		if load.Written() < before+2000 {
			return errorf("%d events written under 2 shards", load.Written()-before)
		}
		return nil
	})
	// The operator's gauges follow: shard counts and the last pause.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewRelayCollector(s.mgr.GetClient()))
	eventually(t, 10*time.Second, func() error {
		mfs, err := reg.Gather()
		if err != nil {
			return err
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.Metric {
				for _, l := range m.Label {
					if l.GetName() == "namespace" && l.GetValue() == ns {
						got[mf.GetName()] = m.GetGauge().GetValue()
					}
				}
			}
		}
		if got["outbox_relay_shards"] != 2 || got["outbox_relay_desired_shards"] != 2 || got["outbox_relay_last_reshard_pause_seconds"] <= 0 {
			return errorf("gauges %v", got)
		}
		return nil
	})

	want := load.Stop(t)
	total := load.Written()

	c := k.NewConsumer(t, "test.events")
	recs := c.ReadN(t, total, 2*time.Minute)
	more, _ := c.Poll(ctx, time.Second)
	recs = append(recs, more...)
	if dups := seqtest.CheckOrder(t, recs, want, nil); dups != 0 {
		t.Errorf("%d duplicates: a relay stood down without recording what it had published", dups)
	}
	t.Logf("%d events of %d aggregates arrived in order through 1 -> 4 -> 2 shards", total, len(want))
}

// holdRelayLocks holds the presence lock of each shard index and the given buckets on a
// connection of its own, as relays do, until the test ends or release is called.
func holdRelayLocks(t *testing.T, url string, tb outboxdb.Table, shards []int, buckets []int) (release func()) {
	t.Helper()
	conn, release := lockSession(t, url)
	keys := append([]int(nil), buckets...)
	for _, k := range shards {
		keys = append(keys, outboxdb.PresenceLock+k)
	}
	for _, k := range keys {
		if _, err := conn.ExecContext(context.Background(), `SELECT pg_advisory_lock($1::int4, $2::int4)`, tb.LockKey(), k); err != nil {
			t.Fatal(err)
		}
	}
	return release
}

// lockSession opens a database session of its own, for advisory locks a test holds as a relay
// would; release ends it and returns once the server's backend is gone with its locks (closing
// the connection only sends the server a Terminate: the backend exits, and releases its locks,
// a moment later, which a step reading pg_locks right after would miss), as does the end of the
// test.
func lockSession(t *testing.T, url string) (conn *sql.Conn, release func()) {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	if conn, err = db.Conn(context.Background()); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRowContext(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = conn.Close()
			if err := db.Close(); err != nil {
				t.Errorf("closing the lock session: %v", err)
				return
			}
			waitBackendGone(t, url, pid)
		})
	}
	t.Cleanup(release)
	return conn, release
}

// waitBackendGone waits, at most 30 s, until the server lists neither backend pid nor a lock of
// it (pg_stat_activity, pg_locks).
func waitBackendGone(t *testing.T, url string, pid int) {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Errorf("checking backend %d: %v", pid, err)
		return
	}
	defer db.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var n int
		if err := db.QueryRowContext(context.Background(), `SELECT (SELECT count(*) FROM pg_stat_activity WHERE pid = $1) + (SELECT count(*) FROM pg_locks WHERE pid = $1)`, pid).Scan(&n); err != nil {
			t.Errorf("checking backend %d: %v", pid, err)
			return
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("backend %d of a closed lock session or its locks still listed after 30 s", pid)
			return
		}
	}
}

// TestEnsureLayoutSteps walks ensureLayout through a change with sessions holding the locks a
// relay would: it waits for the new shards' relays, asks the old layout to stand down, waits
// while a bucket is held, switches once none is, and withdraws a request when the desired count
// returns to the current one.
func TestEnsureLayoutSteps(t *testing.T) {
	ctx := context.Background()
	e := newStepEnvOn(t, time.Now(), pgtest.NewDatabase(t), "outbox", true)
	e.r.Clock = clocktesting.NewFakeClock(time.Now())
	pass := func(shards int32) (Result, *outboxdb.Layout, *metav1.Condition) {
		t.Helper()
		e.s.relay.Status.DesiredShards = shards
		e.s.before = e.s.relay.DeepCopy()
		if err := e.r.loadLayout(ctx, e.s); err != nil {
			t.Fatal(err)
		}
		if _, err := e.r.ensureBucketIndex(ctx, e.s); err != nil { // the step before, in a pass
			t.Fatal(err)
		}
		res, err := e.r.ensureLayout(ctx, e.s)
		if err != nil {
			t.Fatal(err)
		}
		l, err := outboxdb.ReadLayout(ctx, e.db, e.s.table)
		if err != nil {
			t.Fatal(err)
		}
		return res, l, meta.FindStatusCondition(e.s.relay.Status.Conditions, v1alpha1.ConditionShardsSettled)
	}

	// First layout: set at once.
	if _, l, c := pass(1); l == nil || l.ShardCount != 1 || c.Status != metav1.ConditionTrue {
		t.Fatalf("first layout %+v, condition %+v", l, c)
	}
	// A relay of shard 0 publishes (bucket 7 stands for all its buckets).
	oldRelay := holdRelayLocks(t, e.s.dbURL, e.s.table, []int{0}, []int{7})

	// Two shards desired: shard 1's relay has not started, so nothing is requested.
	res, l, c := pass(2)
	if l.ShardCount != 1 || l.Requested != 0 || c.Reason != v1alpha1.ReasonWaitingForRelays || res.RequeueAfter == 0 ||
		!strings.Contains(c.Message, "waiting for the relays of shards 1 to start") {
		t.Fatalf("without shard 1's relay: layout %+v, condition %+v, %+v", l, c, res)
	}
	// Shard 1's relay stands by; shard 0's still holds bucket 7: requested, draining.
	holdRelayLocks(t, e.s.dbURL, e.s.table, []int{1}, nil)
	res, l, c = pass(2)
	if l.ShardCount != 1 || l.Requested != 2 || c.Reason != v1alpha1.ReasonDraining || res.RequeueAfter == 0 {
		t.Fatalf("while bucket 7 is held: layout %+v, condition %+v", l, c)
	}
	// Desired goes back to 1: the request is withdrawn, the old layout goes on.
	if _, l, c = pass(1); l.ShardCount != 1 || l.Requested != 0 || c.Status != metav1.ConditionTrue {
		t.Fatalf("after going back to 1: layout %+v, condition %+v", l, c)
	}
	// Two again, and the old relay stands down: switched.
	oldRelay()
	holdRelayLocks(t, e.s.dbURL, e.s.table, []int{0}, nil)
	if _, l, c = pass(2); l.ShardCount != 2 || l.Previous != 1 || c.Status != metav1.ConditionTrue || e.s.relay.Status.Shards != 2 {
		t.Fatalf("after the old relay stood down: layout %+v, condition %+v, status.shards %d", l, c, e.s.relay.Status.Shards)
	}
	evs := strings.Join(drain(e.rec), "\n")
	for _, want := range []string{"Resharding from 1 to 2 shards", "ReshardWithdrawn", "Switched the shard layout from 1 to 2"} {
		if !strings.Contains(evs, want) {
			t.Errorf("no event %q among:\n%s", want, evs)
		}
	}
}

// layoutPass runs the layout's steps of a pass (loadLayout, ensureBucketIndex, ensureLayout) with
// shards desired, and returns the layout row and ShardsSettled after it.
func layoutPass(t *testing.T, e *stepEnv, shards int32) (*outboxdb.Layout, *metav1.Condition) {
	t.Helper()
	ctx := context.Background()
	e.s.relay.Status.DesiredShards = shards
	e.s.before = e.s.relay.DeepCopy()
	if err := e.r.loadLayout(ctx, e.s); err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.ensureBucketIndex(ctx, e.s); err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.ensureLayout(ctx, e.s); err != nil {
		t.Fatal(err)
	}
	l, err := outboxdb.ReadLayout(ctx, e.db, e.s.table)
	if err != nil {
		t.Fatal(err)
	}
	return l, meta.FindStatusCondition(e.s.relay.Status.Conditions, v1alpha1.ConditionShardsSettled)
}

// TestEnsureLayoutWaitsForBucketIndex: under one shard the bucket index is dropped; when two
// shards are desired, the change is not requested (the old layout publishes, nothing stands
// down) until the index is built, a partition a pass, and then goes on. PostgreSQL's catalog
// and the layout row are the observers.
func TestEnsureLayoutWaitsForBucketIndex(t *testing.T) {
	ctx := context.Background()
	e := newStepEnvOn(t, time.Now(), pgtest.NewDatabase(t), "outbox", true)
	e.r.Clock = clocktesting.NewFakeClock(time.Now())
	if _, err := outboxdb.EnsurePartitions(ctx, e.db, e.s.table, time.Now().UTC().AddDate(0, 0, -1), time.Now().UTC().AddDate(0, 0, 2)); err != nil {
		t.Fatal(err)
	}
	pass := func(shards int32) (*outboxdb.Layout, *metav1.Condition) { t.Helper(); return layoutPass(t, e, shards) }
	catalog := func() (exists, valid bool) { return bucketIndexInCatalog(t, e.db) }
	pass(1) // the first layout
	pass(1) // one shard: the index goes
	if exists, _ := catalog(); exists {
		t.Fatal("under one shard the catalog still has the bucket index")
	}
	oldRelay := holdRelayLocks(t, e.s.dbURL, e.s.table, []int{0}, []int{7})
	holdRelayLocks(t, e.s.dbURL, e.s.table, []int{1}, nil)
	var parts int
	if err := e.db.QueryRow(`SELECT count(*) FROM pg_inherits WHERE inhparent = 'public.outbox'::regclass`).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < parts; i++ {
		l, c := pass(2)
		if l.ShardCount != 1 || l.Requested != 0 || c.Reason != v1alpha1.ReasonWaitingForIndex || !strings.Contains(c.Message, "building the bucket index") {
			t.Fatalf("pass %d of %d: layout %+v, condition %+v; want nothing requested while the index builds", i, parts, l, c)
		}
		if exists, valid := catalog(); !exists || valid {
			t.Fatalf("pass %d of %d: the index exists %v, valid %v", i, parts, exists, valid)
		}
	}
	// The last partition's part: the index is valid, and the change is requested in that pass.
	if l, c := pass(2); l.Requested != 2 || c.Reason != v1alpha1.ReasonDraining {
		t.Fatalf("index built: layout %+v, condition %+v; want the change requested", l, c)
	}
	if exists, valid := catalog(); !exists || !valid {
		t.Fatalf("index built: exists %v, valid %v", exists, valid)
	}
	oldRelay()
	holdRelayLocks(t, e.s.dbURL, e.s.table, []int{0}, nil)
	if l, c := pass(2); l.ShardCount != 2 || c.Status != metav1.ConditionTrue {
		t.Fatalf("after the old relay stood down: layout %+v, condition %+v", l, c)
	}
}

// TestEnsureLayoutAfterOperatorRestart: an operator that requested a change of layout and went
// away (a restart, a new leader) leaves nothing in memory that the change needs: a reconciler
// with fresh memory, given the OutboxRelay as the API server keeps it, finishes the change once
// the old layout's relay stands down.
func TestEnsureLayoutAfterOperatorRestart(t *testing.T) {
	url := pgtest.NewDatabase(t)
	first := newStepEnvOn(t, time.Now(), url, "outbox", true)
	pass := func(e *stepEnv, shards int32) (*outboxdb.Layout, *metav1.Condition) {
		t.Helper()
		return layoutPass(t, e, shards)
	}
	pass(first, 1)
	oldRelay := holdRelayLocks(t, url, first.s.table, []int{0}, []int{7})
	holdRelayLocks(t, url, first.s.table, []int{1}, nil)
	if l, c := pass(first, 2); l.Requested != 2 || c.Reason != v1alpha1.ReasonDraining {
		t.Fatalf("mid-change: layout %+v, condition %+v", l, c)
	}
	// The operator restarts: a new reconciler, the OutboxRelay as stored.
	second := newStepEnvOn(t, time.Now(), url, "outbox", true)
	second.s.relay = first.s.relay.DeepCopy()
	oldRelay()
	holdRelayLocks(t, url, first.s.table, []int{0}, nil)
	l, c := pass(second, 2)
	if l.ShardCount != 2 || l.Previous != 1 || c.Status != metav1.ConditionTrue || second.s.relay.Status.Shards != 2 {
		t.Fatalf("after the restart: layout %+v, condition %+v, status.shards %d", l, c, second.s.relay.Status.Shards)
	}
	if evs := strings.Join(drain(second.rec), "\n"); !strings.Contains(evs, "Switched the shard layout from 1 to 2") {
		t.Errorf("events after the restart:\n%s", evs)
	}
}
