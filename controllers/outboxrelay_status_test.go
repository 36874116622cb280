package controllers

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
)

type wantCondition struct {
	status  metav1.ConditionStatus
	reason  string
	message string // substring
}

func checkCondition(t *testing.T, relay *v1alpha1.OutboxRelay, typ string, want wantCondition) {
	t.Helper()
	c := meta.FindStatusCondition(relay.Status.Conditions, typ)
	if c == nil {
		t.Fatalf("no %s condition", typ)
	}
	if c.Status != want.status || c.Reason != want.reason || !strings.Contains(c.Message, want.message) {
		t.Errorf("%s = %s/%s %q, want %s/%s containing %q", typ, c.Status, c.Reason, c.Message, want.status, want.reason, want.message)
	}
	if c.ObservedGeneration != relay.Generation {
		t.Errorf("%s observedGeneration %d, want %d", typ, c.ObservedGeneration, relay.Generation)
	}
}

func TestSetMigrationsCondition(t *testing.T) {
	tests := map[string]struct {
		obs         migrationsObservation
		want        wantCondition
		wantVersion int64
	}{
		"applied": {migrationsObservation{version: 3, latest: 3},
			wantCondition{metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied, "version 3"}, 3},
		"secret missing": {migrationsObservation{reason: v1alpha1.ReasonSecretNotFound, message: `database: Secret "db" not found`},
			wantCondition{metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound, `Secret "db" not found`}, 0},
		"unreachable": {migrationsObservation{reason: v1alpha1.ReasonDatabaseUnreachable, message: "cannot reach the database: connection refused"},
			wantCondition{metav1.ConditionFalse, v1alpha1.ReasonDatabaseUnreachable, "connection refused"}, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			relay := testRelay()
			setMigrationsCondition(relay, tc.obs)
			checkCondition(t, relay, v1alpha1.ConditionMigrationsApplied, tc.want)
			if relay.Status.SchemaVersion != tc.wantVersion {
				t.Errorf("schemaVersion %d, want %d", relay.Status.SchemaVersion, tc.wantVersion)
			}
		})
	}
}

func TestSetPartitionsCondition(t *testing.T) {
	tests := map[string]struct {
		obs  partitionsObservation
		want wantCondition
	}{
		"ready": {partitionsObservation{first: "2026-11-20", last: "2026-12-02", count: 13, through: "2026-12-02"},
			wantCondition{metav1.ConditionTrue, v1alpha1.ReasonPartitionsReady, "through 2026-12-02"}},
		"kept past retention": {partitionsObservation{count: 5, kept: []string{"outbox_p20261101", "outbox_p20261102"}},
			wantCondition{metav1.ConditionFalse, v1alpha1.ReasonRetentionBlocked, "outbox_p20261101, outbox_p20261102"}},
		"failed": {partitionsObservation{reason: v1alpha1.ReasonPartitionMaintenanceFailed, message: "creating partitions failed"},
			wantCondition{metav1.ConditionFalse, v1alpha1.ReasonPartitionMaintenanceFailed, "creating partitions failed"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			relay := testRelay()
			setPartitionsCondition(relay, tc.obs)
			checkCondition(t, relay, v1alpha1.ConditionPartitionsReady, tc.want)
			if tc.obs.count > 0 && (relay.Status.Partitions == nil || relay.Status.Partitions.Count != tc.obs.count) {
				t.Errorf("status.partitions %+v", relay.Status.Partitions)
			}
		})
	}
}

func TestSetRelaysCondition(t *testing.T) {
	tests := map[string]struct {
		obs  relaysObservation
		want wantCondition
	}{
		"all available":  {relaysObservation{shards: 4, ready: 4}, wantCondition{metav1.ConditionTrue, v1alpha1.ReasonRelaysAvailable, "4 of 4"}},
		"some available": {relaysObservation{shards: 4, ready: 3}, wantCondition{metav1.ConditionFalse, v1alpha1.ReasonRelaysUnavailable, "3 of 4"}},
		"none yet":       {relaysObservation{shards: 1}, wantCondition{metav1.ConditionFalse, v1alpha1.ReasonRelaysUnavailable, "0 of 1"}},
		"paused":         {relaysObservation{shards: 2, paused: true}, wantCondition{metav1.ConditionFalse, v1alpha1.ReasonPaused, "paused"}},
		"kafka refuses them": {relaysObservation{shards: 2, ready: 1, kafka: contract.RelayKafkaRefused},
			wantCondition{metav1.ConditionFalse, v1alpha1.ReasonKafkaRefused, "1 of 2 relay shards available: the Kafka cluster refuses the relays"}},
		"no broker answers": {relaysObservation{shards: 1, kafka: contract.RelayKafkaUnreachable},
			wantCondition{metav1.ConditionFalse, v1alpha1.ReasonKafkaUnreachable, "no Kafka broker answers"}},
		"a relay reported kafka, all available since": {relaysObservation{shards: 1, ready: 1, kafka: contract.RelayKafkaRefused},
			wantCondition{metav1.ConditionTrue, v1alpha1.ReasonRelaysAvailable, "1 of 1"}},
		"not owned": {relaysObservation{blocked: v1alpha1.ReasonDeploymentNotOwned, message: `Deployment "x" exists`},
			wantCondition{metav1.ConditionFalse, v1alpha1.ReasonDeploymentNotOwned, `Deployment "x"`}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			relay := testRelay()
			setRelaysCondition(relay, tc.obs)
			checkCondition(t, relay, v1alpha1.ConditionRelaysAvailable, tc.want)
		})
	}
}

