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
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// How soon a pass looks again while a change of layout is in progress.
const (
	// reshardWaitRelays: the relays of the new layout are starting (a pod start takes seconds).
	reshardWaitRelays = 500 * time.Millisecond
	// reshardPoll: the old layout is standing down, or the new one taking its buckets.
	reshardPoll = 100 * time.Millisecond
	// switchRetry: how often the background wait for a switch tries it (outboxrelay_switch.go).
	switchRetry = 20 * time.Millisecond
	// reshardReportWindow: how long after a switch the pause is polled for at reshardPoll.
	reshardReportWindow = 30 * time.Second
)

// observeLayout reads the table's shard layout into the scope, for the steps after it.
func (r *OutboxRelayReconciler) observeLayout(ctx context.Context, s *scope) (Result, error) {
	return Result{}, r.loadLayout(ctx, s)
}

// loadLayout reads the table's shard layout into the scope.
func (r *OutboxRelayReconciler) loadLayout(ctx context.Context, s *scope) error {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	l, err := outboxdb.ReadLayout(ctx, s.db, s.table)
	if err != nil {
		return errors.New(redact("cannot read the shard layout: "+describeDBError(err), s.dbURL))
	}
	s.layout = l
	return nil
}

// ensureLayout moves the table's shard layout to status.desiredShards (docs/architecture.md,
// "Resharding"): once a relay of every shard of the new layout is up and standing by (its
// presence lock is held), it asks the old layout's relays to stand down and switches the layout
// in PostgreSQL, which succeeds only when no relay holds a bucket. It reports the change in
// status.lastReshard once every bucket is held again.
func (r *OutboxRelayReconciler) ensureLayout(ctx context.Context, s *scope) (Result, error) {
	relay := s.relay
	want := desiredOf(relay)
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	fail := func(what string, err error) (Result, error) {
		return Result{}, errors.New(redact(what+": "+describeDBError(err), s.dbURL))
	}
	l := s.layout
	var present map[int32]bool
	if needsPresence(l, want, relay.Spec.Paused) {
		locks, err := outboxdb.ReadRelayLocks(ctx, s.db, s.table)
		if err != nil {
			return fail("cannot read the relay locks", err)
		}
		present = make(map[int32]bool, len(locks.Present))
		for k := range locks.Present {
			present[k] = true
		}
	}
	var res Result
	switch plan := gateOnBucketIndex(planLayout(l, want, relay.Spec.Paused, present), want, s.bucketIndexReady); plan.step {
	case layoutWaitIndex:
		o := shardsObservation{reason: v1alpha1.ReasonWaitingForIndex, want: want}
		if l != nil {
			o.from = l.ShardCount
		}
		setShardsSettledCondition(relay, o)
		return Result{RequeueAfter: indexesNext}, nil
	case layoutWithdraw:
		if err := outboxdb.RequestLayout(ctx, s.db, s.table, want); err != nil {
			return fail("cannot withdraw a change of layout", err)
		}
		r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonReshardWithdrawn, "Reshard",
			"Withdrew the change from %d to %d shards: %d shards are desired again", l.ShardCount, l.Requested, want)
	case layoutSwitchNow:
		ok, err := outboxdb.SwitchLayout(ctx, s.db, s.table, want)
		if err != nil {
			return fail("cannot set the shard layout", err)
		}
		if !ok {
			return r.draining(ctx, s, want, "relays that do not follow the table's layout (an older relay version being replaced, or relays run by hand) hold buckets of the table; the switch waits until they stop")
		}
	case layoutWaitRelays:
		if plan.cancel {
			// A change to another count was asked for: cancel it, the old layout goes on.
			if err := outboxdb.RequestLayout(ctx, s.db, s.table, l.ShardCount); err != nil {
				return fail("cannot cancel a change of layout", err)
			}
		}
		setShardsSettledCondition(relay, shardsObservation{reason: v1alpha1.ReasonWaitingForRelays, from: l.ShardCount, want: want, missing: plan.missing})
		return Result{RequeueAfter: reshardWaitRelays}, nil
	case layoutChange:
		if plan.request {
			if err := outboxdb.RequestLayout(ctx, s.db, s.table, want); err != nil {
				return fail("cannot request the new layout", err)
			}
			r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonResharding, "Reshard",
				"Resharding from %d to %d shards: the relays of the old layout finish their batch in flight and release their buckets", l.ShardCount, want)
		}
		ok, err := outboxdb.SwitchLayout(ctx, s.db, s.table, want)
		if err != nil {
			return fail("cannot switch the shard layout", err)
		}
		if !ok {
			// The old layout's relays are standing down: wait for the switch in the background
			// (its word brings the next pass), not in this pass, which would hold a worker.
			res, err := r.draining(ctx, s, want, "")
			if r.switches.start(relay, s.db, s.table, want) {
				res.RequeueAfter = switchFallback
			}
			return res, err
		}
	}
	if l == nil || l.ShardCount != want {
		if err := r.loadLayout(ctx, s); err != nil {
			return Result{}, err
		}
		l = s.layout
		if l.Previous == 0 {
			r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonSwitchedLayout, "Reshard",
				"Set the table's first shard layout: %d shard(s)", l.ShardCount)
		} else {
			r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonSwitchedLayout, "Reshard",
				"Switched the shard layout from %d to %d shard(s): no relay of the old layout holds a bucket", l.Previous, l.ShardCount)
		}
	}
	setShardsSettledCondition(relay, shardsObservation{reason: v1alpha1.ReasonShardsSettled, from: l.ShardCount, want: l.ShardCount})

	last := &v1alpha1.ReshardStatus{FromShards: l.Previous, ToShards: l.ShardCount}
	if !l.SwitchedAt.IsZero() {
		last.SwitchedAt = &metav1.Time{Time: l.SwitchedAt.Truncate(time.Second)}
	}
	if pause, ok := l.Pause(); ok {
		ms := pause.Milliseconds()
		last.PauseMilliseconds = &ms
		// Reported once per change, decided in PostgreSQL: the status this pass started from
		// may be older than the last write.
		if l.Previous != 0 {
			claimed, err := outboxdb.ClaimLayoutReport(ctx, s.db, s.table, l.Generation)
			if err != nil {
				return fail("cannot record the report of the layout change", err)
			}
			if claimed {
				r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonResharded, "Reshard",
					"Resharded from %d to %d shards; publishing paused %d ms", l.Previous, l.ShardCount, ms)
			}
		}
	} else if !relay.Spec.Paused && r.Clock.Since(l.SwitchedAt) < reshardReportWindow {
		// The new layout is taking its buckets: report the pause soon. Past the window (relays
		// that do not start), the regular passes look again.
		res.RequeueAfter = reshardPoll
	}
	relay.Status.LastReshard = last
	return res, nil
}

// draining reports a switch that waits for relays to release their buckets.
func (r *OutboxRelayReconciler) draining(ctx context.Context, s *scope, want int32, why string) (Result, error) {
	o := shardsObservation{reason: v1alpha1.ReasonDraining, want: want, why: why, held: -1}
	if s.layout != nil {
		o.from = s.layout.ShardCount
	}
	if locks, err := outboxdb.ReadRelayLocks(ctx, s.db, s.table); err == nil {
		o.held = len(locks.Buckets)
	}
	setShardsSettledCondition(s.relay, o)
	return Result{RequeueAfter: reshardPoll}, nil
}
