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
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// layoutStep is what one pass does to the table's shard layout.
type layoutStep int

const (
	// layoutKeep: the layout has the desired count and no change is requested.
	layoutKeep layoutStep = iota
	// layoutWithdraw: the desired count went back to the layout's while a change was requested:
	// withdraw it, or the relays would stand by for a switch that never comes.
	layoutWithdraw
	// layoutSwitchNow: no layout yet, or a change while paused: no relay publishes, switch at once.
	layoutSwitchNow
	// layoutWaitRelays: a relay of some shard of the new layout is not standing by yet; the old
	// layout publishes meanwhile.
	layoutWaitRelays
	// layoutChange: every relay of the new layout stands by: request the change (the old
	// layout's relays stand down) and switch once they have.
	layoutChange
	// layoutWaitIndex: a layout of several shards is due but the bucket index its shards read is
	// not built yet (ensureBucketIndex builds it); the current layout publishes meanwhile.
	layoutWaitIndex
)

// layoutPlan is planLayout's decision.
type layoutPlan struct {
	step    layoutStep
	missing []int32 // layoutWaitRelays: the new layout's shards without a relay standing by
	cancel  bool    // layoutWaitRelays: a change was requested: cancel it, the old layout goes on
	request bool    // layoutChange: the change is not requested yet
}

// needsPresence reports whether planLayout needs to know which shards' relays stand by: for a
// change of count while relays publish.
func needsPresence(l *outboxdb.Layout, want int32, paused bool) bool {
	return l != nil && l.ShardCount != want && !paused
}

// planLayout decides the pass's step from the table's layout (nil: none yet), the desired shard
// count, whether the OutboxRelay is paused and, when needsPresence, the shards whose relays stand
// by (their presence lock is held).
func planLayout(l *outboxdb.Layout, want int32, paused bool, present map[int32]bool) layoutPlan {
	switch {
	case l != nil && l.ShardCount == want && l.Requested != 0:
		return layoutPlan{step: layoutWithdraw}
	case l == nil || l.ShardCount != want && paused:
		return layoutPlan{step: layoutSwitchNow}
	case l.ShardCount == want:
		return layoutPlan{step: layoutKeep}
	}
	var missing []int32
	for k := range want {
		if !present[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return layoutPlan{step: layoutWaitRelays, missing: missing, cancel: l.Requested != 0}
	}
	return layoutPlan{step: layoutChange, request: l.Requested != want}
}

// gateOnBucketIndex holds a change to a layout of several shards (want > 1) until the bucket
// index is built (ready): its shards read their buckets through it, and without it each bucket's
// read would walk the id order of the whole range. Only a change not yet under way waits: once
// requested, the old layout's relays are standing down, and the switch goes on.
func gateOnBucketIndex(p layoutPlan, want int32, ready bool) layoutPlan {
	if ready || want <= 1 {
		return p
	}
	if p.step == layoutSwitchNow || p.step == layoutChange && p.request {
		return layoutPlan{step: layoutWaitIndex}
	}
	return p
}

// shardsObservation is what a pass saw of the table's shard layout, for ShardsSettled.
type shardsObservation struct {
	// reason is ReasonShardsSettled, ReasonWaitingForRelays, ReasonWaitingForIndex or
	// ReasonDraining.
	reason string
	// from is the layout's shard count (0: no layout yet), want the desired one.
	from, want int32
	// missing: WaitingForRelays, the new layout's shards without a relay standing by.
	missing []int32
	// why: Draining, what the switch waits for ("": the old layout's relays to stand down).
	why string
	// held: Draining, how many buckets relays still hold (-1: not known).
	held int
}

// setShardsSettledCondition sets ShardsSettled, and status.shards to the layout's count, from
// what the pass saw. Its messages carry counts, never backend pids: a message changes only when
// the situation does.
func setShardsSettledCondition(relay *v1alpha1.OutboxRelay, o shardsObservation) {
	if o.from > 0 {
		relay.Status.Shards = o.from
	}
	switch o.reason {
	case v1alpha1.ReasonShardsSettled:
		setCondition(relay, v1alpha1.ConditionShardsSettled, metav1.ConditionTrue, o.reason,
			fmt.Sprintf("the layout has %d shards, as desired", o.from))
	case v1alpha1.ReasonWaitingForRelays:
		shards := make([]string, len(o.missing))
		for i, k := range o.missing {
			shards[i] = fmt.Sprint(k)
		}
		setCondition(relay, v1alpha1.ConditionShardsSettled, metav1.ConditionFalse, o.reason,
			fmt.Sprintf("%d -> %d shards: waiting for the relays of shards %s to start; the %d-shard layout publishes meanwhile",
				o.from, o.want, strings.Join(shards, ", "), o.from))
	case v1alpha1.ReasonWaitingForIndex:
		msg := fmt.Sprintf("%d -> %d shards: building the bucket index the shards of a layout of several read (a partition at a time, CONCURRENTLY: writers go on); the %d-shard layout publishes meanwhile",
			o.from, o.want, o.from)
		if o.from == 0 {
			msg = fmt.Sprintf("the first layout, %d shards: building the bucket index its shards read (a partition at a time, CONCURRENTLY: writers go on)", o.want)
		}
		setCondition(relay, v1alpha1.ConditionShardsSettled, metav1.ConditionFalse, o.reason, msg)
	default:
		why := o.why
		if why == "" {
			why = "the relays of the old layout finish their batch in flight and release their buckets"
		}
		msg := fmt.Sprintf("%d -> %d shards: %s", o.from, o.want, why)
		if o.from == 0 {
			msg = fmt.Sprintf("the first layout, %d shards: %s", o.want, why)
		}
		if o.held >= 0 {
			msg += fmt.Sprintf(" (%d buckets still held)", o.held)
		}
		setCondition(relay, v1alpha1.ConditionShardsSettled, metav1.ConditionFalse, v1alpha1.ReasonDraining, msg)
	}
}
