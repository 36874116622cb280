package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/relay"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestRecommend(t *testing.T) {
	p := autoscalePolicy{min: 1, max: 8, target: 30}
	tests := []struct {
		current int32
		lag     int64
		want    int32
	}{
		{1, 0, 1},      // quiet at the minimum
		{4, 0, 3},      // quiet: one fewer
		{4, 15, 3},     // half the target: one fewer
		{4, 16, 4},     // between half and the target: hold
		{4, 30, 4},     // at the target: hold
		{4, 31, 5},     // just above: at least one more
		{2, 90, 6},     // three times the target: three times the shards
		{4, 600, 8},    // capped at max
		{10, 0, 8},     // above max (max lowered): back to max
		{1, 45, 2},     // 1.5x: rounds up
		{3, 1000, 8},   // a burst: straight to max
		{0, 0, 1},      // never below min
		{8, 3000, 8},   // at max already
		{2, 31, 3},     // ceil(2*31/30) = 3
		{5, 14, 4},     // under half: one fewer
		{1, 31, 2},     // one shard, just above target
		{6, 20, 6},     // 2/3 of target: hold
		{8, 0, 7},      // from max, quiet: one fewer
		{3, 60, 6},     // twice the target
		{3, 59, 6},     // ceil(3*59/30) = 6
		{3, 61, 7},     // ceil(3*61/30) = 7
		{7, 100000, 8}, // huge lag, capped
	}
	for _, tc := range tests {
		if got := p.recommend(tc.current, tc.lag); got != tc.want {
			t.Errorf("recommend(%d shards, lag %ds) = %d, want %d", tc.current, tc.lag, got, tc.want)
		}
	}
}

// TestAutoscaleStabilization drives the decision with a clock: a burst scales up after the
// scale-up window and at once with a window of 0; a quiet period scales down one shard per
// scale-down window; a short dip between bursts does not scale down (no flapping).
func TestAutoscaleStabilization(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	type step struct {
		at   time.Duration
		lag  int64
		want int32
	}
	tests := map[string]struct {
		p     autoscalePolicy
		steps []step
	}{
		"burst with no up window": {
			p:     autoscalePolicy{min: 1, max: 8, target: 30, downWindow: time.Minute},
			steps: []step{{0, 0, 1}, {10 * time.Second, 120, 4}, {20 * time.Second, 120, 8}},
		},
		"burst must last the up window": {
			p: autoscalePolicy{min: 1, max: 8, target: 30, upWindow: 20 * time.Second, downWindow: time.Minute},
			steps: []step{
				{0, 0, 1}, {10 * time.Second, 120, 1}, {20 * time.Second, 0, 1}, // a spike of one measurement
				{30 * time.Second, 120, 1}, {40 * time.Second, 120, 1}, {50 * time.Second, 120, 4},
			},
		},
		"quiet scales down one shard per window": {
			p: autoscalePolicy{min: 1, max: 8, target: 30, downWindow: 30 * time.Second},
			steps: []step{
				{0, 600, 8}, {10 * time.Second, 0, 8}, {20 * time.Second, 0, 8}, {30 * time.Second, 0, 8},
				{40 * time.Second, 0, 7}, {50 * time.Second, 0, 7}, {60 * time.Second, 0, 7}, {70 * time.Second, 0, 7},
				{80 * time.Second, 0, 6},
			},
		},
		"a dip between bursts does not scale down": {
			p: autoscalePolicy{min: 1, max: 8, target: 30, downWindow: 30 * time.Second},
			steps: []step{
				{0, 120, 4}, {10 * time.Second, 0, 4}, {20 * time.Second, 0, 4}, {30 * time.Second, 20, 4},
				{40 * time.Second, 0, 4}, {50 * time.Second, 0, 4}, {60 * time.Second, 25, 4}, {70 * time.Second, 0, 4},
			},
		},
		"min and max bound it": {
			p:     autoscalePolicy{min: 2, max: 3, target: 10},
			steps: []step{{0, 0, 2}, {time.Second, 1000, 3}, {2 * time.Second, 1000, 3}, {3 * time.Second, 0, 2}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var h autoscaleHistory
			current := tc.p.min
			for i, st := range tc.steps {
				current = h.decide(tc.p, t0.Add(st.at), current, st.lag)
				if current != st.want {
					t.Fatalf("step %d (t+%s, lag %ds): %d shards, want %d", i, st.at, st.lag, current, st.want)
				}
			}
		})
	}
}

