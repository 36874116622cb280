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
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// Each setXCondition is pure: it computes one condition from an observation and sets it with the
// relay's generation. meta.SetStatusCondition keeps LastTransitionTime unless the status flips.

func setCondition(relay *v1alpha1.OutboxRelay, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&relay.Status.Conditions, metav1.Condition{
		Type:               typ,
		Status:             status,
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: relay.Generation,
	})
}

// hasCondition reports whether the condition is already set exactly so (used to emit an event
// only on a change).
func hasCondition(relay *v1alpha1.OutboxRelay, typ string, status metav1.ConditionStatus, reason, msg string) bool {
	c := meta.FindStatusCondition(relay.Status.Conditions, typ)
	return c != nil && c.Status == status && c.Reason == reason && c.Message == msg
}

// migrationsObservation is what the migrations step saw.
type migrationsObservation struct {
	version int64 // schema version after the step
	latest  int64
	reason  string // a failure reason, empty on success
	message string
}

func setMigrationsCondition(relay *v1alpha1.OutboxRelay, o migrationsObservation) {
	if o.reason != "" {
		setCondition(relay, v1alpha1.ConditionMigrationsApplied, metav1.ConditionFalse, o.reason, o.message)
		return
	}
	relay.Status.SchemaVersion = o.version
	setCondition(relay, v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied,
		fmt.Sprintf("schema of the outbox table is at version %d", o.version))
}

// partitionsObservation is what the partitions step saw.
type partitionsObservation struct {
	reason  string // a failure reason, empty on success
	message string
	kept    []string // partitions past retention kept because they hold unsent events
	first   string   // oldest daily partition, YYYY-MM-DD
	last    string   // newest daily partition, YYYY-MM-DD
	count   int32
	through string // the last day the spec asks for, YYYY-MM-DD
}

func setPartitionsCondition(relay *v1alpha1.OutboxRelay, o partitionsObservation) {
	if o.reason != "" {
		setCondition(relay, v1alpha1.ConditionPartitionsReady, metav1.ConditionFalse, o.reason, o.message)
		return
	}
	if o.count > 0 {
		relay.Status.Partitions = &v1alpha1.PartitionsStatus{Oldest: o.first, Newest: o.last, Count: o.count}
	}
	if len(o.kept) > 0 {
		setCondition(relay, v1alpha1.ConditionPartitionsReady, metav1.ConditionFalse, v1alpha1.ReasonRetentionBlocked,
			fmt.Sprintf("partitions past retention hold unsent events and are kept: %s", strings.Join(o.kept, ", ")))
		return
	}
	setCondition(relay, v1alpha1.ConditionPartitionsReady, metav1.ConditionTrue, v1alpha1.ReasonPartitionsReady,
		fmt.Sprintf("daily partitions exist through %s", o.through))
}

// relaysObservation is what the Deployment step saw.
type relaysObservation struct {
	// kafka is the contract.RelayKafka* state the relays report (refused wins), "" when none.
	kafka   string
	shards  int32
	ready   int32
	paused  bool
	blocked string // a reason the step could not apply the Deployments
	message string
}

func setRelaysCondition(relay *v1alpha1.OutboxRelay, o relaysObservation) {
	switch {
	case o.blocked != "":
		setCondition(relay, v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, o.blocked, o.message)
	case o.paused:
		setCondition(relay, v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonPaused,
			"spec.paused scaled the relays to zero")
	case o.ready < o.shards && o.kafka == contract.RelayKafkaRefused:
		setCondition(relay, v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonKafkaRefused,
			fmt.Sprintf("%d of %d relay shards available: the Kafka cluster refuses the relays (credentials, permissions, TLS or a missing topic; their logs and /readyz say which)", o.ready, o.shards))
	case o.ready < o.shards && o.kafka == contract.RelayKafkaUnreachable:
		setCondition(relay, v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonKafkaUnreachable,
			fmt.Sprintf("%d of %d relay shards available: no Kafka broker answers the relays", o.ready, o.shards))
	case o.ready < o.shards:
		setCondition(relay, v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonRelaysUnavailable,
			fmt.Sprintf("%d of %d relay shards available", o.ready, o.shards))
	default:
		setCondition(relay, v1alpha1.ConditionRelaysAvailable, metav1.ConditionTrue, v1alpha1.ReasonRelaysAvailable,
			fmt.Sprintf("%d of %d relay shards available", o.ready, o.shards))
	}
}

// lagObservation is what the lag step saw.
type lagObservation struct {
	known      bool
	pending    int64
	lagSeconds int64
	parked     *int64 // snapshot tracking only
	scalable   *int64 // the lag more shards can fix; nil when it could not be measured
	target     int32
	message    string // why lag is unknown
}

