package contract

import "slices"

// Tracking says how the relays keep their progress (docs/architecture.md, "Tracking progress"):
// the one type of the mode, which the relay runs (--tracking), the operator passes and measures
// by, the API converts its own spelling to (v1alpha1.Tracking.Mode) and the plugin reports.
type Tracking string

const (
	// TrackRow marks every published row sent (sent_at): progress and outcome visible per row.
	TrackRow Tracking = "row"
	// TrackSnapshot never updates an event row: the relay publishes the events committed between
	// two PostgreSQL snapshots and keeps one cursor row per set of buckets; failed events and the
	// later events of their aggregates are parked in <table>_parked and retried from there.
	TrackSnapshot Tracking = "snapshot"
)

// Valid reports whether t is one of the modes.
func (t Tracking) Valid() bool { return t == TrackRow || t == TrackSnapshot }

// Parks reports whether failed events wait in <table>_parked (snapshot tracking) rather than in
// their rows (row tracking).
func (t Tracking) Parks() bool { return t == TrackSnapshot }

// RecordTimestamp says which time a published record carries (relay --record-timestamp).
type RecordTimestamp string

const (
	// TimestampCreated is the event's created_at: when the application's transaction appended
	// it (PostgreSQL's now(), the transaction's start), as Debezium's outbox router can take it
	// from the row. A backlog published late carries its old times, and a topic's time-based
	// retention counts from them.
	TimestampCreated RecordTimestamp = "created"
	// TimestampProduce is when the relay produced the record.
	TimestampProduce RecordTimestamp = "produce"
)

// Valid reports whether t is one of the record timestamps.
func (t RecordTimestamp) Valid() bool { return t == TimestampCreated || t == TimestampProduce }

// PoisonPolicy says what happens to a poison event (relay --poison-policy): an aggregate type
// with no topic, a payload over the size limit, or an event that failed MaxAttempts times.
type PoisonPolicy string

const (
	// PoisonBlock keeps the event's aggregate blocked and retries the event at the longest
	// backoff, visible in the row's attempts and error and in the metrics.
	PoisonBlock PoisonPolicy = "block"
	// PoisonDeadLetter publishes the event, with its headers plus "error", to the dead-letter
	// topic and marks it sent with the error recorded.
	PoisonDeadLetter PoisonPolicy = "dead-letter"
)

// TopicBy names the row column whose value the topic map (--topic-map) matches (relay --topic-by).
type TopicBy string

const (
	// TopicByAggregateType matches the map against aggregate_type (the default).
	TopicByAggregateType TopicBy = "aggregate_type"
	// TopicByEventType matches the map against event_type: one topic per kind of event.
	TopicByEventType TopicBy = "event_type"
)

// Valid reports whether t is one of the columns.
func (t TopicBy) Valid() bool { return t == TopicByAggregateType || t == TopicByEventType }

// Compression is the codec of the record batches the relay produces (relay --compression), in
// kafka-go's and Kafka's spelling.
type Compression string

const (
	CompressionNone   Compression = "none"
	CompressionGzip   Compression = "gzip"
	CompressionSnappy Compression = "snappy"
	CompressionLz4    Compression = "lz4"
	CompressionZstd   Compression = "zstd"
)

// Compressions lists the codecs, CompressionNone first.
var Compressions = []Compression{CompressionNone, CompressionGzip, CompressionSnappy, CompressionLz4, CompressionZstd}

// Valid reports whether c is one of Compressions.
func (c Compression) Valid() bool { return slices.Contains(Compressions, c) }

// NullPayload says what the relay publishes for an event without a value, whose payload and
// payload_bytes are both NULL (or whose payload_bytes is empty): relay --null-payload.
type NullPayload string

const (
	// NullPayloadPoison makes such an event poison (the default): a NULL is more likely a bug
	// than a deletion.
	NullPayloadPoison NullPayload = "poison"
	// NullPayloadTombstone publishes it as a tombstone, a record with a null value, which a
	// compacted topic takes as the deletion of its key.
	NullPayloadTombstone NullPayload = "tombstone"
)

