package v1alpha1

import (
	"strings"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// RoutingSpec says where each event goes and under which key, beyond the topics map.
type RoutingSpec struct {
	// topicBy is the column whose value spec.topics maps to a topic: AggregateType (unset: the
	// event's aggregate_type) or EventType (its event_type: one topic per kind of event).
	// +optional
	TopicBy TopicBy `json:"topicBy,omitempty"`

	// topicHeader names a member of the row's headers (the headers argument of the writer
	// library's Append or of the table's SQL append) that, where a row has it, is the event's
	// topic, before spec.topics and spec.defaultTopic; a row without it is routed by them. A
	// value that is not a valid topic name makes the event poison (spec.poisonEvents). Any
	// topic the relay's Kafka principal may write can be named this way: restrict it with the
	// principal's ACLs. The header is published too.
	// +optional
	TopicHeader HeaderName `json:"topicHeader,omitempty"`

	// keyHeader names a member of the row's headers that, where a row has it, is the record's
	// key instead of the aggregate id (for example the entity a compacted topic keeps the last
	// state of); the key picks the partition as a Java producer's would. Kafka orders records
	// within a partition only: events of one aggregate with different keys may land on
	// different partitions and be read in any order (and one whose publish failed may follow a
	// later one that succeeded), so give all events of an aggregate the same key where order
	// matters. The header is published too.
	// +optional
	KeyHeader HeaderName `json:"keyHeader,omitempty"`
}

// HeaderName names a member of an event's headers: 1 to 128 characters, not one of the headers
// the relay sets itself (event_id, event_type, aggregate_type, aggregate_id, error,
// original_topic, outbox_replay).
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=128
// +kubebuilder:validation:XValidation:rule="!(self in ['event_id', 'event_type', 'aggregate_type', 'aggregate_id', 'error', 'original_topic', 'outbox_replay'])",message="the relay sets this header itself: a row's headers cannot carry it"
type HeaderName string

// TopicBy is the column the topics map matches.
// +kubebuilder:validation:Enum=AggregateType;EventType
type TopicBy string

// Columns the topics map may match.
const (
	TopicByAggregateType TopicBy = "AggregateType"
	TopicByEventType     TopicBy = "EventType"
)

// Mode returns the column in the contract's spelling: EventType is contract.TopicByEventType,
// AggregateType or unset contract.TopicByAggregateType.
func (t TopicBy) Mode() contract.TopicBy {
	if t == TopicByEventType {
		return contract.TopicByEventType
	}
	return contract.TopicByAggregateType
}

// Compression is the codec of the record batches the relays produce.
// +kubebuilder:validation:Enum=None;Gzip;Snappy;Lz4;Zstd
type Compression string

// Codecs.
const (
	CompressionNone   Compression = "None"
	CompressionGzip   Compression = "Gzip"
	CompressionSnappy Compression = "Snappy"
	CompressionLz4    Compression = "Lz4"
	CompressionZstd   Compression = "Zstd"
)

// Mode returns the codec in the contract's spelling (unset: contract.CompressionNone).
func (c Compression) Mode() contract.Compression {
	for _, m := range contract.Compressions {
		if strings.EqualFold(string(m), string(c)) {
			return m
		}
	}
	return contract.CompressionNone
}

// KafkaTopicsSpec says what the operator does about the topics the relays publish to.
// +kubebuilder:validation:XValidation:rule="self.policy == 'Create' || (!has(self.partitions) && !has(self.replicationFactor) && !has(self.configs))",message="partitions, replicationFactor and configs are the settings of topics the operator creates: set policy: Create, or leave them out"
type KafkaTopicsSpec struct {
	// policy is Ignore (the operator neither reads nor creates topics: for clusters whose topics
	// are managed elsewhere, such as Strimzi's KafkaTopic), Verify (it checks the topics after
	// every change of the spec and every 5 minutes, and says what is wrong in the TopicsReady
	// condition: a topic that does not exist, a topic with one replica on a cluster of several
	// brokers, min.insync.replicas below 2 on a replicated topic, where acks=all then means one
	// copy) or Create (as Verify, and a topic that does not exist is created with the settings
	// below; an existing topic is never changed). Topics routed by a header are not known ahead
	// and are neither checked nor created.
	// +required
	Policy TopicPolicy `json:"policy"`

	// partitions of a topic the operator creates. Unset: the broker's num.partitions. The
	// partition of an aggregate follows from the count: never change it on a topic in use.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	Partitions *int32 `json:"partitions,omitempty"`

	// replicationFactor of a topic the operator creates. Unset: the broker's
	// default.replication.factor.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	ReplicationFactor *int32 `json:"replicationFactor,omitempty"`

	// configs of a topic the operator creates, such as retention.ms, cleanup.policy or
	// min.insync.replicas (Kafka's topic configs; the broker refuses an unknown one, and the
	// TopicsReady condition says so).
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z0-9.]{1,128}$'))",message="configs: names are Kafka topic configs, such as retention.ms"
	Configs map[string]string `json:"configs,omitempty"`
}