// TestDesiredShardsStep: the step that writes status.desiredShards follows spec.shards without
// autoscaling, scales and records an event and status on lag with it, and holds while the relay
// is paused or a change of layout is in progress.
func TestDesiredShardsStep(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	auto := &v1alpha1.AutoscalingSpec{MinShards: 1, MaxShards: 8, TargetLagSeconds: 10,
		ScaleUpStabilization: &metav1.Duration{}, ScaleDownStabilization: &metav1.Duration{Duration: time.Minute}}
	unavailable := []metav1.Condition{{Type: v1alpha1.ConditionRelaysAvailable, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonRelaysUnavailable}}
	scalable := func(n int64) *int64 { return &n }
	tests := map[string]struct {
		autoscaling *v1alpha1.AutoscalingSpec
		paused      bool
		shards      int32 // spec.shards
		status      v1alpha1.OutboxRelayStatus
		lag         int64
		scalable    *int64 // the lag more shards can fix, when measured
		want        int32
		wantEvent   string
	}{
		"relays unavailable (a Kafka outage): hold": {autoscaling: auto, shards: 1, status: v1alpha1.OutboxRelayStatus{Shards: 2, DesiredShards: 2, Conditions: unavailable},
			lag: 400, scalable: scalable(400), want: 2, wantEvent: "Normal ScaleHeld not scaling on lag 400s above the target of 10s: the relays are not all available (RelaysUnavailable)"},
		"relays unavailable, lag within target: hold quietly": {autoscaling: auto, shards: 1, status: v1alpha1.OutboxRelayStatus{Shards: 2, DesiredShards: 2, Conditions: unavailable},
			lag: 3, want: 2},
		"lag of failed events: no scale up": {autoscaling: auto, shards: 1, status: v1alpha1.OutboxRelayStatus{Shards: 2, DesiredShards: 2},
			lag: 400, scalable: scalable(1), want: 2, wantEvent: "Normal ScaleHeld lag 400s above the target of 10s is held back by failed events"},
		"lag of failed events and of others: scale on the others'": {autoscaling: auto, shards: 1, status: v1alpha1.OutboxRelayStatus{Shards: 2, DesiredShards: 2},
			lag: 400, scalable: scalable(20), want: 4, wantEvent: "Normal ScaledUp lag 20s above the target of 10s: 2 -> 4 shards"},
		"no autoscaling: spec.shards":        {shards: 3, status: v1alpha1.OutboxRelayStatus{Shards: 2, DesiredShards: 2}, lag: 100, want: 3},
		"lag above target: scale up":         {autoscaling: auto, shards: 1, status: v1alpha1.OutboxRelayStatus{Shards: 2, DesiredShards: 2}, lag: 40, want: 8, wantEvent: "Normal ScaledUp lag 40s above the target of 10s: 2 -> 8 shards"},
		"first pass starts from spec.shards": {autoscaling: auto, shards: 2, lag: 20, want: 4, wantEvent: "Normal ScaledUp"},
		"paused: hold":                       {autoscaling: auto, paused: true, shards: 1, status: v1alpha1.OutboxRelayStatus{Shards: 2, DesiredShards: 2}, lag: 400, want: 2},
		"resharding: hold":                   {autoscaling: auto, shards: 1, status: v1alpha1.OutboxRelayStatus{Shards: 2, DesiredShards: 4}, lag: 400, want: 4},
		"below min after a spec change":      {autoscaling: &v1alpha1.AutoscalingSpec{MinShards: 3, MaxShards: 8, TargetLagSeconds: 10}, shards: 1, status: v1alpha1.OutboxRelayStatus{Shards: 1, DesiredShards: 1}, lag: 6, want: 3, wantEvent: "Normal ScaledUp spec.autoscaling allows 3 to 8 shards: 1 -> 3 shards"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rec := events.NewFakeRecorder(10)
			r := &OutboxRelayReconciler{Recorder: rec, Clock: clocktesting.NewFakeClock(now), AutoscaleInterval: time.Second}
			relay := testRelay(func(o *v1alpha1.OutboxRelay) {
				o.Spec.Autoscaling, o.Spec.Paused, o.Spec.Shards, o.Status = tc.autoscaling, tc.paused, tc.shards, tc.status
			})
			s := &scope{relay: relay, before: relay.DeepCopy(), lagKnown: true, lagSeconds: tc.lag}
			if tc.scalable != nil {
				s.scalableKnown, s.scalableLag = true, *tc.scalable
			}
			if _, err := r.desiredShards(context.Background(), s); err != nil {
				t.Fatal(err)
			}
			if relay.Status.DesiredShards != tc.want {
				t.Errorf("desiredShards %d, want %d", relay.Status.DesiredShards, tc.want)
			}
			var got string
			select {
			case got = <-rec.Events:
			default:
			}
			if !strings.HasPrefix(got, tc.wantEvent) || (tc.wantEvent == "") != (got == "") {
				t.Errorf("event %q, want %q", got, tc.wantEvent)
			}
			if strings.Contains(tc.wantEvent, "Scaled") && (relay.Status.Autoscaling == nil || relay.Status.Autoscaling.LastDecision == "" || relay.Status.Autoscaling.LastScaleTime == nil) {
				t.Errorf("status.autoscaling %+v", relay.Status.Autoscaling)
			}
			if tc.autoscaling == nil && relay.Status.Autoscaling != nil {
				t.Errorf("status.autoscaling %+v without spec.autoscaling", relay.Status.Autoscaling)
			}
		})
	}
}

