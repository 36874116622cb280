package controllers

import (
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestPlanDrain(t *testing.T) {
	for name, c := range map[string]struct {
		pending          int64
		known            bool
		elapsed, timeout time.Duration
		want             drainPlan
	}{
		"nothing pending":        {0, true, time.Second, time.Minute, drainDone},
		"nothing pending, late":  {0, true, 2 * time.Minute, time.Minute, drainDone},
		"pending":                {5, true, time.Second, time.Minute, drainWait},
		"pending at the timeout": {5, true, time.Minute, time.Minute, drainTimedOut},
		"unknown":                {0, false, time.Second, time.Minute, drainWait},
		"unknown at the timeout": {0, false, time.Minute, time.Minute, drainTimedOut},
	} {
		t.Run(name, func(t *testing.T) {
			if got := planDrain(c.pending, c.known, c.elapsed, c.timeout); got != c.want {
				t.Errorf("planDrain = %d, want %d", got, c.want)
			}
		})
	}
}

// Deleting an OutboxRelay under spec.deletion.policy Drain: the finalizer holds it, with its
// relay Deployment, while events are pending (status says how many), and lets it go once the
// database shows none; a second one whose events stay pending goes at its drain timeout, with
// an Event that says how many were left. The default, Orphan, has no finalizer, and switching
// to it removes the finalizer.
func TestDeletionDrain(t *testing.T) {
	s := sharedSuite(t)
	ns := s.env.CreateNamespace(t, "drain")
	urls := map[string]string{"orders": pgtest.NewDatabase(t), "billing": pgtest.NewDatabase(t), "plain": pgtest.NewDatabase(t)}
	for name, url := range urls {
		s.createSecret(t, ns, name, map[string]string{"url": url})
	}
	drain := func(timeout time.Duration) func(*v1alpha1.OutboxRelay) {
		return func(r *v1alpha1.OutboxRelay) {
			r.Spec.Publish.Tracking = v1alpha1.TrackRow
			r.Spec.Deletion = v1alpha1.DeletionSpec{Policy: v1alpha1.DeleteDrain, DrainTimeout: &metav1.Duration{Duration: timeout}}
		}
	}
	s.createRelay(t, newRelay(ns, "orders", "orders", drain(time.Hour)))
	s.createRelay(t, newRelay(ns, "billing", "billing", drain(2*time.Second)))
	s.createRelay(t, newRelay(ns, "plain", "plain"))
	for _, name := range []string{"orders", "billing", "plain"} {
		s.waitCondition(t, ns, name, v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
	}
	hasFinalizer := func(name string) bool {
		return slices.Contains(s.getRelay(t, ns, name).Finalizers, FinalizerDrain)
	}
	eventually(t, 30*time.Second, func() error {
		if !hasFinalizer("orders") || !hasFinalizer("billing") {
			return fmt.Errorf("finalizers: orders %v, billing %v", s.getRelay(t, ns, "orders").Finalizers, s.getRelay(t, ns, "billing").Finalizers)
		}
		return nil
	})
	if hasFinalizer("plain") {
		t.Error("an OutboxRelay under the default policy (Orphan) has the drain finalizer")
	}
	if p := s.getRelay(t, ns, "plain").Spec.Deletion.Policy; p != v1alpha1.DeleteOrphan {
		t.Errorf("default deletion policy %q, want Orphan", p)
	}
	pending := func(name string, n int) *sql.DB {
		db, err := sql.Open("pgx", urls[name])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if _, err := db.Exec(fmt.Sprintf(`INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'order', 'o-' || g, 'OrderPlaced', '{}' FROM generate_series(1, %d) AS g`, n)); err != nil {
			t.Fatal(err)
		}
		return db
	}
	ordersDB := pending("orders", 5)
	pending("billing", 3)
	gone := func(name string) error {
		err := s.c.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: name}, &v1alpha1.OutboxRelay{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("%s still there (%w)", name, err)
	}

	// Drained: held while 5 are pending, gone once the database shows none.
	if err := s.c.Delete(testCtx(t), s.getRelay(t, ns, "orders")); err != nil {
		t.Fatal(err)
	}
	r := s.waitCondition(t, ns, "orders", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonDeletionDraining)
	if p := ptr.Deref(r.Status.PendingEvents, -1); p != 5 || r.DeletionTimestamp == nil {
		t.Errorf("draining: pending %d, deletionTimestamp %v", p, r.DeletionTimestamp)
	}
	s.deployment(t, ns, DeploymentName("orders", 0))                                     // the relays keep running
	if _, err := ordersDB.Exec(`UPDATE public.outbox SET sent_at = now()`); err != nil { // the relays published them
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error { return gone("orders") })
	if evs := strings.Join(s.eventsFor(t, ns, "orders"), "\n"); !strings.Contains(evs, "Normal DeletionDraining") || !strings.Contains(evs, "Normal Drained Drained: nothing is pending") {
		t.Errorf("events of the drain:\n%s", evs)
	}

	// Timed out: gone after its 2 s with its 3 events left, and says so.
	start := time.Now()
	if err := s.c.Delete(testCtx(t), s.getRelay(t, ns, "billing")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error { return gone("billing") })
	// The timeout runs from metadata.deletionTimestamp, which has a resolution of one second.
	if took := time.Since(start); took < time.Second {
		t.Errorf("gone after %s, before its drain timeout (2s)", took)
	}
	if evs := strings.Join(s.eventsFor(t, ns, "billing"), "\n"); !strings.Contains(evs, "Warning DrainTimedOut") || !strings.Contains(evs, "3 events still pending") {
		t.Errorf("events of the timed-out drain:\n%s", evs)
	}

	// Switching to Orphan removes the finalizer.
	plain := newRelay(ns, "switch", "plain", drain(time.Hour))
	plain.Spec.Database.Table = "public.switch_events"
	s.createRelay(t, plain)
	eventually(t, 30*time.Second, func() error {
		if !hasFinalizer("switch") {
			return fmt.Errorf("no finalizer yet")
		}
		return nil
	})
	sw := s.getRelay(t, ns, "switch")
	patch := client.MergeFrom(sw.DeepCopy())
	sw.Spec.Deletion.Policy = v1alpha1.DeleteOrphan
	if err := s.c.Patch(testCtx(t), sw, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if hasFinalizer("switch") {
			return fmt.Errorf("the finalizer is still there")
		}
		return nil
	})
}
