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
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

func TestPlanLayout(t *testing.T) {
	layout := func(count, requested int32) *outboxdb.Layout {
		return &outboxdb.Layout{ShardCount: count, Requested: requested}
	}
	all := func(n int32) map[int32]bool {
		m := map[int32]bool{}
		for k := range n {
			m[k] = true
		}
		return m
	}
	tests := map[string]struct {
		layout   *outboxdb.Layout
		want     int32
		paused   bool
		present  map[int32]bool
		presence bool // needsPresence
		plan     layoutPlan
	}{
		"no layout yet":                     {nil, 2, false, nil, false, layoutPlan{step: layoutSwitchNow}},
		"no layout yet, paused":             {nil, 2, true, nil, false, layoutPlan{step: layoutSwitchNow}},
		"as desired":                        {layout(2, 0), 2, false, nil, false, layoutPlan{step: layoutKeep}},
		"as desired, paused":                {layout(2, 0), 2, true, nil, false, layoutPlan{step: layoutKeep}},
		"desired again while requested":     {layout(2, 4), 2, false, nil, false, layoutPlan{step: layoutWithdraw}},
		"change while paused":               {layout(2, 0), 4, true, nil, false, layoutPlan{step: layoutSwitchNow}},
		"new relays not all up":             {layout(2, 0), 4, false, map[int32]bool{0: true, 2: true}, true, layoutPlan{step: layoutWaitRelays, missing: []int32{1, 3}}},
		"new relays not all up, requested":  {layout(2, 4), 4, false, map[int32]bool{0: true}, true, layoutPlan{step: layoutWaitRelays, missing: []int32{1, 2, 3}, cancel: true}},
		"a request for another count waits": {layout(2, 3), 4, false, all(3), true, layoutPlan{step: layoutWaitRelays, missing: []int32{3}, cancel: true}},
		"every new relay stands by":         {layout(2, 0), 4, false, all(4), true, layoutPlan{step: layoutChange, request: true}},
		"requested, switching":              {layout(2, 4), 4, false, all(4), true, layoutPlan{step: layoutChange}},
		"down, requested another count":     {layout(4, 3), 1, false, all(4), true, layoutPlan{step: layoutChange, request: true}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := needsPresence(tc.layout, tc.want, tc.paused); got != tc.presence {
				t.Errorf("needsPresence = %v, want %v", got, tc.presence)
			}
			if got := planLayout(tc.layout, tc.want, tc.paused, tc.present); !reflect.DeepEqual(got, tc.plan) {
				t.Errorf("plan %+v, want %+v", got, tc.plan)
			}
		})
	}
}

// A change to a layout of several shards not yet under way waits for the bucket index; one
// requested already, a change to one shard, and every other step go on.
func TestGateOnBucketIndex(t *testing.T) {
	wait := layoutPlan{step: layoutWaitIndex}
	tests := map[string]struct {
		plan  layoutPlan
		want  int32
		ready bool
		out   layoutPlan
	}{
		"first layout of several":           {layoutPlan{step: layoutSwitchNow}, 2, false, wait},
		"first layout of several, built":    {layoutPlan{step: layoutSwitchNow}, 2, true, layoutPlan{step: layoutSwitchNow}},
		"first layout of one":               {layoutPlan{step: layoutSwitchNow}, 1, false, layoutPlan{step: layoutSwitchNow}},
		"change not requested yet":          {layoutPlan{step: layoutChange, request: true}, 4, false, wait},
		"change requested: the switch goes": {layoutPlan{step: layoutChange}, 4, false, layoutPlan{step: layoutChange}},
		"change to one shard":               {layoutPlan{step: layoutChange, request: true}, 1, false, layoutPlan{step: layoutChange, request: true}},
		"relays start meanwhile":            {layoutPlan{step: layoutWaitRelays, missing: []int32{1}}, 2, false, layoutPlan{step: layoutWaitRelays, missing: []int32{1}}},
		"keep":                              {layoutPlan{step: layoutKeep}, 2, false, layoutPlan{step: layoutKeep}},
		"withdraw":                          {layoutPlan{step: layoutWithdraw}, 2, false, layoutPlan{step: layoutWithdraw}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := gateOnBucketIndex(tc.plan, tc.want, tc.ready); !reflect.DeepEqual(got, tc.out) {
				t.Errorf("gate %+v, want %+v", got, tc.out)
			}
		})
	}
}

func TestSetShardsSettledCondition(t *testing.T) {
	tests := map[string]struct {
		obs     shardsObservation
		status  metav1.ConditionStatus
		reason  string
		message string
		shards  int32
	}{
		"settled": {shardsObservation{reason: v1alpha1.ReasonShardsSettled, from: 4, want: 4},
			metav1.ConditionTrue, v1alpha1.ReasonShardsSettled, "the layout has 4 shards, as desired", 4},
		"waiting for relays": {shardsObservation{reason: v1alpha1.ReasonWaitingForRelays, from: 2, want: 4, missing: []int32{2, 3}},
			metav1.ConditionFalse, v1alpha1.ReasonWaitingForRelays, "2 -> 4 shards: waiting for the relays of shards 2, 3 to start; the 2-shard layout publishes meanwhile", 2},
		"draining": {shardsObservation{reason: v1alpha1.ReasonDraining, from: 4, want: 2, held: 37},
			metav1.ConditionFalse, v1alpha1.ReasonDraining, "4 -> 2 shards: the relays of the old layout finish their batch in flight and release their buckets (37 buckets still held)", 4},
		"draining, locks unknown": {shardsObservation{reason: v1alpha1.ReasonDraining, from: 4, want: 2, held: -1},
			metav1.ConditionFalse, v1alpha1.ReasonDraining, "4 -> 2 shards: the relays of the old layout finish their batch in flight and release their buckets", 4},
		"first layout held by foreign relays": {shardsObservation{reason: v1alpha1.ReasonDraining, want: 2, why: "relays by hand hold buckets", held: 256},
			metav1.ConditionFalse, v1alpha1.ReasonDraining, "the first layout, 2 shards: relays by hand hold buckets (256 buckets still held)", 7},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			relay := &v1alpha1.OutboxRelay{ObjectMeta: metav1.ObjectMeta{Generation: 5}}
			relay.Status.Shards = 7
			setShardsSettledCondition(relay, tc.obs)
			c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionShardsSettled)
			if c == nil || c.Status != tc.status || c.Reason != tc.reason || c.Message != tc.message || c.ObservedGeneration != 5 {
				t.Errorf("condition %+v\nwant %s %s %q", c, tc.status, tc.reason, tc.message)
			}
			if relay.Status.Shards != tc.shards {
				t.Errorf("status.shards %d, want %d", relay.Status.Shards, tc.shards)
			}
		})
	}
}