// Valid reports whether n is one of the choices.
func (n NullPayload) Valid() bool { return n == NullPayloadPoison || n == NullPayloadTombstone }

// CloudEvents says whether the relay publishes each event as a CloudEvent, in the Kafka protocol
// binding of the CloudEvents specification (relay --cloudevents).
type CloudEvents string

const (
	// CloudEventsNone publishes the payload as the value with the relay's own headers (the
	// default).
	CloudEventsNone CloudEvents = "none"
	// CloudEventsBinary keeps the payload as the value, with a content-type header and every
	// attribute as a ce_ header.
	CloudEventsBinary CloudEvents = "binary"
	// CloudEventsStructured makes the whole event the value, a JSON object
	// (application/cloudevents+json) whose data is the payload.
	CloudEventsStructured CloudEvents = "structured"
)

// Valid reports whether c is one of the modes.
func (c CloudEvents) Valid() bool {
	return c == CloudEventsNone || c == CloudEventsBinary || c == CloudEventsStructured
}

// SchemaFormat is the schema type of the payloads the relay frames in the Schema Registry wire
// format (relay --schema-format): none frames nothing.
type SchemaFormat string

const (
	// SchemaNone publishes payloads as they are (the default).
	SchemaNone SchemaFormat = "none"
	// SchemaJSON frames the jsonb payload, as it is, under a JSON Schema.
	SchemaJSON SchemaFormat = "json"
	// SchemaAvro frames payload_bytes, Avro's binary encoding written by the application,
	// under an Avro schema.
	SchemaAvro SchemaFormat = "avro"
	// SchemaProtobuf frames payload_bytes, a Protobuf message encoded by the application,
	// under a Protobuf schema (with the message indexes of Confluent's wire format).
	SchemaProtobuf SchemaFormat = "protobuf"
)

// Valid reports whether f is one of the formats.
func (f SchemaFormat) Valid() bool {
	return f == SchemaNone || f == SchemaJSON || f == SchemaAvro || f == SchemaProtobuf
}

// RegistryType is the schemaType the registry's API names the format by ("" for none).
func (f SchemaFormat) RegistryType() string {
	switch f {
	case SchemaJSON:
		return "JSON"
	case SchemaAvro:
		return "AVRO"
	case SchemaProtobuf:
		return "PROTOBUF"
	}
	return ""
}

// SubjectStrategy is how the relay names the registry subject of an event's schema (relay
// --schema-subject-strategy), the strategies of Confluent's serializers, with the event type as
// the record name.
type SubjectStrategy string

const (
	// SubjectTopic is <topic>-value (TopicNameStrategy, the default).
	SubjectTopic SubjectStrategy = "topic"
	// SubjectRecord is <event type> (RecordNameStrategy).
	SubjectRecord SubjectStrategy = "record"
	// SubjectTopicRecord is <topic>-<event type> (TopicRecordNameStrategy).
	SubjectTopicRecord SubjectStrategy = "topic-record"
)

// Valid reports whether s is one of the strategies.
func (s SubjectStrategy) Valid() bool {
	return s == SubjectTopic || s == SubjectRecord || s == SubjectTopicRecord
}

// Subject is the subject of an event of eventType published to topic.
func (s SubjectStrategy) Subject(topic, eventType string) string {
	switch s {
	case SubjectRecord:
		return eventType
	case SubjectTopicRecord:
		return topic + "-" + eventType
	}
	return topic + "-value"
}

// Delivery is the guarantee the relay publishes with (relay --delivery).
type Delivery string

const (
	// DeliveryAtLeastOnce: every event reaches Kafka; a crash or a fenced relay may publish
	// some again (consumers deduplicate by event_id).
	DeliveryAtLeastOnce Delivery = "at-least-once"
	// DeliveryExactlyOnce: each batch and its shard's cursor go to Kafka in one transaction; a
	// read_committed consumer sees every event once (snapshot tracking only).
	DeliveryExactlyOnce Delivery = "exactly-once"
)

// Valid reports whether d is one of the guarantees.
func (d Delivery) Valid() bool { return d == DeliveryAtLeastOnce || d == DeliveryExactlyOnce }