// TopicPolicy says whether the operator checks or creates topics.
// +kubebuilder:validation:Enum=Ignore;Verify;Create
type TopicPolicy string

// Topic policies.
const (
	TopicsIgnore TopicPolicy = "Ignore"
	TopicsVerify TopicPolicy = "Verify"
	TopicsCreate TopicPolicy = "Create"
)

// NullPayload is what an event without a value becomes.
// +kubebuilder:validation:Enum=Poison;Tombstone
type NullPayload string

// Choices of NullPayload.
const (
	NullPayloadPoison    NullPayload = "Poison"
	NullPayloadTombstone NullPayload = "Tombstone"
)

// Mode returns the choice in the contract's spelling (unset: contract.NullPayloadPoison).
func (n NullPayload) Mode() contract.NullPayload {
	if n == NullPayloadTombstone {
		return contract.NullPayloadTombstone
	}
	return contract.NullPayloadPoison
}

// CloudEventsSpec says how events are published as CloudEvents.
type CloudEventsSpec struct {
	// mode is Binary (the payload stays the value, with a content-type header and every
	// attribute as a ce_ header) or Structured (the whole event is the value, a JSON object of
	// type application/cloudevents+json whose data is the payload, data_base64 for a bytes
	// payload). Either way id is the event id, type the event type, subject the aggregate id,
	// time the event's created_at, and the event's headers whose names are valid attribute
	// names (lower-case letters and digits, at most 20) are extensions, traceparent among them;
	// the relay's own headers stay (the inbox library reads event_id).
	// +required
	Mode CloudEventsMode `json:"mode"`

	// source is the source attribute, a URI-reference. Unset: /outbox-operator/<namespace>/<name>
	// of the OutboxRelay.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^[^\s"]+$`
	Source string `json:"source,omitempty"`
}

// CloudEventsMode is a content mode of the CloudEvents Kafka protocol binding.
// +kubebuilder:validation:Enum=Binary;Structured
type CloudEventsMode string

// CloudEvents modes.
const (
	CloudEventsBinary     CloudEventsMode = "Binary"
	CloudEventsStructured CloudEventsMode = "Structured"
)

// Mode returns the mode in the contract's spelling.
func (m CloudEventsMode) Mode() contract.CloudEvents {
	if m == CloudEventsStructured {
		return contract.CloudEventsStructured
	}
	return contract.CloudEventsBinary
}

// TracingSpec says where the relays export their spans.
type TracingSpec struct {
	// otlpEndpoint is the URL of an OTLP/gRPC receiver, such as an OpenTelemetry collector:
	// http://host:4317 (plaintext) or https://host:4317 (TLS). The relays export one producer
	// span per published event (messaging attributes: system, destination, partition, message
	// id; and the time from commit to publish), in batches; an endpoint that does not answer
	// costs dropped spans, never a publish.
	// +required
	// +kubebuilder:validation:MinLength=8
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^https?://[^\s/]+(/.*)?$`
	OTLPEndpoint string `json:"otlpEndpoint"`

	// samplePercent is the share of events without a sampled traceparent whose publish is
	// traced, 0 to 100 (an event whose traceparent says sampled is always traced). Unset: 100.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	SamplePercent *int32 `json:"samplePercent,omitempty"`
}
