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

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PartitionsStatus reports the daily partitions that exist.
type PartitionsStatus struct {
	// oldest is the UTC day of the oldest daily partition, YYYY-MM-DD.
	// +optional
	// +kubebuilder:validation:MaxLength=10
	Oldest string `json:"oldest,omitempty"`

	// newest is the UTC day of the newest daily partition, YYYY-MM-DD.
	// +optional
	// +kubebuilder:validation:MaxLength=10
	Newest string `json:"newest,omitempty"`

	// count is the number of daily partitions.
	// +optional
	Count int32 `json:"count,omitempty"`
}

// ReplayStatus reports a replay of retained events (`kubectl outbox replay`, <table>_replays)
// that is not finished.
type ReplayStatus struct {
	// id is the replay's id in <table>_replays.
	// +required
	ID int64 `json:"id"`

	// state is pending (no relay has taken it yet) or running.
	// +required
	// +kubebuilder:validation:Enum=pending;running
	State string `json:"state"`

	// replayed is the number of events published again so far, updated coarsely (with
	// pendingEvents; the relays' outbox_replay_events_total is live).
	// +optional
	Replayed int64 `json:"replayed,omitempty"`

	// total is the number of published events the replay's range held when it was requested.
	// +optional
	Total int64 `json:"total,omitempty"`
}

// ReshardStatus reports a change of the shard layout, read from the database.
type ReshardStatus struct {
	// fromShards is the shard count before the change (0 for the first layout).
	// +optional
	FromShards int32 `json:"fromShards,omitempty"`

	// toShards is the shard count after the change.
	// +required
	ToShards int32 `json:"toShards"`

	// switchedAt is when the layout switched, after every relay of the old layout had released
	// its buckets.
	// +optional
	SwitchedAt *metav1.Time `json:"switchedAt,omitempty"`

	// pauseMilliseconds is how long publishing stopped: from the first relay of the old layout
	// releasing its buckets to every bucket held by the new layout. Unset until then.
	// +optional
	PauseMilliseconds *int64 `json:"pauseMilliseconds,omitempty"`
}

// AutoscalingStatus reports the built-in autoscaler's last decision.
type AutoscalingStatus struct {
	// lastScaleTime is when the autoscaler last changed the shard count.
	// +optional
	LastScaleTime *metav1.Time `json:"lastScaleTime,omitempty"`

	// lastDecision explains the last change.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	LastDecision string `json:"lastDecision,omitempty"`
}

// OutboxRelayStatus is the observed state of an OutboxRelay.
type OutboxRelayStatus struct {
	// conditions: Ready, MigrationsApplied, PartitionsReady, RelaysAvailable, LagWithinTarget,
	// and ShardsSettled (not part of Ready).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the generation of the spec last reconciled without error.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// shards is the shard count of the layout the relays run, as recorded in the database.
	// +optional
	Shards int32 `json:"shards,omitempty"`

	// tracking is the tracking mode the relays run: spec.publish.tracking, or where it is unset
	// the mode the operator resolved from the table when it first saw the OutboxRelay.
	// +optional
	Tracking Tracking `json:"tracking,omitempty"`

	// desiredShards is the shard count the operator moves the layout to: spec.shards, or the
	// built-in autoscaler's choice.
	// +optional
	DesiredShards int32 `json:"desiredShards,omitempty"`

	// lastReshard reports the last change of the shard layout.
	// +optional
	LastReshard *ReshardStatus `json:"lastReshard,omitempty"`

	// autoscaling reports the built-in autoscaler's last decision.
	// +optional
	Autoscaling *AutoscalingStatus `json:"autoscaling,omitempty"`

	// readyShards is the number of relay Deployments with an available pod.
	// +optional
	ReadyShards int32 `json:"readyShards,omitempty"`

	// selector selects the relay pods, for the scale subresource.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Selector string `json:"selector,omitempty"`

	// pendingEvents is the number of unsent events, updated coarsely (live numbers are in the
	// relays' metrics). Exact up to 100,000; above, estimated from the density of the first
	// 100,000 unsent ids.
	// +optional
	PendingEvents *int64 `json:"pendingEvents,omitempty"`

	// lagSeconds is the age of the oldest unsent event, updated coarsely.
	// +optional
	LagSeconds *int64 `json:"lagSeconds,omitempty"`

	// scalableLagSeconds is the lag more shards can fix: the age of the oldest unsent event that
	// is neither a failed event nor held back behind one (parked, or blocked behind it in its
	// aggregate), which more shards would not publish sooner. The built-in autoscaler scales on
	// it; the operator exports it as outbox_relay_scalable_lag_seconds for external autoscalers
	// (the chart's KEDA and HPA examples). Updated with lagSeconds; 0 when nothing is pending.
	// +optional
	ScalableLagSeconds *int64 `json:"scalableLagSeconds,omitempty"`

	// parkedEvents (snapshot tracking) is the number of events waiting in <table>_parked: events
	// that failed and the later events of their aggregates, retried with backoff, counted in
	// pendingEvents. Updated with it, and at once when it becomes or stops being zero. Not set
	// under row tracking, where a failed event keeps its row (attempts, error).
	// +optional
	ParkedEvents *int64 `json:"parkedEvents,omitempty"`

	// tableID identifies the relayed table by what PostgreSQL says once the relay's own
	// credentials got in: a hash of the cluster's system_identifier, the database's OID and the
	// table. Two OutboxRelays with the same tableID relay the same table; the younger one is
	// refused.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	TableID string `json:"tableID,omitempty"`

	// schemaVersion is the migration version of the outbox table.
	// +optional
	SchemaVersion int64 `json:"schemaVersion,omitempty"`

	// partitions reports the daily partitions that exist.
	// +optional
	Partitions *PartitionsStatus `json:"partitions,omitempty"`

	// replay reports the oldest replay not finished (the one the relays run, or run next); absent
	// when none is.
	// +optional
	Replay *ReplayStatus `json:"replay,omitempty"`
}
