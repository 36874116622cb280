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
	"fmt"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
)

// DefaultAutoscaleInterval is how often lag is measured, and the autoscaler decides, for an
// OutboxRelay with spec.autoscaling.
const DefaultAutoscaleInterval = 10 * time.Second

// autoscalePolicy is spec.autoscaling with its defaults filled in.
type autoscalePolicy struct {
	min, max   int32
	target     int64 // seconds
	upWindow   time.Duration
	downWindow time.Duration
}

func policyOf(a *v1alpha1.AutoscalingSpec) autoscalePolicy {
	p := autoscalePolicy{min: max(a.MinShards, 1), max: a.MaxShards, target: int64(a.TargetLagSeconds), downWindow: 5 * time.Minute}
	if p.max < p.min {
		p.max = p.min
	}
	if p.target <= 0 {
		p.target = 30
	}
	if a.ScaleUpStabilization != nil {
		p.upWindow = a.ScaleUpStabilization.Duration
	}
	if a.ScaleDownStabilization != nil {
		p.downWindow = a.ScaleDownStabilization.Duration
	}
	return p
}

func (p autoscalePolicy) clamp(n int32) int32 { return min(max(n, p.min), p.max) }

// recommend is the shard count one lag measurement asks for: above the target, the current count
// times lag/target (at least one more); at half the target or less, one fewer; else no change.
func (p autoscalePolicy) recommend(current int32, lagSeconds int64) int32 {
	switch {
	case lagSeconds > p.target:
		want := math.Ceil(float64(current) * float64(lagSeconds) / float64(p.target))
		return p.clamp(int32(min(max(want, float64(current+1)), math.MaxInt32)))
	case lagSeconds*2 <= p.target:
		return p.clamp(current - 1)
	}
	return p.clamp(current)
}

// recommendation is one measurement's recommendation.
type recommendation struct {
	at     time.Time
	shards int32
}

// autoscaleHistory is one OutboxRelay's recent recommendations, in memory (a restarted operator
// starts its windows again, which only delays a change).
type autoscaleHistory struct {
	since time.Time // the first recommendation this process recorded
	recs  []recommendation
	held  string // why the last pass did not act on the lag it saw, "" when it did
}

// decide records the recommendation for lag and returns the shard count to run: more shards
// once every recommendation of the scale-up window asked for more (the smallest of them), fewer
// once every recommendation of the scale-down window asked for fewer (the largest of them).
// A window counts only once this process has watched for that long.
func (h *autoscaleHistory) decide(p autoscalePolicy, now time.Time, current int32, lagSeconds int64) int32 {
	if h.since.IsZero() {
		h.since = now
	}
	h.recs = append(h.recs, recommendation{at: now, shards: p.recommend(current, lagSeconds)})
	keep := max(p.upWindow, p.downWindow)
	i := 0
	for i < len(h.recs)-1 && now.Sub(h.recs[i].at) > keep {
		i++
	}
	h.recs = h.recs[i:]

	windowed := func(w time.Duration, pick func(a, b int32) int32) (int32, bool) {
		if now.Sub(h.since) < w {
			return 0, false
		}
		out := h.recs[len(h.recs)-1].shards
		for _, r := range h.recs {
			if now.Sub(r.at) <= w {
				out = pick(out, r.shards)
			}
		}
		return out, true
	}
	if up, ok := windowed(p.upWindow, func(a, b int32) int32 { return min(a, b) }); ok && up > current {
		return up
	}
	if down, ok := windowed(p.downWindow, func(a, b int32) int32 { return max(a, b) }); ok && down < current {
		return down
	}
	return p.clamp(current)
}