func setLagCondition(relay *v1alpha1.OutboxRelay, o lagObservation) {
	switch {
	case !o.known:
		setCondition(relay, v1alpha1.ConditionLagWithinTarget, metav1.ConditionUnknown, v1alpha1.ReasonLagUnknown, o.message)
	case o.lagSeconds > int64(o.target):
		setCondition(relay, v1alpha1.ConditionLagWithinTarget, metav1.ConditionFalse, v1alpha1.ReasonLagExceeded,
			fmt.Sprintf("the oldest unsent event is older than the target of %ds", o.target))
	default:
		setCondition(relay, v1alpha1.ConditionLagWithinTarget, metav1.ConditionTrue, v1alpha1.ReasonLagWithinTarget,
			fmt.Sprintf("the oldest unsent event is younger than the target of %ds", o.target))
	}
}

// applyLagStatus copies the pending count and lag into status coarsely: when unset, when the
// LagWithinTarget condition changed in this pass, when the backlog empties, or when at least
// interval passed since the last write. Fast-moving numbers belong to the relays' metrics.
func applyLagStatus(st *v1alpha1.OutboxRelayStatus, o lagObservation, conditionChanged bool, sinceLast, interval time.Duration) bool {
	if !o.known {
		return false
	}
	drained := o.pending == 0 && (st.PendingEvents == nil || *st.PendingEvents != 0)
	zero := func(p *int64) bool { return p != nil && *p == 0 }
	parkedFlip := (st.ParkedEvents == nil) != (o.parked == nil) || zero(st.ParkedEvents) != zero(o.parked)
	if st.PendingEvents != nil && st.LagSeconds != nil && !conditionChanged && !drained && !parkedFlip && sinceLast < interval {
		return false
	}
	if st.PendingEvents != nil && *st.PendingEvents == o.pending && st.LagSeconds != nil && *st.LagSeconds == o.lagSeconds &&
		ptr.Equal(st.ParkedEvents, o.parked) && ptr.Equal(st.ScalableLagSeconds, o.scalable) {
		return false
	}
	st.PendingEvents = &o.pending
	st.LagSeconds = &o.lagSeconds
	st.ParkedEvents = o.parked
	st.ScalableLagSeconds = o.scalable
	return true
}

// ensureConditions sets every sub-condition that is missing to Unknown, so Ready always has a
// full set to combine and a new object shows all its conditions.
func ensureConditions(relay *v1alpha1.OutboxRelay) {
	for _, t := range v1alpha1.SubConditions {
		if meta.FindStatusCondition(relay.Status.Conditions, t) == nil {
			setCondition(relay, t, metav1.ConditionUnknown, v1alpha1.ReasonNotReconciled, "not reconciled yet")
		}
	}
}

// setReadyCondition sets Ready to the AND of the sub-conditions. Not True: the reason of the first
// sub-condition that is not True, and a message naming it.
func setReadyCondition(relay *v1alpha1.OutboxRelay) {
	ensureConditions(relay)
	for _, t := range v1alpha1.SubConditions {
		c := meta.FindStatusCondition(relay.Status.Conditions, t)
		if c.Status != metav1.ConditionTrue {
			status := metav1.ConditionFalse
			if c.Status == metav1.ConditionUnknown {
				status = metav1.ConditionUnknown
			}
			setCondition(relay, v1alpha1.ConditionReady, status, c.Reason, t+": "+c.Message)
			return
		}
	}
	setCondition(relay, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReady,
		"migrations applied, partitions ready, relays available, lag within target")
}

// patchStatus writes the status once per pass, only when it changed. observedGeneration moves
// only when the pass succeeded.
func (r *OutboxRelayReconciler) patchStatus(ctx context.Context, s *scope, succeeded bool) error {
	relay := s.relay
	setReadyCondition(relay)
	if succeeded {
		relay.Status.ObservedGeneration = relay.Generation
	}
	if equality.Semantic.DeepEqual(s.before.Status, relay.Status) {
		return nil
	}
	// A merge patch holds only what differs from the status the pass started from. Started from
	// a cached status older than the last write, it would merge into fields it never saw (a
	// lastReshard of one change with the pause of the previous), so the patch carries the
	// resourceVersion it was computed against and a stale one is refused.
	if err := r.Status().Patch(ctx, relay, client.MergeFromWithOptions(s.before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			return errStaleStatus
		}
		return client.IgnoreNotFound(err)
	}
	return nil
}

// errStaleStatus: the pass computed its status from a cached object older than the last write;
// the next pass, from a fresher cache, writes it.
var errStaleStatus = errors.New("status computed from a stale object")
