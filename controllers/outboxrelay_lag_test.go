package controllers

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// TestMeasureLag checks the pending count and the age of the oldest unsent row on a real table.
func TestMeasureLag(t *testing.T) {
	e := newStepEnv(t, time.Now())
	ctx := context.Background()
	pending, lag, err := measureLag(ctx, e.db, e.s.table, contract.TrackRow)
	if err != nil || pending != 0 || lag != 0 {
		t.Fatalf("empty table: %d, %d, %v", pending, lag, err)
	}
	exec := func(q string) {
		t.Helper()
		if _, err := e.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// Sent rows do not count; the oldest unsent row is 90s old; one row sits in the default partition.
	exec(`INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, created_at, sent_at)
		SELECT 'order', 'o-' || i, 'created', '{}', now() - interval '10 minutes', now() FROM generate_series(1, 100) i`)
	exec(`INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		VALUES ('order', 'a', 'created', '{}', now() - interval '90 seconds'),
		       ('order', 'b', 'created', '{}', now() - interval '30 seconds'),
		       ('order', 'c', 'created', '{}', now() + interval '400 days')`)
	pending, lag, err = measureLag(ctx, e.db, e.s.table, contract.TrackRow)
	if err != nil {
		t.Fatal(err)
	}
	if pending != 3 || lag < 90 || lag > 120 {
		t.Errorf("pending %d lag %d, want 3 and about 90", pending, lag)
	}
}

// TestLagQueriesUseThePendingIndex checks the plan: with many sent rows and few unsent ones, the
// backlog statement reads the partial pending index, never the table.
func TestLagQueriesUseThePendingIndex(t *testing.T) {
	e := newStepEnv(t, time.Now())
	ctx := context.Background()
	today := time.Now().UTC().Truncate(24 * time.Hour)
	if _, err := outboxdb.EnsurePartitions(ctx, e.db, e.s.table, today.AddDate(0, 0, -1), today.AddDate(0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
		SELECT 'order', 'o-' || i, 'created', '{"n":1}', CASE WHEN i % 5000 = 0 THEN NULL ELSE now() END
		FROM generate_series(1, 50000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(ctx, `ANALYZE public.outbox`); err != nil {
		t.Fatal(err)
	}
	explain := func() string {
		t.Helper()
		rows, err := e.db.QueryContext(ctx, "EXPLAIN "+outboxdb.BacklogSQL(e.s.table, false), outboxdb.BacklogArgs(nil, PendingCountLimit)...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		return strings.Join(plan, "\n")
	}
	if text := explain(); strings.Contains(text, "Seq Scan on outbox_p") || !strings.Contains(text, "Index") {
		t.Errorf("the backlog statement does not use the pending index:\n%s", text)
	}
	start := time.Now()
	pending, _, err := measureLag(ctx, e.db, e.s.table, contract.TrackRow)
	if err != nil || pending != 10 {
		t.Fatalf("pending %d, %v", pending, err)
	}
	t.Logf("measureLag over 50,000 rows, 10 unsent: %v", time.Since(start))

	// A burst the statistics do not know of yet, after a quiet spell in which nothing was
	// pending: still a walk of the pending index, no sort of the backlog (OpenDB's sessions plan
	// as the relays' do).
	for _, q := range []string{
		`UPDATE public.outbox SET sent_at = now() WHERE sent_at IS NULL`,
		`INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
		 SELECT 'order', 'o-' || i, 'created', '{"n":1}', now() FROM generate_series(1, 150000) i`,
		`VACUUM ANALYZE public.outbox`,
		`INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
		 SELECT 'order', 'b-' || i, 'created', '{"n":1}' FROM generate_series(1, 100000) i`,
	} {
		if _, err := e.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if text := explain(); sortNode.MatchString(text) || !strings.Contains(text, "Index") {
		t.Errorf("after a burst, the backlog statement sorts or misses the pending index:\n%s", text)
	}
}

// sortNode finds a Sort node in EXPLAIN's text output (not a Merge Append's "Sort Key").
var sortNode = regexp.MustCompile(`(?m)^\s*(->\s*)?(Incremental )?Sort\s+\(`)

// TestObserveLagWritesStatusCoarsely checks that pendingEvents and lagSeconds are written on the
// first pass, on a flip of LagWithinTarget and then at most once per LagStatusInterval.
func TestObserveLagWritesStatusCoarsely(t *testing.T) {
	e := newStepEnv(t, time.Now())
	ctx := context.Background()
	relay := e.s.relay
	pass := func() {
		t.Helper()
		e.s.before = relay.DeepCopy()
		res, err := e.r.observeLag(ctx, e.s)
		if err != nil {
			t.Fatal(err)
		}
		if res.RequeueAfter != e.r.LagPollInterval {
			t.Errorf("requeue after %v, want the lag poll interval", res.RequeueAfter)
		}
	}
	insert := func(age string, n int) {
		t.Helper()
		if _, err := e.db.ExecContext(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
			SELECT 'order', 'x', 'created', '{}', now() - $1::interval FROM generate_series(1, $2)`, age, n); err != nil {
			t.Fatal(err)
		}
	}

	pass()
	if ptr.Deref(relay.Status.PendingEvents, -1) != 0 {
		t.Fatalf("first pass: pending %v", relay.Status.PendingEvents)
	}
	checkCondition(t, relay, v1alpha1.ConditionLagWithinTarget, wantCondition{metav1.ConditionTrue, v1alpha1.ReasonLagWithinTarget, ""})

	insert("1 second", 5) // within target: no flip, within the interval: no write
	e.clock.Step(10 * time.Second)
	pass()
	if p := ptr.Deref(relay.Status.PendingEvents, -1); p != 0 {
		t.Errorf("written within the interval: pending %d", p)
	}

	e.clock.Step(time.Minute) // interval passed
	pass()
	if p := ptr.Deref(relay.Status.PendingEvents, -1); p != 5 {
		t.Errorf("after the interval: pending %d, want 5", p)
	}

	// The oldest unsent event (lowest id) is now 5 minutes old, over the 60s target: a flip,
	// written at once.
	if _, err := e.db.ExecContext(ctx, `UPDATE public.outbox SET created_at = now() - interval '5 minutes'`); err != nil {
		t.Fatal(err)
	}
	insert("0 seconds", 1)
	e.clock.Step(time.Second)
	pass()
	if p, l := ptr.Deref(relay.Status.PendingEvents, -1), ptr.Deref(relay.Status.LagSeconds, -1); p != 6 || l < 300 {
		t.Errorf("after the flip: pending %d lag %d", p, l)
	}
	checkCondition(t, relay, v1alpha1.ConditionLagWithinTarget, wantCondition{metav1.ConditionFalse, v1alpha1.ReasonLagExceeded, ""})
	if s := ptr.Deref(relay.Status.ScalableLagSeconds, -1); s < 300 {
		t.Errorf("no failed event: scalable lag %d, want the lag", s)
	}

	// The oldest event failed: it holds back its aggregate, every pending event here, which more
	// shards would not publish: the scalable lag drops to 0, the lag stays.
	if _, err := e.db.ExecContext(ctx, `UPDATE public.outbox SET attempts = 1, error = 'refused' WHERE id = (SELECT min(id) FROM public.outbox)`); err != nil {
		t.Fatal(err)
	}
	e.clock.Step(time.Minute)
	pass()
	if s, l := ptr.Deref(relay.Status.ScalableLagSeconds, -1), ptr.Deref(relay.Status.LagSeconds, -1); s != 0 || l < 300 {
		t.Errorf("behind a failed event: scalable lag %d, lag %d; want 0 and the lag", s, l)
	}
}

// TestMeasureLagEstimatesLargeBacklog: past PendingCountLimit the count is extrapolated from the
// density of the counted ids instead of counting every row.
func TestMeasureLagEstimatesLargeBacklog(t *testing.T) {
	e := newStepEnv(t, time.Now())
	ctx := context.Background()
	n := PendingCountLimit + 10
	if _, err := e.db.ExecContext(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'o-' || i, 'created', '{}' FROM generate_series(1, $1) i`, n); err != nil {
		t.Fatal(err)
	}
	// Five rows in the middle are sent: the counted ids are that much less dense.
	if _, err := e.db.ExecContext(ctx, `UPDATE public.outbox SET sent_at = now()
		WHERE id IN (SELECT id FROM public.outbox ORDER BY id OFFSET 50000 LIMIT 5)`); err != nil {
		t.Fatal(err)
	}
	pending, _, err := measureLag(ctx, e.db, e.s.table, contract.TrackRow)
	if err != nil {
		t.Fatal(err)
	}
	if pending != int64(n-5) {
		t.Errorf("estimate %d, want %d: the counted rows hold every sent one, so the density is exact", pending, n-5)
	}
}

// TestCountParked counts the events a snapshot-tracked table holds in <table>_parked.
func TestCountParked(t *testing.T) {
	e := newStepEnv(t, time.Now())
	ctx := context.Background()
	if n, err := countParked(ctx, e.db, e.s.table); err != nil || n != 0 {
		t.Fatalf("empty: %d, %v", n, err)
	}
	if _, err := e.db.ExecContext(ctx, `INSERT INTO public.outbox_parked (id, created_at, event_id, aggregate_type, aggregate_id, event_type, payload, headers, bucket, attempts, error)
SELECT i, now(), gen_random_uuid(), 'order', 'agg-' || (i % 2), 'created', '{}', '{}', 0, 1, 'broker refused it' FROM generate_series(1, 3) i`); err != nil {
		t.Fatal(err)
	}
	if n, err := countParked(ctx, e.db, e.s.table); err != nil || n != 3 {
		t.Fatalf("three parked: %d, %v", n, err)
	}
}

// TestObserveLagReportsTheOpenReplay: status.replay names the oldest replay not finished, at
// once when it appears or changes state, its progress at most once per LagStatusInterval, and
// goes when it ends.
func TestObserveLagReportsTheOpenReplay(t *testing.T) {
	e := newStepEnv(t, time.Now())
	ctx := context.Background()
	relay := e.s.relay
	pass := func() {
		t.Helper()
		e.s.before = relay.DeepCopy()
		if _, err := e.r.observeLag(ctx, e.s); err != nil {
			t.Fatal(err)
		}
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := e.db.ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
		SELECT 'order', 'x', 'created', '{}', now() FROM generate_series(1, 10)`)
	pass()
	if relay.Status.Replay != nil {
		t.Fatalf("no replay, status.replay %+v", relay.Status.Replay)
	}
	pool, err := pgxpool.New(ctx, e.s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rp, _, err := outboxdb.RequestReplay(ctx, pool, e.s.table, outboxdb.ReplayRequest{From: outboxdb.Bound{ID: 1}})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Step(time.Second)
	pass()
	if got := relay.Status.Replay; got == nil || *got != (v1alpha1.ReplayStatus{ID: rp.ID, State: "pending", Total: 10}) {
		t.Fatalf("a replay requested: status.replay %+v", got)
	}
	exec(`UPDATE public.outbox_replays SET state = 'running', replayed = 4`)
	e.clock.Step(time.Second)
	pass()
	if got := relay.Status.Replay; got == nil || got.State != "running" || got.Replayed != 4 {
		t.Fatalf("running: status.replay %+v", got)
	}
	exec(`UPDATE public.outbox_replays SET replayed = 8`)
	e.clock.Step(time.Second)
	pass()
	if got := relay.Status.Replay; got.Replayed != 4 {
		t.Fatalf("progress written within the interval: %+v", got)
	}
	e.clock.Step(time.Minute)
	pass()
	if got := relay.Status.Replay; got.Replayed != 8 {
		t.Fatalf("progress after the interval: %+v", got)
	}
	exec(`UPDATE public.outbox_replays SET state = 'done', replayed = 10`)
	e.clock.Step(time.Second)
	pass()
	if relay.Status.Replay != nil {
		t.Fatalf("done: status.replay %+v", relay.Status.Replay)
	}
}