// scalingLag returns the lag the autoscaler acts on, whether to act on it at all, and, when the
// lag status shows is above the target but is not acted on as it is, why. While the relays are
// not all available (a Kafka outage makes them unready, as does a crash loop) the lag says
// nothing about the shards needed: no decision. Lag that failed events hold back (a poison event
// under the block policy, parked aggregates, events in retry) is left out: more shards would not
// publish those events (without that measurement, the backlog's age is used as it is).
// kind names the cause alone (the message carries figures that change every pass), so that one
// event is recorded when it starts.
func scalingLag(relay *v1alpha1.OutboxRelay, s *scope, p autoscalePolicy) (lag int64, decide bool, kind, why string) {
	if c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionRelaysAvailable); c != nil && c.Status == metav1.ConditionFalse {
		if s.lagSeconds > p.target {
			kind = "unavailable: " + c.Reason
			why = fmt.Sprintf("not scaling on lag %ds above the target of %ds: the relays are not all available (%s), so it says nothing about the shards needed",
				s.lagSeconds, p.target, c.Reason)
		}
		return 0, false, kind, why
	}
	if !s.scalableKnown {
		return s.lagSeconds, true, "", ""
	}
	if s.lagSeconds > p.target && s.scalableLag <= p.target {
		kind = "failed events"
		why = fmt.Sprintf("lag %ds above the target of %ds is held back by failed events (poison, blocked or parked aggregates), "+
			"which more shards would not publish; the other events' lag is %ds", s.lagSeconds, p.target, s.scalableLag)
	}
	return s.scalableLag, true, kind, why
}

// desiredShards sets status.desiredShards: spec.shards, or, with spec.autoscaling, the built-in
// autoscaler's choice from this pass's lag measurement. The autoscaler waits while a change of
// layout is in progress or the relay is paused, and records its decisions as events and in
// status.autoscaling.
func (r *OutboxRelayReconciler) desiredShards(_ context.Context, s *scope) (Result, error) {
	relay := s.relay
	st := r.stateOf(relay)
	if relay.Spec.Autoscaling == nil {
		st.forgetAutoscale()
		relay.Status.Autoscaling = nil
		relay.Status.DesiredShards = max(relay.Spec.Shards, 1)
		return Result{}, nil
	}
	p := policyOf(relay.Spec.Autoscaling)
	prev := relay.Status.DesiredShards
	if prev == 0 {
		prev = relay.Spec.Shards
	}
	current := p.clamp(prev)
	// No decision while a change of layout is in progress or while paused (the lag of a paused
	// relay says nothing about the shards it needs).
	settled := relay.Status.Shards == 0 || relay.Status.Shards == relay.Status.DesiredShards
	want, lag := current, s.lagSeconds
	if s.lagKnown && settled && !relay.Spec.Paused {
		var (
			decide    bool
			kind, why string
		)
		lag, decide, kind, why = scalingLag(relay, s, p)
		if decide {
			want = st.decide(p, r.Clock.Now(), current, lag)
		}
		if st.hold(kind) && kind != "" {
			r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonScaleHeld, "Autoscale", "%s", why)
			if relay.Status.Autoscaling == nil {
				relay.Status.Autoscaling = &v1alpha1.AutoscalingStatus{}
			}
			relay.Status.Autoscaling.LastDecision = why
		}
	}
	relay.Status.DesiredShards = want
	if relay.Status.Autoscaling == nil {
		relay.Status.Autoscaling = &v1alpha1.AutoscalingStatus{}
	}
	if want != prev {
		var reason, msg string
		switch {
		case want == current: // the bounds moved
			msg = fmt.Sprintf("spec.autoscaling allows %d to %d shards", p.min, p.max)
		case want > current:
			msg = fmt.Sprintf("lag %ds above the target of %ds", lag, p.target)
			if p.upWindow > 0 {
				msg += " for " + p.upWindow.String()
			}
		default:
			msg = fmt.Sprintf("lag %ds at most half the target of %ds", lag, p.target)
			if p.downWindow > 0 {
				msg += " for " + p.downWindow.String()
			}
		}
		reason = v1alpha1.ReasonScaledUp
		if want < prev {
			reason = v1alpha1.ReasonScaledDown
		}
		msg += fmt.Sprintf(": %d -> %d shards", prev, want)
		now := metav1.NewTime(r.Clock.Now())
		relay.Status.Autoscaling.LastScaleTime = &now
		relay.Status.Autoscaling.LastDecision = msg
		r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, reason, "Autoscale", "%s", msg)
	}
	return Result{RequeueAfter: r.AutoscaleInterval}, nil
}
