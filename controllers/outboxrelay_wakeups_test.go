package controllers

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// ensureWakeups matches the table's insert trigger to spec.publish.notify, as the database shows
// it, and records each change once.
func TestEnsureWakeups(t *testing.T) {
	e := newStepEnv(t, time.Now())
	ctx := context.Background()
	notifies := func() bool {
		t.Helper()
		on, err := outboxdb.Notifies(ctx, e.db, e.s.table)
		if err != nil {
			t.Fatal(err)
		}
		return on
	}
	// Behind an open insert the change gives up after tableLockWait, says so and is retried;
	// the table stays as it was and the pass goes on.
	blocker := openInsert(t, e)
	e.s.relay.Spec.Publish.Notify = ptr.To(false)
	expectRetried(t, e, e.r.ensureWakeups, "WakeupsChangeFailed")
	if err := blocker.Rollback(); err != nil {
		t.Fatal(err)
	}
	if !notifies() {
		t.Fatal("a change that failed left the table without its trigger")
	}

	for i, c := range []struct {
		notify *bool
		want   bool
		event  string // the event recorded, "" for none
	}{
		{ptr.To(true), true, ""},                   // a new table has its trigger (the migrations create it)
		{nil, false, "dropped the insert trigger"}, // the default: relays poll
		{ptr.To(false), false, ""},
		{ptr.To(true), true, "created the insert trigger"},
		{nil, false, "dropped the insert trigger"},
	} {
		e.s.relay.Spec.Publish.Notify = c.notify
		res, err := e.r.ensureWakeups(ctx, e.s)
		if err != nil || res.RequeueAfter != 0 {
			t.Fatalf("step %d: %v, requeue after %s", i, err, res.RequeueAfter)
		}
		if got := notifies(); got != c.want {
			t.Fatalf("step %d (notify %v): the table notifies %v, want %v", i, c.notify, got, c.want)
		}
		expectEvent(t, i, drain(e.rec), c.event)
	}
}

// ensureInserts matches the table's lock trigger to spec.writers.plainInserts, as pg_trigger
// shows it; unset, it leaves the table as it is, even a trigger set by hand.
func TestEnsureInserts(t *testing.T) {
	e := newStepEnv(t, time.Now())
	ctx := context.Background()
	locked := func() bool {
		t.Helper()
		var on bool
		if err := e.db.QueryRow(`SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'public.outbox'::regclass AND tgname = 'outbox_lock_insert')`).Scan(&on); err != nil {
			t.Fatal(err)
		}
		return on
	}
	for i, c := range []struct {
		mode   v1alpha1.PlainInserts
		byHand *bool // set by hand before the pass
		want   bool
		event  string
	}{
		{"", nil, false, ""},
		{"", ptr.To(true), true, ""}, // unset: a trigger set by hand stays
		{v1alpha1.InsertsUnlocked, nil, false, "dropped the lock trigger"},
		{v1alpha1.InsertsLocked, nil, true, "created the lock trigger"},
		{v1alpha1.InsertsLocked, nil, true, ""},
	} {
		if c.byHand != nil {
			if _, err := outboxdb.SetLockedInserts(ctx, e.db, e.s.table, *c.byHand, time.Second); err != nil {
				t.Fatal(err)
			}
		}
		e.s.relay.Spec.Writers.PlainInserts = c.mode
		res, err := e.r.ensureInserts(ctx, e.s)
		if err != nil || res.RequeueAfter != 0 {
			t.Fatalf("step %d: %v, requeue after %s", i, err, res.RequeueAfter)
		}
		if got := locked(); got != c.want {
			t.Fatalf("step %d (%q): the lock trigger exists %v, want %v", i, c.mode, got, c.want)
		}
		expectEvent(t, i, drain(e.rec), c.event)
	}
	// Behind an open insert the change gives up, says so and is retried; the table is as it was.
	openInsert(t, e)
	e.s.relay.Spec.Writers.PlainInserts = v1alpha1.InsertsUnlocked
	expectRetried(t, e, e.r.ensureInserts, "PlainInsertsChangeFailed")
	if !locked() {
		t.Error("a change that failed changed the table")
	}
}

