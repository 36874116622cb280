package controllers

import (
	"fmt"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// An OutboxRelay's relay pods get one PodDisruptionBudget, owned by it, that selects every
// shard's pods (as the API server matches the selector against each Deployment's pod template)
// and no other OutboxRelay's, with at most one unavailable and unhealthy pods always evictable.
func TestRelayPodDisruptionBudget(t *testing.T) {
	s := sharedSuite(t)
	ns := s.env.CreateNamespace(t, "pdb")
	s.createSecret(t, ns, "db", map[string]string{"url": pgtest.NewDatabase(t)})
	relay := newRelay(ns, "orders", "db")
	relay.Spec.Shards = 2
	s.createRelay(t, relay)
	s.createSecret(t, ns, "db2", map[string]string{"url": pgtest.NewDatabase(t)}) // a table of its own: no conflict
	other := newRelay(ns, "billing", "db2")
	s.createRelay(t, other)

	var pdb policyv1.PodDisruptionBudget
	eventually(t, 30*time.Second, func() error {
		return s.c.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: PDBName("orders")}, &pdb)
	})
	owner := s.getRelay(t, ns, "orders")
	if !metav1.IsControlledBy(&pdb, owner) {
		t.Errorf("owner references %v: want the OutboxRelay as controller", pdb.OwnerReferences)
	}
	if mu := pdb.Spec.MaxUnavailable; mu == nil || mu.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Errorf("maxUnavailable %v, minAvailable %v: want at most 1 unavailable", mu, pdb.Spec.MinAvailable)
	}
	if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
		t.Errorf("unhealthyPodEvictionPolicy %v, want AlwaysAllow", p)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{DeploymentName("orders", 0), DeploymentName("orders", 1)} {
		var d = s.deployment(t, ns, name)
		if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("the budget's selector %s does not select the pods of %s (%v)", sel, name, d.Spec.Template.Labels)
		}
	}
	if d := s.deployment(t, ns, DeploymentName("billing", 0)); sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the budget of orders selects the pods of another OutboxRelay: %v", d.Spec.Template.Labels)
	}
	// Deleted by hand: the next pass puts it back.
	if err := s.c.Delete(testCtx(t), &pdb); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		var again policyv1.PodDisruptionBudget
		if err := s.c.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: PDBName("orders")}, &again); err != nil {
			return fmt.Errorf("%w; conditions %v; events %v", err, s.getRelay(t, ns, "orders").Status.Conditions, s.eventsFor(t, ns, "orders"))
		}
		if again.UID == pdb.UID {
			return fmt.Errorf("still the deleted budget")
		}
		return nil
	})
}
