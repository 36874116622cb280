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

// Deleting an OutboxRelay (spec.deletion): Orphan stops the relays at once; Drain holds the
// OutboxRelay with a finalizer while its relays publish what is pending, up to a timeout.

package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
)

// FinalizerDrain holds a deleted OutboxRelay whose spec.deletion.policy is Drain until its relays
// have published what was pending, or the drain timeout passed.
const FinalizerDrain = "outbox.dev/drain"

// DefaultDrainTimeout is spec.deletion.drainTimeout's default (the CRD's).
const DefaultDrainTimeout = 10 * time.Minute

// drainPoll is how often a drain measures what is still pending.
const drainPoll = 2 * time.Second

// drainPlan is what one pass of a drain does.
type drainPlan int

const (
	drainWait     drainPlan = iota // the relays are still publishing: measure again
	drainDone                      // nothing pending: let the OutboxRelay go
	drainTimedOut                  // the timeout passed first: let it go, with what is pending left
)

// planDrain decides a drain's pass from what is pending (known: it could be measured) and how
// long the drain has run.
func planDrain(pending int64, known bool, elapsed, timeout time.Duration) drainPlan {
	switch {
	case known && pending == 0:
		return drainDone
	case elapsed >= timeout:
		return drainTimedOut
	}
	return drainWait
}

// ensureFinalizer adds the Drain finalizer when spec.deletion.policy is Drain and removes it
// otherwise, before the steps of a pass.
func (r *OutboxRelayReconciler) ensureFinalizer(ctx context.Context, relay *v1alpha1.OutboxRelay) error {
	want := relay.Spec.Deletion.Policy == v1alpha1.DeleteDrain
	if want == controllerutil.ContainsFinalizer(relay, FinalizerDrain) {
		return nil
	}
	return r.setFinalizer(ctx, relay, want)
}

// setFinalizer adds or removes the Drain finalizer (a merge patch against the object it read).
func (r *OutboxRelayReconciler) setFinalizer(ctx context.Context, relay *v1alpha1.OutboxRelay, on bool) error {
	patch := client.MergeFromWithOptions(relay.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if on {
		controllerutil.AddFinalizer(relay, FinalizerDrain)
	} else {
		controllerutil.RemoveFinalizer(relay, FinalizerDrain)
	}
	if err := r.Patch(ctx, relay, patch); err != nil {
		return fmt.Errorf("while setting the finalizer %s to %v: %w", FinalizerDrain, on, err)
	}
	return nil
}

// drain runs a pass of a deleted OutboxRelay. Without the Drain finalizer there is nothing to do:
// the Deployments go with their owner references, the database stays as it is. With it, the
// relays (left running: no step runs on a deleted OutboxRelay) publish what is pending; the pass
// measures it as status does, says so (status, an Event on the first pass), and removes the
// finalizer once nothing is pending or the timeout passed.
func (r *OutboxRelayReconciler) drain(ctx context.Context, relay *v1alpha1.OutboxRelay) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(relay, FinalizerDrain) {
		return ctrl.Result{}, nil
	}
	timeout := DefaultDrainTimeout
	if d := relay.Spec.Deletion.DrainTimeout; d != nil {
		timeout = d.Duration
	}
	elapsed := r.Clock.Since(relay.DeletionTimestamp.Time)
	s := &scope{relay: relay, before: relay.DeepCopy(), secretValues: map[string][]byte{}}
	pending, known, why := r.pendingForDrain(ctx, s)

	switch planDrain(pending, known, elapsed, timeout) {
	case drainDone:
		r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonDrained, "Delete",
			"Drained: nothing is pending in table %s after %s; the OutboxRelay and its relays go", s.table, elapsed.Round(time.Second))
		return ctrl.Result{}, r.releaseFinalizer(ctx, relay)
	case drainTimedOut:
		left := fmt.Sprintf("%d events still pending", pending)
		if !known {
			left = "what is pending could not be measured (" + why + ")"
		}
		r.Recorder.Eventf(relay, nil, corev1.EventTypeWarning, v1alpha1.ReasonDrainTimeout, "Delete",
			"The drain timeout (%s) passed with %s in table %s; the OutboxRelay and its relays go, the events stay in the table for the relays it gets next",
			timeout, left, s.table)
		return ctrl.Result{}, r.releaseFinalizer(ctx, relay)
	}
	msg := fmt.Sprintf("deleted under the Drain policy: the relays publish what is pending (%d events) before they go, for at most %s", pending, timeout)
	if !known {
		msg = fmt.Sprintf("deleted under the Drain policy: waiting for the relays to publish what is pending, for at most %s; it cannot be measured now: %s", timeout, why)
	}
	first := !hasConditionReason(relay, v1alpha1.ConditionReady, v1alpha1.ReasonDeletionDraining)
	setCondition(relay, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonDeletionDraining, msg)
	if first {
		r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonDeletionDraining, "Delete", "Deleted: %s", msg)
	}
	if known {
		relay.Status.PendingEvents = &pending
	}
	if err := r.Status().Patch(ctx, relay, client.MergeFrom(s.before)); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: min(drainPoll, max(timeout-elapsed, time.Millisecond))}, nil
}

// pendingForDrain measures what is pending as status does; known is false, with why, where it
// cannot be (the Secret or the database gone).
func (r *OutboxRelayReconciler) pendingForDrain(ctx context.Context, s *scope) (pending int64, known bool, why string) {
	if _, err := r.loadDatabase(ctx, s); err != nil {
		return 0, false, "the database Secret cannot be read"
	}
	db, err := r.stateOf(s.relay).database(ctx, s.dbURL, r.OpenDB)
	if err != nil {
		return 0, false, redact(describeDBError(err), s.dbURL)
	}
	pending, _, err = measureLag(ctx, db, s.table, s.relay.ResolvedTracking().Mode())
	if err != nil {
		return 0, false, redact(describeDBError(err), s.dbURL)
	}
	return pending, true, ""
}

// releaseFinalizer removes the Drain finalizer: the API server then deletes the OutboxRelay, and
// the garbage collector its Deployments.
func (r *OutboxRelayReconciler) releaseFinalizer(ctx context.Context, relay *v1alpha1.OutboxRelay) error {
	if err := r.setFinalizer(ctx, relay, false); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}
