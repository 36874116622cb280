/*
Copyright 2026 The outbox-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// The relay pods' PodDisruptionBudget: voluntary disruptions (a node drain, a cluster
// autoscaler's scale-down) take the relay pods of an OutboxRelay one at a time.

package controllers

import (
	"context"
	"fmt"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	policyv1ac "k8s.io/client-go/applyconfigurations/policy/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
)

// PDBName is the name of the PodDisruptionBudget of an OutboxRelay's relay pods.
func PDBName(relay string) string { return relay + "-relays" }

// relayPDB builds the PodDisruptionBudget of an OutboxRelay's relay pods (every shard's):
// at most one unavailable at a time. Each shard runs one pod, and its Deployment replaces it
// (Recreate: the old pod releases its buckets first), so an evicted shard pauses until its new
// pod is ready, as in a rollout, while the other shards publish; without the budget a drain
// takes every shard on the node at once. It never blocks a drain for good: one pod may always
// go, and a pod that is not ready (crash-looping, a Kafka outage makes every relay not ready)
// may be evicted whatever the budget says (unhealthyPodEvictionPolicy AlwaysAllow), since
// keeping it gains nothing.
func relayPDB(relay *v1alpha1.OutboxRelay) *policyv1ac.PodDisruptionBudgetApplyConfiguration {
	labels := relayPodLabels(relay.Name)
	labels[LabelManagedBy], labels[LabelComponent] = managedBy, "relay"
	return policyv1ac.PodDisruptionBudget(PDBName(relay.Name), relay.Namespace).
		WithLabels(labels).
		WithOwnerReferences(ownerReference(relay)).
		WithSpec(policyv1ac.PodDisruptionBudgetSpec().
			WithMaxUnavailable(intstr.FromInt32(1)).
			WithUnhealthyPodEvictionPolicy(policyv1.AlwaysAllow).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(relayPodLabels(relay.Name))))
}

// ensurePDB applies the relay pods' PodDisruptionBudget (relayPDB), skipping the request while
// neither it nor the object changed.
func (r *OutboxRelayReconciler) ensurePDB(ctx context.Context, s *scope) (Result, error) {
	relay := s.relay
	name := PDBName(relay.Name)
	var existing policyv1.PodDisruptionBudget
	err := r.Get(ctx, client.ObjectKey{Namespace: relay.Namespace, Name: name}, &existing)
	switch {
	case err == nil && !metav1.IsControlledBy(&existing, relay):
		return Result{}, nil // someone else's budget of that name: left alone
	case err != nil && !apierrors.IsNotFound(err):
		return Result{}, fmt.Errorf("while reading PodDisruptionBudget %q: %w", name, err)
	}
	desired := relayPDB(relay)
	want := applyHash(desired)
	st := r.stateOf(relay)
	if err == nil && st.appliedUnchanged(name, want, existing.ResourceVersion) {
		return Result{}, nil
	}
	if err := r.Apply(ctx, desired, client.FieldOwner(fieldOwnerName), client.ForceOwnership); err != nil {
		return Result{}, fmt.Errorf("while applying PodDisruptionBudget %q: %w", name, err)
	}
	st.recordApplied(name, want, ptr.Deref(desired.ResourceVersion, ""))
	return Result{}, nil
}
