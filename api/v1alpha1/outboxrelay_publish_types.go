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

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// Tracking says how the relays keep their progress.
// +kubebuilder:validation:Enum=Row;Snapshot
type Tracking string

// Tracking modes (docs/architecture.md, "Tracking progress").
const (
	// TrackRow marks every published event sent in its row (sent_at, attempts, error).
	TrackRow Tracking = "Row"
	// TrackSnapshot never updates an event row: the relays publish the events committed between
	// two PostgreSQL snapshots and keep one cursor row per shard; failed events are parked in
	// <table>_parked with the later events of their aggregates and retried from there.
	TrackSnapshot Tracking = "Snapshot"
)

// PublishSpec tunes the relay loop.
// +kubebuilder:validation:XValidation:rule="!has(self.schemaRegistry) || !has(self.cloudEvents) || self.cloudEvents.mode != 'Structured'",message="publish.schemaRegistry frames the payload, and cloudEvents' Structured mode makes the whole event the value: use Binary mode"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.tracking) || oldSelf.tracking != 'Snapshot' || (has(self.tracking) && self.tracking == 'Snapshot')",message="publish.tracking cannot go back from Snapshot to Row: rows published under Snapshot are not marked sent, so a Row relay would publish them all again. Row to Snapshot is supported"
// +kubebuilder:validation:XValidation:rule="!has(self.delivery) || self.delivery != 'ExactlyOnce' || (has(self.tracking) && self.tracking == 'Snapshot')",message="publish.delivery ExactlyOnce needs publish.tracking: Snapshot (set it): under Row a row's sent_at is written after its publish, and that gap is at-least-once by construction"
// +kubebuilder:validation:XValidation:rule="!has(self.delivery) || self.delivery != 'ExactlyOnce' || has(self.cursorTopic)",message="publish.delivery ExactlyOnce needs publish.cursorTopic: the compacted topic the shards' cursor records go to, in the transactions of their batches"
type PublishSpec struct {
	// delivery is the guarantee the relays publish with. AtLeastOnce (the default): every event
	// reaches Kafka; a relay killed or fenced may publish some again, which consumers drop by
	// event_id. ExactlyOnce (tracking Snapshot): each batch's events and the shard's cursor go
	// to Kafka in one transaction, the shard's transactional id fenced by each new relay, so
	// that a consumer reading with isolation.level=read_committed sees every event once; the
	// database's cursor is a copy written after each commit. Resharding (spec.shards,
	// autoscaling) keeps it: a new layout fences the old layout's transactional ids and takes
	// their committed cursors before it publishes. It costs the broker about
	// three times the CPU per event at steady rates (a transaction per batch) and holds
	// read_committed consumers back until each commit. The relays' Kafka principal needs Write
	// and Describe on the transactional ids that start with outbox-relay/, and Read on
	// cursorTopic.
	// +optional
	Delivery Delivery `json:"delivery,omitempty"`

	// cursorTopic is exactly-once delivery's compacted topic of the shards' cursor records (one
	// record per shard and layout). Under kafka.topics policy Create the operator creates it
	// with cleanup.policy compact.
	// +optional
	CursorTopic TopicName `json:"cursorTopic,omitempty"`

	// tracking is how the relays keep their progress. Snapshot never updates an event row: the
	// relays read the events committed between two PostgreSQL snapshots and record one cursor per
	// shard per batch, several times faster and independent of vacuum; failed events are parked
	// in <table>_parked with the later events of their aggregates. Row marks each published event
	// sent in its row: outcome and attempts visible per row to plain SQL, one UPDATE (and one dead
	// tuple) per event. Unset, the operator resolves it once from the table and records it in
	// status.tracking: Snapshot for a table no relay has published from (the default) or one a
	// snapshot relay tracks, Row for a table whose rows a row relay marked sent (so an OutboxRelay
	// of an earlier release, whose default was Row, keeps Row). Row may change to Snapshot at any
	// time (the first batch publishes every event still unsent); Snapshot cannot change back.
	// +optional
	Tracking Tracking `json:"tracking,omitempty"`

	// batchSize is the number of rows fetched, published and marked per round trip.
	// +optional
	// +kubebuilder:default=500
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	BatchSize int32 `json:"batchSize,omitempty"`

	// pollInterval is how often a relay that has just published looks for rows, a duration such
	// as 20ms or 1s, between 10ms and 1h (under load it never sleeps). While it finds nothing it
	// backs off, up to idlePollInterval. Default 10ms; with notify, 10s (the fallback for a
	// notification that does not come).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="pollInterval must be a duration such as 5s, 500ms or 1m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') || (duration(self) >= duration('10ms') && duration(self) <= duration('1h'))",message="pollInterval must be between 10ms and 1h"
	PollInterval *metav1.Duration `json:"pollInterval,omitempty"`

	// notify wakes an idle relay by LISTEN/NOTIFY as soon as a transaction commits events
	// (about a millisecond rather than up to pollInterval), at a cost to the application: the
	// operator creates the table's insert trigger, which every inserting statement evaluates
	// (with 32 durable writers about 8% of their throughput even while no relay waits; see
	// docs/benchmarks.md, "The write path"). false (the default): the relays poll every
	// pollInterval and the table has no insert trigger, so the application's inserts pay nothing
	// for wake-ups. Either change takes the table's lock for a moment.
	// +optional
	// +kubebuilder:default=false
	Notify *bool `json:"notify,omitempty"` //nolint:kubeapilinter // nobools: a v1alpha1 field users set; an enum would break their manifests (left for the next API version)

	// maxDelay is the latency budget of a batch, a duration between 0s and 1s: after a fetch
	// that found events and did not fill a batch, a relay fetches again only this long after
	// that fetch began, so that at steady rates what commits meanwhile is published in one round
	// trip and one produce request per partition (fewer statements, transaction ids and produce
	// requests per event, on the database and the broker); the first event after an idle spell
	// and full batches go at once. It adds at most this much to an event's latency. 0s: fetch
	// again at once. Unset: the relay's default, 8ms (docs/benchmarks.md, "Cost per event at each steady rate").
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="maxDelay must be a duration such as 5ms or 100ms"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') || duration(self) <= duration('1s')",message="maxDelay must be between 0s and 1s"
	MaxDelay *metav1.Duration `json:"maxDelay,omitempty"`

	// recordTimestamp is the time each record carries: CreatedAt (unset: the event's
	// created_at, when the application appended it) or ProduceTime (when the relay produced
	// it). With CreatedAt a backlog published late carries its old times, from which the
	// topic's time-based retention counts; a replay's copies carry their produce time.
	// +optional
	RecordTimestamp RecordTimestamp `json:"recordTimestamp,omitempty"`

	// compression is the codec of the record batches the relays produce: None (unset), Gzip,
	// Snappy, Lz4 or Zstd. It costs the relay CPU and saves network and, where the topic's
	// compression.type is producer (Kafka's default), the broker's disk; at steady rates a
	// batch holds few events per partition and compresses little (docs/benchmarks.md,
	// "Compression").
	// +optional
	Compression Compression `json:"compression,omitempty"`

	// nullPayload is what an event without a value becomes (its payload and payload_bytes both
	// NULL, or its payload_bytes empty): Poison (unset: poison, spec.poisonEvents, as a NULL is
	// more likely a bug than a deletion) or Tombstone (a record with a null value, which a
	// compacted topic takes as the deletion of the record's key).
	// +optional
	NullPayload NullPayload `json:"nullPayload,omitempty"`

	// cloudEvents publishes each event as a CloudEvent, in the Kafka protocol binding of the
	// CloudEvents specification. Unset: the payload as the value, with the relay's headers.
	// +optional
	CloudEvents *CloudEventsSpec `json:"cloudEvents,omitempty"`

	// schemaRegistry frames each payload in the Schema Registry wire format, its schema looked up
	// (or registered) in a Confluent-compatible registry. Not with cloudEvents' Structured mode
	// (the value would be the envelope). Unset: payloads as they are.
	// +optional
	SchemaRegistry *SchemaRegistrySpec `json:"schemaRegistry,omitempty"`

	// tracing exports a producer span per published event over OTLP, a child of the traceparent
	// the writer stored with the event. Unset: no tracing.
	// +optional
	Tracing *TracingSpec `json:"tracing,omitempty"`

	// idlePollInterval is the longest wait between two polls of an idle relay, a duration
	// between 0s and 5m. A relay that polls (notify unset) waits, after an idle spell of T, at
	// most T/16 before it looks again (and never less than pollInterval), up to this: an event
	// committed after a second of idle waits at most about 60ms, after a long idle at most this
	// long, and a sparse stream keeps the relay near pollInterval. Idle, each shard then sends its
	// database one small statement per idlePollInterval rather than one per pollInterval (100
	// idle shards: 20 statements/s at the default, against 10,000 at 10ms; docs/benchmarks.md,
	// "Idle shards"). For the first event after an idle spell within milliseconds, set notify
	// instead (at the cost to the writers it states). Unset: 5s. At or below pollInterval
	// (0s too): no backoff.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="idlePollInterval must be a duration such as 5s or 500ms"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') || duration(self) <= duration('5m')",message="idlePollInterval must be between 0s and 5m"
	IdlePollInterval *metav1.Duration `json:"idlePollInterval,omitempty"`

	// waitForStandbys, when set above 0, publishes a batch only once that many streaming
	// standbys have flushed its events' WAL, so that a failover to an asynchronous standby never
	// loses an event that was already published (with asynchronous replication a committed
	// transaction can vanish with the old primary; without this its events may already be in
	// Kafka). It costs the replication lag in latency, and while fewer standbys stream the relays
	// publish nothing. The relay's role needs pg_read_all_stats to read their positions.
	// Unset or 0: publish at once (synchronous replication needs no wait).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16
	WaitForStandbys *int32 `json:"waitForStandbys,omitempty"`

	// maxAttempts is the number of failed publishes after which an event is poison.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxAttempts int32 `json:"maxAttempts,omitempty"`

	// maxPayloadBytes is the largest payload published; larger events are poison.
	// Unset: the relay's default (900000).
	// +optional
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=104857600
	MaxPayloadBytes *int32 `json:"maxPayloadBytes,omitempty"`
}

