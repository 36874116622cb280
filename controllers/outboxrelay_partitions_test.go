package controllers

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestPartitionWindowAndNextBoundary(t *testing.T) {
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	berlin := time.FixedZone("CET", 3600)
	tests := []struct {
		name      string
		now       time.Time
		premake   int32
		from, to  string
		untilNext time.Duration
	}{
		{"one minute before midnight", utc("2026-03-14T23:59:00Z"), 3, "2026-03-14", "2026-03-17", time.Minute + boundarySlack},
		{"last nanosecond of the day", utc("2026-03-14T23:59:59.999999999Z"), 3, "2026-03-14", "2026-03-17", time.Nanosecond + boundarySlack},
		{"midnight", utc("2026-03-15T00:00:00Z"), 3, "2026-03-15", "2026-03-18", 24*time.Hour + boundarySlack},
		{"noon", utc("2026-03-15T12:00:00Z"), 3, "2026-03-15", "2026-03-18", 12*time.Hour + boundarySlack},
		{"no premade days", utc("2026-03-15T00:00:00Z"), 0, "2026-03-15", "2026-03-15", 24*time.Hour + boundarySlack},
		{"local time after midnight is still the UTC day before", time.Date(2026, 3, 15, 0, 30, 0, 0, berlin), 1, "2026-03-14", "2026-03-15", 30*time.Minute + boundarySlack},
		{"month and leap day", utc("2028-02-28T23:59:00Z"), 2, "2028-02-28", "2028-03-01", time.Minute + boundarySlack},
		{"year end", utc("2026-12-31T23:59:00Z"), 30, "2026-12-31", "2027-01-30", time.Minute + boundarySlack},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			from, to := partitionWindow(tc.now, tc.premake)
			if got := from.Format(time.DateOnly); got != tc.from {
				t.Errorf("from %s, want %s", got, tc.from)
			}
			if got := to.Format(time.DateOnly); got != tc.to {
				t.Errorf("to %s, want %s", got, tc.to)
			}
			if from.Location() != time.UTC || from.Hour() != 0 {
				t.Errorf("from %v is not UTC midnight", from)
			}
			if got := untilNextDay(tc.now); got != tc.untilNext {
				t.Errorf("untilNextDay %v, want %v", got, tc.untilNext)
			}
		})
	}
}

func TestObservePartitions(t *testing.T) {
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	d := func(s string) time.Time { v, _ := time.Parse(time.DateOnly, s); return v }
	parts := []outboxdb.Partition{
		{Name: "outbox_p20261120", Day: d("2026-11-20"), HasPending: true},  // ended 11-21 00:00, 8d10h ago
		{Name: "outbox_p20261121", Day: d("2026-11-21"), HasPending: false}, // droppable, not kept
		{Name: "outbox_p20261122", Day: d("2026-11-22"), HasPending: true},  // ended 11-23: 6d10h ago, within 7d
		{Name: "outbox_p20261202", Day: d("2026-12-02")},
		{Name: "outbox_default", Default: true, HasPending: true},
	}
	o := observePartitions(parts, now, 7*24*time.Hour)
	if o.first != "2026-11-20" || o.last != "2026-12-02" || o.count != 4 {
		t.Errorf("first %s last %s count %d", o.first, o.last, o.count)
	}
	if !slices.Equal(o.kept, []string{"outbox_p20261120"}) {
		t.Errorf("kept %v", o.kept)
	}
}

// stepEnv is a reconciler and a scope on a migrated throwaway database, for calling steps directly.
type stepEnv struct {
	r     *OutboxRelayReconciler
	s     *scope
	db    *sql.DB
	clock *clocktesting.FakeClock
	rec   *events.FakeRecorder
}

func newStepEnv(t *testing.T, now time.Time) *stepEnv {
	t.Helper()
	return newStepEnvOn(t, now, pgtest.NewDatabase(t), "public.outbox", true)
}