// ensureChecks matches the table's four CHECKs to spec.writers.checks, as pg_constraint shows
// them (and as an insert PostgreSQL refuses or accepts); unset, it leaves an existing table as it
// is, even CHECKs dropped or added by hand, and drops them from a table the pass made
// (outboxdb.NewTableChecks).
func TestEnsureChecks(t *testing.T) {
	e := newStepEnv(t, time.Now())
	ctx := context.Background()
	checks := func() int {
		t.Helper()
		var n int
		if err := e.db.QueryRow(`SELECT count(*) FROM pg_constraint WHERE conrelid = 'public.outbox'::regclass AND contype = 'c'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	refused := func() bool {
		t.Helper()
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		_, err = tx.ExecContext(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '', 'OrderCreated', '{}')`)
		return err != nil
	}
	for i, c := range []struct {
		mode     v1alpha1.Checks
		newTable bool
		byHand   *bool // set by hand before the pass
		want     int
		event    string
	}{
		{"", false, nil, 4, ""},
		{"", false, ptr.To(false), 0, ""}, // unset: CHECKs dropped by hand stay dropped
		{v1alpha1.ChecksTable, false, nil, 4, "added the CHECKs back"},
		{"", true, nil, 0, "set to Relay (a new table's default; spec.writers.checks is unset): dropped the CHECKs"},
		{"", false, ptr.To(true), 4, ""}, // an existing table: CHECKs added by hand stay
		{v1alpha1.ChecksTable, true, nil, 4, ""},
		{v1alpha1.ChecksRelay, false, nil, 0, "dropped the CHECKs"},
		{v1alpha1.ChecksRelay, false, nil, 0, ""},
	} {
		if c.byHand != nil {
			if _, err := outboxdb.SetChecks(ctx, e.db, e.s.table, *c.byHand, time.Second); err != nil {
				t.Fatal(err)
			}
		}
		e.s.relay.Spec.Writers.Checks, e.s.newTable = c.mode, c.newTable
		res, err := e.r.ensureChecks(ctx, e.s)
		if err != nil || res.RequeueAfter != 0 {
			t.Fatalf("step %d: %v, requeue after %s", i, err, res.RequeueAfter)
		}
		if got := checks(); got != c.want {
			t.Fatalf("step %d (%q): %d CHECKs, want %d", i, c.mode, got, c.want)
		}
		if got := refused(); got != (c.want == 4) {
			t.Fatalf("step %d (%q): an empty aggregate id refused %v", i, c.mode, got)
		}
		expectEvent(t, i, drain(e.rec), c.event)
	}
	// Behind an open insert the change gives up, says so and is retried; the table is as it was.
	openInsert(t, e)
	e.s.relay.Spec.Writers.Checks, e.s.newTable = v1alpha1.ChecksTable, false
	expectRetried(t, e, e.r.ensureChecks, "ChecksChangeFailed")
	if checks() != 0 {
		t.Error("a change that failed changed the table")
	}
}

// openInsert begins a transaction that appends an event and stays open: a change of the table's
// DDL waits behind it. It is rolled back when the test ends, or earlier by the caller.
func openInsert(t *testing.T, e *stepEnv) *sql.Tx {
	t.Helper()
	tx, err := e.db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	if _, err := tx.Exec(`INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', 'o-1', 'OrderCreated', '{}')`); err != nil {
		t.Fatal(err)
	}
	return tx
}

// expectRetried runs step behind an open insert: it must give up after tableLockWait, record one
// event with the failed reason and ask to be tried again after tableChangeRetry (the pass goes on).
func expectRetried(t *testing.T, e *stepEnv, step func(context.Context, *scope) (Result, error), failed string) {
	t.Helper()
	res, err := step(context.Background(), e.s)
	if err != nil || res.RequeueAfter != tableChangeRetry {
		t.Fatalf("behind an open insert: %v, requeue after %s, want %s", err, res.RequeueAfter, tableChangeRetry)
	}
	if evs := drain(e.rec); len(evs) != 1 || !strings.Contains(evs[0], failed) {
		t.Errorf("behind an open insert: events %q, want one %s", evs, failed)
	}
}

// expectEvent checks the events of step i: none when want is "", else one that says want.
func expectEvent(t *testing.T, i int, evs []string, want string) {
	t.Helper()
	switch {
	case want == "" && len(evs) > 0:
		t.Errorf("step %d: events %q, want none", i, evs)
	case want != "" && (len(evs) != 1 || !strings.Contains(evs[0], want)):
		t.Errorf("step %d: events %q, want one saying %q", i, evs, want)
	}
}

// planChecks: a set spec.writers.checks is matched, on any table; unset, a table the pass made
// gets outboxdb.NewTableChecks and an existing one is left as it is.
func TestPlanChecks(t *testing.T) {
	for _, c := range []struct {
		mode     v1alpha1.Checks
		newTable bool
		want     checksPlan
	}{
		{"", false, checksPlan{}},
		{"", true, checksPlan{act: true, want: outboxdb.NewTableChecks, mode: "Relay (a new table's default; spec.writers.checks is unset)"}},
		{v1alpha1.ChecksTable, false, checksPlan{act: true, want: true, mode: "Table"}},
		{v1alpha1.ChecksTable, true, checksPlan{act: true, want: true, mode: "Table"}},
		{v1alpha1.ChecksRelay, false, checksPlan{act: true, want: false, mode: "Relay"}},
		{v1alpha1.ChecksRelay, true, checksPlan{act: true, want: false, mode: "Relay"}},
	} {
		if got := planChecks(c.mode, c.newTable); got != c.want {
			t.Errorf("planChecks(%q, new table %v) = %+v, want %+v", c.mode, c.newTable, got, c.want)
		}
	}
}