// RecordTimestamp is the time a published record carries.
// +kubebuilder:validation:Enum=CreatedAt;ProduceTime
type RecordTimestamp string

// Record timestamps.
const (
	// TimestampCreatedAt is the event's created_at.
	TimestampCreatedAt RecordTimestamp = "CreatedAt"
	// TimestampProduceTime is when the relay produced the record.
	TimestampProduceTime RecordTimestamp = "ProduceTime"
)

// PoisonPolicy says what happens to an event that cannot be published.
// +kubebuilder:validation:Enum=Block;DeadLetter
type PoisonPolicy string

// Poison policies.
const (
	// PoisonBlock keeps the aggregate blocked and retries at the longest backoff.
	PoisonBlock PoisonPolicy = "Block"
	// PoisonDeadLetter publishes the event to the dead-letter topic and marks it sent.
	PoisonDeadLetter PoisonPolicy = "DeadLetter"
)

// PoisonEventsSpec says what happens to events that cannot be published: an aggregate type with
// no topic, a payload over the size limit, or an event that failed maxAttempts times.
// +kubebuilder:validation:XValidation:rule="!has(self.policy) || self.policy != 'DeadLetter' || has(self.deadLetterTopic)",message="poisonEvents.deadLetterTopic is required when policy is DeadLetter"
type PoisonEventsSpec struct {
	// policy is Block (default: the aggregate waits, visible in status and metrics) or
	// DeadLetter (the event goes to deadLetterTopic and is marked sent).
	// +optional
	// +kubebuilder:default=Block
	Policy PoisonPolicy `json:"policy,omitempty"`

	// deadLetterTopic receives poison events under the DeadLetter policy.
	// +optional
	DeadLetterTopic TopicName `json:"deadLetterTopic,omitempty"`
}

// Delivery is the guarantee the relays publish with.
// +kubebuilder:validation:Enum=AtLeastOnce;ExactlyOnce
type Delivery string

// Guarantees.
const (
	DeliveryAtLeastOnce Delivery = "AtLeastOnce"
	DeliveryExactlyOnce Delivery = "ExactlyOnce"
)

// Mode returns the guarantee in the contract's spelling (unset: contract.DeliveryAtLeastOnce).
func (d Delivery) Mode() contract.Delivery {
	if d == DeliveryExactlyOnce {
		return contract.DeliveryExactlyOnce
	}
	return contract.DeliveryAtLeastOnce
}