// newStepEnvOn is a step environment on the database at url, migrated when migrate is set.
func newStepEnvOn(t *testing.T, now time.Time, url, table string, migrate bool) *stepEnv {
	t.Helper()
	ctx := context.Background()
	tb, err := outboxdb.ParseTable(qualifiedTable(table))
	if err != nil {
		t.Fatal(err)
	}
	var db *sql.DB
	if migrate {
		db, err = OpenDB(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
			t.Fatal(err)
		}
	}
	clk := clocktesting.NewFakeClock(now)
	rec := events.NewFakeRecorder(100)
	r := &OutboxRelayReconciler{Clock: clk, Recorder: rec, OpenDB: OpenDB,
		LagPollInterval: time.Second, LagStatusInterval: time.Minute}
	t.Cleanup(r.relays.closeAll)
	relay := testRelay(func(r *v1alpha1.OutboxRelay) { r.Spec.Database.Table = table })
	return &stepEnv{r: r, db: db, clock: clk, rec: rec,
		s: &scope{relay: relay, before: relay.DeepCopy(), table: tb, dbURL: url, db: db, secretValues: map[string][]byte{}}}
}

func drain(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func partitionNames(t *testing.T, db *sql.DB) []string {
	t.Helper()
	parts, err := outboxdb.ListPartitions(context.Background(), db, outboxdb.MustParseTable("public.outbox"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range parts {
		if !p.Default {
			names = append(names, p.Name)
		}
	}
	return names
}

func partName(d time.Time) string { return "outbox_p" + d.Format("20060102") }

// TestPartitionsAcrossMidnight runs the partitions step at 23:59 and 00:00 UTC with a fake clock.
func TestPartitionsAcrossMidnight(t *testing.T) {
	today := utcDay(time.Now())
	e := newStepEnv(t, today.Add(23*time.Hour+59*time.Minute))
	ctx := context.Background()

	res, err := e.r.ensurePartitions(ctx, e.s)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{partName(today), partName(today.AddDate(0, 0, 1)), partName(today.AddDate(0, 0, 2)), partName(today.AddDate(0, 0, 3))}
	if got := partitionNames(t, e.db); !slices.Equal(got, want) {
		t.Fatalf("partitions at 23:59 = %v, want %v", got, want)
	}
	if res.RequeueAfter != time.Minute+boundarySlack {
		t.Errorf("requeue after %v at 23:59, want %v", res.RequeueAfter, time.Minute+boundarySlack)
	}
	checkCondition(t, e.s.relay, v1alpha1.ConditionPartitionsReady,
		wantCondition{metav1.ConditionTrue, v1alpha1.ReasonPartitionsReady, today.AddDate(0, 0, 3).Format(time.DateOnly)})
	if st := e.s.relay.Status.Partitions; st == nil || st.Oldest != today.Format(time.DateOnly) || st.Count != 4 {
		t.Errorf("status.partitions %+v", st)
	}
	evs := drain(e.rec)
	if len(evs) != 1 || !strings.Contains(evs[0], "CreatedPartitions") || !strings.Contains(evs[0], want[3]) {
		t.Errorf("events %v", evs)
	}

	// The same minute again creates nothing and says nothing.
	if _, err := e.r.ensurePartitions(ctx, e.s); err != nil {
		t.Fatal(err)
	}
	if evs := drain(e.rec); len(evs) != 0 {
		t.Errorf("idle pass emitted %v", evs)
	}

	e.clock.SetTime(today.Add(24 * time.Hour)) // 00:00:00 UTC
	res, err = e.r.ensurePartitions(ctx, e.s)
	if err != nil {
		t.Fatal(err)
	}
	newDay := partName(today.AddDate(0, 0, 4))
	if got := partitionNames(t, e.db); len(got) != 5 || got[4] != newDay {
		t.Fatalf("partitions at 00:00 = %v, want %s added", got, newDay)
	}
	if res.RequeueAfter != 24*time.Hour+boundarySlack {
		t.Errorf("requeue after %v at 00:00, want %v", res.RequeueAfter, 24*time.Hour+boundarySlack)
	}
	if evs := drain(e.rec); len(evs) != 1 || !strings.Contains(evs[0], newDay) {
		t.Errorf("events at midnight %v", evs)
	}
}

// TestPartitionWithUnsentRowIsNeverDropped puts one unsent row in a partition far past retention
// and checks that passes drop its sent neighbours but keep it, until the row is sent.
func TestPartitionWithUnsentRowIsNeverDropped(t *testing.T) {
	now := time.Now()
	e := newStepEnv(t, now)
	ctx := context.Background()
	table := e.s.table
	old := utcDay(now).AddDate(0, 0, -20)
	if _, err := outboxdb.EnsurePartitions(ctx, e.db, table, old, old.AddDate(0, 0, 2)); err != nil {
		t.Fatal(err)
	}
	insert := `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, created_at, sent_at) VALUES ($1, $2, 'created', '{}', $3, $4)`
	if _, err := e.db.ExecContext(ctx, insert, "order", "o-1", old.Add(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(ctx, insert, "order", "o-2", old.AddDate(0, 0, 1).Add(time.Hour), old.AddDate(0, 0, 1).Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	kept, sentDay, emptyDay := partName(old), partName(old.AddDate(0, 0, 1)), partName(old.AddDate(0, 0, 2))

	for pass := 1; pass <= 2; pass++ {
		if pass > 1 {
			e.clock.Step(partitionRecheck) // upkeep runs again on its slow timer
		}
		if _, err := e.r.ensurePartitions(ctx, e.s); err != nil {
			t.Fatal(err)
		}
		names := partitionNames(t, e.db)
		if !slices.Contains(names, kept) {
			t.Fatalf("pass %d dropped %s, which holds an unsent row", pass, kept)
		}
		if slices.Contains(names, sentDay) || slices.Contains(names, emptyDay) {
			t.Fatalf("pass %d kept sent partitions past retention: %v", pass, names)
		}
		checkCondition(t, e.s.relay, v1alpha1.ConditionPartitionsReady,
			wantCondition{metav1.ConditionFalse, v1alpha1.ReasonRetentionBlocked, kept})
		var warnings int
		for _, ev := range drain(e.rec) {
			if strings.HasPrefix(ev, "Warning "+v1alpha1.ReasonRetentionBlocked) {
				warnings++
			}
		}
		if want := map[int]int{1: 1, 2: 0}[pass]; warnings != want {
			t.Errorf("pass %d: %d RetentionBlocked warnings, want %d", pass, warnings, want)
		}
	}
	var n int
	if err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM public.outbox WHERE aggregate_id = 'o-1' AND sent_at IS NULL`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the unsent row: count %d, err %v", n, err)
	}

	// Once the row is sent, the partition goes.
	if _, err := e.db.ExecContext(ctx, `UPDATE public.outbox SET sent_at = now() WHERE aggregate_id = 'o-1'`); err != nil {
		t.Fatal(err)
	}
	e.clock.Step(partitionRecheck)
	if _, err := e.r.ensurePartitions(ctx, e.s); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(partitionNames(t, e.db), kept) {
		t.Fatal("sent partition past retention kept")
	}
	checkCondition(t, e.s.relay, v1alpha1.ConditionPartitionsReady, wantCondition{metav1.ConditionTrue, v1alpha1.ReasonPartitionsReady, ""})
}

// TestPartitionFailureDoesNotStopTheOtherSteps holds the outbox's SHARE UPDATE EXCLUSIVE lock (as
// a long maintenance command would), which the attach of a new day's partition needs: the pass
// waits for it (seen in pg_locks, behind the holder), gives up within its lock timeout while the
// holder still holds it, says so in PartitionsReady and a Warning event, asks to be retried soon,
// and the steps after it still run.
func TestPartitionFailureDoesNotStopTheOtherSteps(t *testing.T) {
	now := time.Now()
	e := newStepEnv(t, now)
	ctx := context.Background()
	if _, err := e.r.ensurePartitions(ctx, e.s); err != nil {
		t.Fatal(err)
	}
	drain(e.rec)
	e.clock.SetTime(now.Add(24 * time.Hour)) // a new day to create
	holder, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback() }()
	if _, err := holder.ExecContext(ctx, `LOCK TABLE public.outbox IN SHARE UPDATE EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	var holderPID int
	if err := holder.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&holderPID); err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		behind []pgtest.LockWait // the pass's waits for the holder's lock
	)
	watchDB, err := sql.Open("pgx", e.s.dbURL) // e.db's 2 connections are the holder's and the pass's
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = watchDB.Close() })
	stopWatch := pgtest.WatchLocks(ctx, watchDB, 2*time.Millisecond, func(ws []pgtest.LockWait) {
		mu.Lock()
		defer mu.Unlock()
		for _, w := range ws {
			if w.BlockedBy(holderPID) && w.Relation == "outbox" {
				behind = append(behind, w)
			}
		}
	})
	t.Cleanup(func() { _ = stopWatch() })
	ran := false
	after := func(context.Context, *scope) (Result, error) { ran = true; return Result{}, nil }
	// A pass that waited for the holder would end at this deadline, canceled rather than timed out
	// (the condition below says which); the holder lets go only after the pass.
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := e.r.runSteps(pctx, e.s, e.r.ensurePartitions, after)
	if err != nil {
		t.Fatalf("a failed partition pass stopped the reconcile: %v", err)
	}
	if err := stopWatch(); err != nil {
		t.Fatal(err)
	}
	longest := -1.0
	for _, w := range behind {
		longest = max(longest, w.Waited)
	}
	if len(behind) == 0 {
		t.Error("the pass was never seen waiting for the holder's lock")
	} else if !strings.Contains(behind[0].Query, "create_partitions") {
		t.Errorf("waiting behind the holder: %s, want the partition pass", behind[0])
	}
	// As PostgreSQL dates the wait (pg_locks.waitstart, 14 and later; a lower bound): the pass's
	// lock timeout is 1 s.
	if longest > 5 {
		t.Errorf("the pass waited %.3f s for the holder's lock", longest)
	}
	t.Logf("the pass waited for the holder's lock (seen in %d samples, at most %.3f s by PostgreSQL's clock) and gave up", len(behind), longest)
	if !ran {
		t.Error("the step after a failed partition pass did not run")
	}
	if res.RequeueAfter != partitionRetry {
		t.Errorf("requeue after %v, want %v", res.RequeueAfter, partitionRetry)
	}
	checkCondition(t, e.s.relay, v1alpha1.ConditionPartitionsReady,
		wantCondition{metav1.ConditionFalse, v1alpha1.ReasonPartitionMaintenanceFailed, "lock timeout"})
	if evs := drain(e.rec); len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+v1alpha1.ReasonPartitionMaintenanceFailed) {
		t.Errorf("events %v", evs)
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	// Until the retry is due, the passes leave the failure as it was; then it succeeds.
	if res, err := e.r.ensurePartitions(ctx, e.s); err != nil || res.RequeueAfter != partitionRetry {
		t.Fatalf("a pass before the retry: %v, requeue after %s", err, res.RequeueAfter)
	}
	checkCondition(t, e.s.relay, v1alpha1.ConditionPartitionsReady,
		wantCondition{metav1.ConditionFalse, v1alpha1.ReasonPartitionMaintenanceFailed, "lock timeout"})
	e.clock.Step(partitionRetry)
	if _, err := e.r.ensurePartitions(ctx, e.s); err != nil {
		t.Fatal(err)
	}
	checkCondition(t, e.s.relay, v1alpha1.ConditionPartitionsReady, wantCondition{metav1.ConditionTrue, v1alpha1.ReasonPartitionsReady, ""})
}

// TestPartitionDropWaitsForLongTransaction: a transaction that appended an event and stays open
// keeps a partition past retention from being dropped (the drop would need the table's ACCESS
// EXCLUSIVE lock and queue every insert behind it); the pass keeps it, says so in a Normal
// event, and asks to be retried soon; once the transaction ended the partition goes.
func TestPartitionDropWaitsForLongTransaction(t *testing.T) {
	now := time.Now()
	e := newStepEnv(t, now)
	ctx := context.Background()
	old := utcDay(now).AddDate(0, 0, -20)
	if _, err := outboxdb.EnsurePartitions(ctx, e.db, e.s.table, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := outboxdb.EnsurePartitions(ctx, e.db, e.s.table, utcDay(now), utcDay(now).AddDate(0, 0, int(premakeDays(e.s.relay)))); err != nil {
		t.Fatal(err)
	}
	long, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback() }()
	if _, err := long.ExecContext(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o-1', 'created', '{}')`); err != nil {
		t.Fatal(err)
	}
	res, err := e.r.ensurePartitions(ctx, e.s)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(partitionNames(t, e.db), partName(old)) {
		t.Fatal("the partition was dropped while a transaction used the table")
	}
	if res.RequeueAfter != partitionRetry {
		t.Errorf("requeue after %v, want %v", res.RequeueAfter, partitionRetry)
	}
	if evs := drain(e.rec); len(evs) != 1 || !strings.Contains(evs[0], "PartitionDropDeferred") || !strings.Contains(evs[0], partName(old)) {
		t.Errorf("events %v", evs)
	}
	if err := long.Commit(); err != nil {
		t.Fatal(err)
	}
	e.clock.Step(partitionRetry)
	if _, err := e.r.ensurePartitions(ctx, e.s); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(partitionNames(t, e.db), partName(old)) {
		t.Fatal("the partition past retention was kept after the transaction ended")
	}
}