// TestAutoscaleBurst: a burst of 300,000 events, a minute old, scales an autoscaled OutboxRelay up
// to its maximum within the scale-up window; real relays (standing in for the pods, whose
// readiness the Deployments follow) drain it; a quiet scale-down window later it is back at its
// minimum. Every decision is an event and in status.
func TestAutoscaleBurst(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	ns := s.env.CreateNamespace(t, "autoscale")
	url := pgtest.NewDatabase(t)
	db := openTestDB(t, url)
	s.createSecret(t, ns, "shop-db", map[string]string{"url": url})
	s.createRelay(t, newRelay(ns, "orders", "shop-db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.DefaultTopic = "test.events"
		r.Spec.Topics = nil
		r.Spec.LagTarget = 3600
		r.Spec.Autoscaling = &v1alpha1.AutoscalingSpec{
			MinShards: 1, MaxShards: 3, TargetLagSeconds: 2,
			ScaleUpStabilization:   &metav1.Duration{Duration: 0},
			ScaleDownStabilization: &metav1.Duration{Duration: 6 * time.Second},
		}
	}))
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionShardsSettled, metav1.ConditionTrue, v1alpha1.ReasonShardsSettled)
	if st := s.getRelay(t, ns, "orders").Status; st.Shards != 1 || st.DesiredShards != 1 {
		t.Fatalf("start: shards %d desired %d", st.Shards, st.DesiredShards)
	}
	// kfake: the broker is not what this test is about, and the relays must not wait for one.
	k := kafkatest.NewKfake(t)
	pods := startFollowers(t, url, k.Brokers, 3, func(c *relay.Config) { c.BatchSize = 100 })
	s.podsFollow(t, ns, "orders", pods)
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionRelaysAvailable, metav1.ConditionTrue, v1alpha1.ReasonRelaysAvailable)

	// The burst was written a minute ago (as if the writers' own commits had been held up), so it
	// is past the target at once; one shard drains it for several measurements.
	if _, err := db.ExecContext(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT 'order', 'o-' || (i % 5000), 'created', '{}', now() - interval '1 minute' FROM generate_series(1, 300000) i`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	eventually(t, time.Minute, func() error {
		if st := s.getRelay(t, ns, "orders").Status; st.DesiredShards < 2 {
			return fmt.Errorf("desired %d shards, lag %d", st.DesiredShards, ptr.Deref(st.LagSeconds, -1))
		}
		return nil
	})
	t.Logf("the autoscaler asked for more shards %s after the burst (target lag 2s, up window 0s)", time.Since(start).Round(100*time.Millisecond))
	// The layout follows the autoscaler up to the maximum while the oldest unsent event keeps
	// ageing until the backlog is drained.
	eventually(t, time.Minute, func() error {
		st := s.getRelay(t, ns, "orders").Status
		if st.Shards != 3 {
			return fmt.Errorf("layout %d shards, desired %d, lag %d", st.Shards, st.DesiredShards, ptr.Deref(st.LagSeconds, -1))
		}
		return nil
	})
	eventually(t, 2*time.Minute, func() error {
		var left int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM public.outbox WHERE sent_at IS NULL`).Scan(&left); err != nil {
			return err
		}
		if left > 0 {
			return fmt.Errorf("%d events left; relays ready %s", left, readyFollowers(pods))
		}
		return nil
	})
	drained := time.Now()
	relay := s.waitResharded(t, ns, "orders", 2, 1)
	t.Logf("back to 1 shard %s after the backlog drained", time.Since(drained).Round(time.Second))
	if time.Since(drained) < 6*time.Second {
		t.Errorf("scaled down before the scale-down window of 6s passed")
	}
	st := relay.Status
	if st.Autoscaling == nil || st.Autoscaling.LastScaleTime == nil || st.Autoscaling.LastDecision == "" {
		t.Errorf("status.autoscaling %+v", st.Autoscaling)
	}
	evs := s.waitEvents(t, ns, "orders", corev1.EventTypeNormal+" "+v1alpha1.ReasonScaledUp, corev1.EventTypeNormal+" "+v1alpha1.ReasonScaledDown)
	t.Logf("events: %q", evs)
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionShardsSettled); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("ShardsSettled %+v", c)
	}
}

