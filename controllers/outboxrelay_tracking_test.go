package controllers

import (
	"fmt"
	"slices"
	"testing"
	"time"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestPlanTracking(t *testing.T) {
	const row, snap = v1alpha1.TrackRow, v1alpha1.TrackSnapshot
	for name, c := range map[string]struct {
		spec, recorded v1alpha1.Tracking
		want           trackingPlan
	}{
		"unset, nothing recorded: the table decides": {"", "", trackingPlan{readTable: true}},
		"unset, recorded Row (resolved before)":      {"", row, trackingPlan{mode: row}},
		"unset, recorded Snapshot":                   {"", snap, trackingPlan{mode: snap}},
		"Row":                                        {row, "", trackingPlan{mode: row}},
		"Row, recorded Row":                          {row, row, trackingPlan{mode: row}},
		"Snapshot":                                   {snap, "", trackingPlan{mode: snap}},
		"Row to Snapshot":                            {snap, row, trackingPlan{mode: snap}},
		"Snapshot recorded, spec asks Row: refused":  {row, snap, trackingPlan{mode: snap, refused: true}},
	} {
		r := testRelay(func(r *v1alpha1.OutboxRelay) {
			r.Spec.Publish.Tracking, r.Status.Tracking = c.spec, c.recorded
		})
		if got := planTracking(r); got != c.want {
			t.Errorf("%s: %+v, want %+v", name, got, c.want)
		}
	}
}

// TestTrackingResolvedFromTheTable: an OutboxRelay that leaves spec.publish.tracking unset gets
// Snapshot on a table no relay has published from, and Row on a table whose events a row relay
// marked sent (an OutboxRelay of an earlier release, whose default was Row, on its own table);
// the operator records the mode in status.tracking, says why in an Event, and runs the relays in
// it. The record holds when the table's state changes afterwards (retention deleting every sent
// row), and a spec that asks to go back from Snapshot to Row is refused, the relays keeping
// Snapshot. The database is the observer of what the table says; the Deployments show the mode
// the relays are told.
func TestTrackingResolvedFromTheTable(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	ns := s.env.CreateNamespace(t, "tracking")
	waitTracking := func(name string, want v1alpha1.Tracking, generation int64) *v1alpha1.OutboxRelay {
		t.Helper()
		var relay *v1alpha1.OutboxRelay
		eventually(t, 60*time.Second, func() error {
			relay = s.getRelay(t, ns, name)
			if relay.Status.Tracking != want || relay.Status.ObservedGeneration < generation {
				return fmt.Errorf("status.tracking %q at generation %d, want %q at %d", relay.Status.Tracking, relay.Status.ObservedGeneration, want, generation)
			}
			return nil
		})
		return relay
	}
	wantArg := func(name, arg string) {
		t.Helper()
		eventually(t, 30*time.Second, func() error {
			if a := args(s.deployment(t, ns, DeploymentName(name, 0))); !slices.Contains(a, arg) {
				return fmt.Errorf("args %q lack %q", a, arg)
			}
			return nil
		})
	}

	// A new table: Snapshot.
	freshURL := pgtest.NewDatabase(t)
	s.createSecret(t, ns, "fresh-db", map[string]string{"url": freshURL})
	s.createRelay(t, newRelay(ns, "fresh", "fresh-db"))
	if r := s.getRelay(t, ns, "fresh"); r.Spec.Publish.Tracking != "" {
		t.Fatalf("the API server defaulted spec.publish.tracking to %q", r.Spec.Publish.Tracking)
	}
	fresh := waitTracking("fresh", v1alpha1.TrackSnapshot, 1)
	wantArg("fresh", "--tracking=snapshot")
	s.waitEvents(t, ns, "fresh", "Normal TrackingResolved spec.publish.tracking is unset: the relays of table public.outbox run Snapshot tracking (no relay has published")
	// The table the operator made has no CHECKs (spec.writers.checks unset: outboxdb.NewTableChecks);
	// the one made before it (below) keeps its four.
	s.waitEvents(t, ns, "fresh", "Normal ChecksChanged The checks of table public.outbox set to Relay (a new table's default")
	countChecks := func(url string) int {
		t.Helper()
		var n int
		if err := openTestDB(t, url).QueryRowContext(ctx, `SELECT count(*) FROM pg_constraint WHERE conrelid = 'public.outbox'::regclass AND contype = 'c'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := countChecks(freshURL); n != 0 {
		t.Errorf("the table the operator made has %d CHECKs, want none", n)
	}

	// A table a row relay published from: Row.
	rowURL := pgtest.NewDatabase(t)
	rowDB := openTestDB(t, rowURL)
	tb := outboxdb.Table{Schema: "public", Name: "outbox"}
	if _, err := outboxdb.Apply(ctx, rowDB, tb); err != nil {
		t.Fatal(err)
	}
	if _, err := rowDB.ExecContext(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
VALUES ('order', 'o-1', 'E', '{}', now()), ('order', 'o-2', 'E', '{}', NULL)`); err != nil {
		t.Fatal(err)
	}
	s.createSecret(t, ns, "row-db", map[string]string{"url": rowURL})
	s.createRelay(t, newRelay(ns, "legacy", "row-db"))
	waitTracking("legacy", v1alpha1.TrackRow, 1)
	wantArg("legacy", "--tracking=row")
	s.waitEvents(t, ns, "legacy", "Normal TrackingResolved spec.publish.tracking is unset: the relays of table public.outbox run Row tracking (a row relay published")
	if n := countChecks(rowURL); n != 4 {
		t.Errorf("a table made before its OutboxRelay has %d CHECKs, want its 4", n)
	}

	// The record holds: every sent row deleted (retention), then a change of the spec.
	if _, err := rowDB.ExecContext(ctx, `DELETE FROM outbox WHERE sent_at IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	legacy := s.getRelay(t, ns, "legacy")
	legacy.Spec.LagTarget = 120
	if err := s.c.Update(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	waitTracking("legacy", v1alpha1.TrackRow, legacy.Generation)
	wantArg("legacy", "--tracking=row")

	// Back from Snapshot to Row: refused, the relays keep Snapshot.
	fresh.Spec.Publish.Tracking = v1alpha1.TrackRow
	if err := s.c.Update(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	waitTracking("fresh", v1alpha1.TrackSnapshot, fresh.Generation)
	wantArg("fresh", "--tracking=snapshot")
	s.waitEvents(t, ns, "fresh", "Warning TrackingCannotGoBack spec.publish.tracking asks for Row")
	if r := s.getRelay(t, ns, "fresh"); r.Status.ObservedGeneration != fresh.Generation {
		t.Errorf("observedGeneration %d, want %d", r.Status.ObservedGeneration, fresh.Generation)
	}
}