func TestSetLagCondition(t *testing.T) {
	tests := map[string]struct {
		obs  lagObservation
		want wantCondition
	}{
		"no backlog":      {lagObservation{known: true, target: 60}, wantCondition{metav1.ConditionTrue, v1alpha1.ReasonLagWithinTarget, "60s"}},
		"at the target":   {lagObservation{known: true, pending: 5, lagSeconds: 60, target: 60}, wantCondition{metav1.ConditionTrue, v1alpha1.ReasonLagWithinTarget, ""}},
		"over the target": {lagObservation{known: true, pending: 5, lagSeconds: 61, target: 60}, wantCondition{metav1.ConditionFalse, v1alpha1.ReasonLagExceeded, "60s"}},
		"unknown":         {lagObservation{message: "cannot measure lag: timed out"}, wantCondition{metav1.ConditionUnknown, v1alpha1.ReasonLagUnknown, "timed out"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			relay := testRelay()
			setLagCondition(relay, tc.obs)
			checkCondition(t, relay, v1alpha1.ConditionLagWithinTarget, tc.want)
		})
	}
}

func TestSetReadyCondition(t *testing.T) {
	allTrue := func(r *v1alpha1.OutboxRelay) {
		setMigrationsCondition(r, migrationsObservation{version: 3})
		setPartitionsCondition(r, partitionsObservation{through: "2026-12-02"})
		setRelaysCondition(r, relaysObservation{shards: 1, ready: 1})
		setLagCondition(r, lagObservation{known: true, target: 60})
	}
	tests := map[string]struct {
		set  func(*v1alpha1.OutboxRelay)
		want wantCondition
	}{
		"new object": {func(*v1alpha1.OutboxRelay) {},
			wantCondition{metav1.ConditionUnknown, v1alpha1.ReasonNotReconciled, "MigrationsApplied: not reconciled yet"}},
		"all true": {allTrue, wantCondition{metav1.ConditionTrue, v1alpha1.ReasonReady, ""}},
		"relays unavailable": {func(r *v1alpha1.OutboxRelay) {
			allTrue(r)
			setRelaysCondition(r, relaysObservation{shards: 2, ready: 1})
		}, wantCondition{metav1.ConditionFalse, v1alpha1.ReasonRelaysUnavailable, "RelaysAvailable: 1 of 2"}},
		"first failure wins": {func(r *v1alpha1.OutboxRelay) {
			allTrue(r)
			setLagCondition(r, lagObservation{known: true, lagSeconds: 999, target: 60})
			setMigrationsCondition(r, migrationsObservation{reason: v1alpha1.ReasonSecretNotFound, message: "database: Secret \"db\" not found"})
		}, wantCondition{metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound, "MigrationsApplied: database: Secret"}},
		"lag unknown": {func(r *v1alpha1.OutboxRelay) {
			allTrue(r)
			setLagCondition(r, lagObservation{message: "cannot measure lag: timed out"})
		}, wantCondition{metav1.ConditionUnknown, v1alpha1.ReasonLagUnknown, "LagWithinTarget"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			relay := testRelay()
			tc.set(relay)
			setReadyCondition(relay)
			checkCondition(t, relay, v1alpha1.ConditionReady, tc.want)
			if n := len(relay.Status.Conditions); n != 5 {
				t.Errorf("%d conditions, want 5", n)
			}
		})
	}
}

func TestConditionTransitionTimeMovesOnlyOnFlip(t *testing.T) {
	relay := testRelay()
	setRelaysCondition(relay, relaysObservation{shards: 2, ready: 1})
	c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionRelaysAvailable)
	old := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	c.LastTransitionTime = old
	setRelaysCondition(relay, relaysObservation{shards: 2, ready: 0}) // same status, new message
	c = meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionRelaysAvailable)
	if !c.LastTransitionTime.Equal(&old) || c.Message != "0 of 2 relay shards available" {
		t.Errorf("same status moved the transition time or kept the old message: %+v", c)
	}
	setRelaysCondition(relay, relaysObservation{shards: 2, ready: 2})
	c = meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionRelaysAvailable)
	if c.LastTransitionTime.Equal(&old) {
		t.Error("a flip kept the old transition time")
	}
}

