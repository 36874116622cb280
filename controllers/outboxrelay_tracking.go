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

// The tracking mode the relays run: spec.publish.tracking, or where it is unset, resolved once
// from the table and recorded in status.tracking (docs/architecture.md, "Tracking progress").

package controllers

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// trackingPlan is what resolveTracking does in one pass.
type trackingPlan struct {
	// mode is the mode the relays run and status.tracking records; "" until the table is read.
	mode v1alpha1.Tracking
	// readTable: spec.publish.tracking is unset and no mode is recorded yet: the table's state
	// decides (outboxdb.ResolveTracking).
	readTable bool
	// refused: the spec asks for Row where Snapshot is recorded; the relays keep Snapshot (rows
	// published under Snapshot are not marked sent: a row relay would publish them again).
	refused bool
}

// planTracking decides the pass's tracking from the spec and what status records.
func planTracking(relay *v1alpha1.OutboxRelay) trackingPlan {
	spec, recorded := relay.Spec.Publish.Tracking, relay.Status.Tracking
	if spec == "" && recorded == "" {
		return trackingPlan{readTable: true}
	}
	return trackingPlan{mode: relay.ResolvedTracking(), refused: spec == v1alpha1.TrackRow && recorded == v1alpha1.TrackSnapshot}
}

// resolveTracking sets status.tracking to the mode the relays run (planTracking). An unset
// spec.publish.tracking is resolved from the table once, with an Event that says why; the pass
// stops, retried, while the table cannot be read for it (no relay starts in a mode not decided).
func (r *OutboxRelayReconciler) resolveTracking(ctx context.Context, s *scope) (Result, error) {
	p := planTracking(s.relay)
	if p.readTable {
		ctx, cancel := context.WithTimeout(ctx, dbTimeout)
		defer cancel()
		state, err := outboxdb.ReadTrackingState(ctx, s.db, s.table)
		if err != nil {
			msg := redact(fmt.Sprintf("spec.publish.tracking is unset and the state of table %s could not be read to resolve it (retried; "+
				"setting spec.publish.tracking skips it): %s", s.table, describeDBError(err)), s.dbURL)
			r.Recorder.Eventf(s.relay, nil, corev1.EventTypeWarning, v1alpha1.ReasonTrackingUnresolved, "ResolveTracking", msg)
			return Result{}, errors.New(msg)
		}
		mode, why := outboxdb.ResolveTracking(state)
		p.mode = v1alpha1.TrackingOf(mode)
		r.Recorder.Eventf(s.relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonTrackingResolved, "ResolveTracking",
			"spec.publish.tracking is unset: the relays of table %s run %s tracking (%s); recorded in status.tracking", s.table, p.mode, why)
	}
	if p.refused && s.relay.Generation != s.relay.Status.ObservedGeneration { // once per change of the spec
		r.Recorder.Eventf(s.relay, nil, corev1.EventTypeWarning, v1alpha1.ReasonTrackingRefused, "ResolveTracking",
			"spec.publish.tracking asks for Row, but table %s is tracked by Snapshot: the relays keep Snapshot (its published events "+
				"are not marked sent, so a row relay would publish them all again)", s.table)
	}
	s.relay.Status.Tracking = p.mode
	return Result{}, nil
}