// TestAutoscaleHoldsOnLagShardsCannotFix: lag that more shards would not reduce adds none. A
// poison event (a payload over the relays' limit, blocked under the default policy) ages past
// the target while the other events flow; and a Kafka outage (a real broker, stopped) makes the
// relays not ready, their Deployments unavailable and the lag of everything grow. Either way the
// shard count stays at its minimum and a ScaleHeld event says why.
func TestAutoscaleHoldsOnLagShardsCannotFix(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	k := kafkatest.NewApache(t)
	for _, c := range []string{"poison", "outage"} {
		t.Run(c, func(t *testing.T) {
			ns := s.env.CreateNamespace(t, "hold-"+c)
			url := pgtest.NewDatabase(t)
			db := openTestDB(t, url)
			s.createSecret(t, ns, "shop-db", map[string]string{"url": url})
			s.createRelay(t, newRelay(ns, "orders", "shop-db", func(r *v1alpha1.OutboxRelay) {
				r.Spec.DefaultTopic = "test.events"
				r.Spec.Topics = nil
				r.Spec.LagTarget = 3600
				r.Spec.Autoscaling = &v1alpha1.AutoscalingSpec{
					MinShards: 1, MaxShards: 3, TargetLagSeconds: 2,
					ScaleUpStabilization:   &metav1.Duration{Duration: 3 * time.Second},
					ScaleDownStabilization: &metav1.Duration{Duration: time.Minute},
				}
			}))
			s.waitCondition(t, ns, "orders", v1alpha1.ConditionShardsSettled, metav1.ConditionTrue, v1alpha1.ReasonShardsSettled)
			pods := startFollowers(t, url, k.Brokers, 1, func(c *relay.Config) {
				c.MaxPayloadBytes = 1000
				c.KafkaProbeInterval = time.Second
			})
			s.podsFollow(t, ns, "orders", pods)
			s.waitCondition(t, ns, "orders", v1alpha1.ConditionRelaysAvailable, metav1.ConditionTrue, v1alpha1.ReasonRelaysAvailable)

			want := "Normal " + v1alpha1.ReasonScaleHeld + " lag "
			switch c {
			case "poison":
				if _, err := db.ExecContext(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
					VALUES ('order', 'poison', 'created', jsonb_build_object('blob', repeat('x', 5000)))`); err != nil {
					t.Fatal(err)
				}
			case "outage":
				if err := k.Stop(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = k.StartAgain() })
				want = "Normal " + v1alpha1.ReasonScaleHeld + " not scaling on lag"
			}
			// Healthy events keep coming: under the poison they are published, in the outage
			// they pile up.
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					_, _ = db.ExecContext(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'created', '{}')`,
						fmt.Sprintf("o-%d", i%100))
				}
			}()
			defer func() { close(stop); <-done }()
			// Past the target, and past it long enough for the scale-up window several times over.
			eventually(t, time.Minute, func() error {
				if lag := ptr.Deref(s.getRelay(t, ns, "orders").Status.LagSeconds, 0); lag < 10 {
					return fmt.Errorf("lag %ds", lag)
				}
				return nil
			})
			evs := s.waitEvents(t, ns, "orders", want)
			st := s.getRelay(t, ns, "orders").Status
			if st.DesiredShards != 1 || slices.ContainsFunc(evs, func(e string) bool { return strings.Contains(e, v1alpha1.ReasonScaledUp) }) {
				t.Errorf("scaled on lag shards cannot fix: desired %d shards, events %q", st.DesiredShards, evs)
			}
			wantAvailable := map[string]metav1.ConditionStatus{"poison": metav1.ConditionTrue, "outage": metav1.ConditionFalse}[c]
			if a := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionRelaysAvailable); a == nil || a.Status != wantAvailable {
				t.Errorf("RelaysAvailable %+v, want %s", a, wantAvailable)
			}
			t.Logf("lag %ds, desired %d shard; events %q", ptr.Deref(st.LagSeconds, 0), st.DesiredShards, evs)
		})
	}
}