func TestApplyLagStatus(t *testing.T) {
	const interval = time.Minute
	obs := func(pending, lag int64) lagObservation {
		return lagObservation{known: true, pending: pending, lagSeconds: lag, target: 60}
	}
	status := func(pending, lag int64) v1alpha1.OutboxRelayStatus {
		return v1alpha1.OutboxRelayStatus{PendingEvents: ptr.To(pending), LagSeconds: ptr.To(lag)}
	}
	tests := map[string]struct {
		st        v1alpha1.OutboxRelayStatus
		obs       lagObservation
		changed   bool
		since     time.Duration
		wantWrite bool
		want      [2]int64
	}{
		"first observation":             {v1alpha1.OutboxRelayStatus{}, obs(10, 3), false, 0, true, [2]int64{10, 3}},
		"within interval, no flip":      {status(10, 3), obs(50, 9), false, 10 * time.Second, false, [2]int64{10, 3}},
		"within interval, flip":         {status(10, 3), obs(5000, 90), true, 10 * time.Second, true, [2]int64{5000, 90}},
		"within interval, drained":      {status(10, 3), obs(0, 0), false, 10 * time.Second, true, [2]int64{0, 0}},
		"after interval":                {status(10, 3), obs(50, 9), false, interval, true, [2]int64{50, 9}},
		"after interval, same numbers":  {status(10, 3), obs(10, 3), false, 2 * interval, false, [2]int64{10, 3}},
		"unknown lag keeps old numbers": {status(10, 3), lagObservation{message: "x"}, true, 2 * interval, false, [2]int64{10, 3}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			st := tc.st
			wrote := applyLagStatus(&st, tc.obs, tc.changed, tc.since, interval)
			if wrote != tc.wantWrite {
				t.Errorf("wrote = %v, want %v", wrote, tc.wantWrite)
			}
			got := [2]int64{ptr.Deref(st.PendingEvents, -1), ptr.Deref(st.LagSeconds, -1)}
			if tc.wantWrite || tc.st.PendingEvents != nil {
				if got != tc.want {
					t.Errorf("pending/lag = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// TestApplyLagStatusParked: under snapshot tracking parkedEvents follows the coarse updates of
// pendingEvents, and is written at once when it becomes or stops being zero.
func TestApplyLagStatusParked(t *testing.T) {
	const interval = time.Minute
	obs := func(parked *int64) lagObservation {
		return lagObservation{known: true, pending: 10, lagSeconds: 3, parked: parked, target: 60}
	}
	status := func(parked *int64) v1alpha1.OutboxRelayStatus {
		return v1alpha1.OutboxRelayStatus{PendingEvents: ptr.To[int64](10), LagSeconds: ptr.To[int64](3), ParkedEvents: parked}
	}
	tests := map[string]struct {
		st         v1alpha1.OutboxRelayStatus
		obs        lagObservation
		since      time.Duration
		wantWrite  bool
		wantParked int64 // -1: not set
	}{
		"row tracking sets none":          {v1alpha1.OutboxRelayStatus{}, obs(nil), 0, true, -1},
		"first snapshot observation":      {v1alpha1.OutboxRelayStatus{}, obs(ptr.To[int64](0)), 0, true, 0},
		"events parked, within interval":  {status(ptr.To[int64](0)), obs(ptr.To[int64](4)), time.Second, true, 4},
		"more parked, within interval":    {status(ptr.To[int64](4)), obs(ptr.To[int64](9)), time.Second, false, 4},
		"more parked, after interval":     {status(ptr.To[int64](4)), obs(ptr.To[int64](9)), interval, true, 9},
		"parked retried, within interval": {status(ptr.To[int64](9)), obs(ptr.To[int64](0)), time.Second, true, 0},
		"switched to snapshot, within":    {status(nil), obs(ptr.To[int64](0)), time.Second, true, 0},
		"same numbers after interval":     {status(ptr.To[int64](4)), obs(ptr.To[int64](4)), 2 * interval, false, 4},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			st := tc.st
			if wrote := applyLagStatus(&st, tc.obs, false, tc.since, interval); wrote != tc.wantWrite {
				t.Errorf("wrote = %v, want %v", wrote, tc.wantWrite)
			}
			if got := ptr.Deref(st.ParkedEvents, -1); got != tc.wantParked {
				t.Errorf("parkedEvents = %d, want %d", got, tc.wantParked)
			}
		})
	}
}
