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

package controllers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
)

// shardOf returns the shard index of a relay Deployment from its label.
func shardOf(d *appsv1.Deployment) (int32, bool) {
	v, ok := d.Labels[LabelShard]
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 0 || n >= v1alpha1.MaxShards {
		return 0, false
	}
	return int32(n), true
}

// surplusShards returns, sorted, the Deployments of shards >= shards among deps.
func surplusShards(deps []appsv1.Deployment, shards int32) []*appsv1.Deployment {
	var out []*appsv1.Deployment
	for i := range deps {
		if k, ok := shardOf(&deps[i]); ok && k >= shards {
			out = append(out, &deps[i])
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// deploymentAvailable reports whether a relay Deployment has an available pod of its current template.
func deploymentAvailable(d *appsv1.Deployment) bool {
	if d.Spec.Replicas != nil && *d.Spec.Replicas == 0 {
		return false
	}
	return d.Status.ObservedGeneration >= d.Generation &&
		d.Status.UpdatedReplicas >= 1 && d.Status.AvailableReplicas >= 1
}

// ensureDeployments applies one relay Deployment per shard of the current and of the desired
// layout (the new layout's relays stand by until the switch), deletes those of shards beyond
// both, and counts the available ones of the current layout. It never takes over a Deployment
// another owner controls. It applies none while a Secret the relay pods need is missing or the
// relays' own database URL (checkRelayDatabase) is refused.
func (r *OutboxRelayReconciler) ensureDeployments(ctx context.Context, s *scope) (Result, error) {
	relay := s.relay
	active, keep := desiredOf(relay), desiredOf(relay)
	if s.layout != nil {
		active, keep = s.layout.ShardCount, max(s.layout.ShardCount, keep)
	}
	if err := r.checkRelayDatabase(ctx, s); err != nil {
		return Result{}, err
	}
	kafka, err := r.kafkaSecretEntries(ctx, s)
	if err != nil {
		var se *errSecret
		if errors.As(err, &se) {
			setRelaysCondition(relay, relaysObservation{blocked: se.reason, message: "Kafka settings: " + se.msg})
			return Result{}, errWait
		}
		return Result{}, err
	}
	registry, err := r.schemaRegistryEntries(ctx, s)
	if err != nil {
		var se *errSecret
		if errors.As(err, &se) {
			setRelaysCondition(relay, relaysObservation{blocked: se.reason, message: "schema registry settings: " + se.msg})
			return Result{}, errWait
		}
		return Result{}, err
	}
	for k, v := range kafka {
		s.secretValues[k] = v
	}
	for k, v := range registry {
		s.secretValues[k] = v
	}
	hash := secretHash(s.secretValues)
	defaults := relayDefaults{image: r.RelayImage, otlpEndpoint: r.RelayOTLPEndpoint}
	st := r.stateOf(relay)

	var owned appsv1.DeploymentList
	if err := r.List(ctx, &owned, client.InNamespace(relay.Namespace),
		client.MatchingLabels(relayPodLabels(relay.Name))); err != nil {
		return Result{}, fmt.Errorf("while listing relay Deployments: %w", err)
	}

	obs := relaysObservation{shards: active, paused: relay.Spec.Paused}
	for k := int32(0); k < keep; k++ {
		name := DeploymentName(relay.Name, k)
		var existing appsv1.Deployment
		err := r.Get(ctx, client.ObjectKey{Namespace: relay.Namespace, Name: name}, &existing)
		switch {
		case err == nil && !metav1.IsControlledBy(&existing, relay):
			msg := fmt.Sprintf("Deployment %q exists and is not controlled by this OutboxRelay; it is left alone", name)
			if !hasCondition(relay, v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonDeploymentNotOwned, msg) {
				r.Recorder.Eventf(relay, &existing, corev1.EventTypeWarning, v1alpha1.ReasonDeploymentNotOwned, "Apply", msg)
			}
			setRelaysCondition(relay, relaysObservation{blocked: v1alpha1.ReasonDeploymentNotOwned, message: msg})
			return Result{}, errWait
		case err != nil && !apierrors.IsNotFound(err):
			return Result{}, fmt.Errorf("while reading Deployment %q: %w", name, err)
		}
		desired := relayDeployment(relay, k, hash, defaults)
		want := applyHash(desired)
		if err == nil && st.appliedUnchanged(name, want, existing.ResourceVersion) {
			// This exact configuration was applied and the object has not changed since: skip the
			// request. Any change to the Deployment (by anyone) moves its resourceVersion, and the
			// next pass applies again.
			if k < active && deploymentAvailable(&existing) {
				obs.ready++
			}
			continue
		}
		if err := r.Apply(ctx, desired, client.FieldOwner(fieldOwnerName), client.ForceOwnership); err != nil {
			if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
				setRelaysCondition(relay, relaysObservation{blocked: v1alpha1.ReasonApplyFailed,
					message: fmt.Sprintf("the API server refused Deployment %q: %s", name, apiReason(err))})
				return Result{}, errWait
			}
			return Result{}, fmt.Errorf("while applying Deployment %q: %w", name, err)
		}
		st.recordApplied(name, want, ptr.Deref(desired.ResourceVersion, ""))
		if k < active && available(desired) {
			obs.ready++
		}
	}
	for _, d := range surplusShards(owned.Items, keep) {
		if !metav1.IsControlledBy(d, relay) {
			continue
		}
		if err := r.Delete(ctx, d, client.Preconditions{UID: &d.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return Result{}, fmt.Errorf("while deleting Deployment %q of a surplus shard: %w", d.Name, err)
		}
		r.Recorder.Eventf(relay, d, corev1.EventTypeNormal, v1alpha1.ReasonDeletedSurplusShard, "Delete",
			"Deleted Deployment %s: the layout has %d shards", d.Name, keep)
	}
	relay.Status.ReadyShards = obs.ready
	relay.Status.Selector = Selector(relay.Name)
	if obs.ready < obs.shards && s.db != nil {
		obs.kafka = relaysKafkaState(ctx, s.db, s.table) // why, when the relays say
	}
	setRelaysCondition(relay, obs)
	return Result{}, nil
}

// desiredOf is status.desiredShards, or spec.shards before the first pass set it.
func desiredOf(relay *v1alpha1.OutboxRelay) int32 {
	if relay.Status.DesiredShards > 0 {
		return relay.Status.DesiredShards
	}
	return max(relay.Spec.Shards, 1)
}

// deleteRelayDeployments deletes the relay Deployments this OutboxRelay controls (a refused relay
// stays idle).
func (r *OutboxRelayReconciler) deleteRelayDeployments(ctx context.Context, relay *v1alpha1.OutboxRelay) error {
	var owned appsv1.DeploymentList
	if err := r.List(ctx, &owned, client.InNamespace(relay.Namespace),
		client.MatchingLabels(relayPodLabels(relay.Name))); err != nil {
		return fmt.Errorf("while listing relay Deployments: %w", err)
	}
	for i := range owned.Items {
		d := &owned.Items[i]
		if !metav1.IsControlledBy(d, relay) {
			continue
		}
		if err := r.Delete(ctx, d, client.Preconditions{UID: &d.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("while deleting Deployment %q: %w", d.Name, err)
		}
	}
	return nil
}

// available reads availability from the apply response, which carries the live status.
func available(d *appsv1ac.DeploymentApplyConfiguration) bool {
	if d == nil || d.Spec == nil || d.Status == nil {
		return false
	}
	var dep appsv1.Deployment
	if d.Generation != nil {
		dep.Generation = *d.Generation
	}
	dep.Spec.Replicas = d.Spec.Replicas
	st := d.Status
	dep.Status.ObservedGeneration = ptr.Deref(st.ObservedGeneration, 0)
	dep.Status.UpdatedReplicas = ptr.Deref(st.UpdatedReplicas, 0)
	dep.Status.AvailableReplicas = ptr.Deref(st.AvailableReplicas, 0)
	return deploymentAvailable(&dep)
}

// apiReason is the API server's explanation of a refused object, without the object itself.
func apiReason(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		if d := st.Status().Details; d != nil && len(d.Causes) > 0 {
			msgs := make([]string, 0, len(d.Causes))
			for _, c := range d.Causes {
				msgs = append(msgs, c.Field+": "+c.Message)
			}
			return strings.Join(msgs, "; ")
		}
		return string(st.Status().Reason)
	}
	return "refused"
}
