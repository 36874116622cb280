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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxShards is the largest shard count: every aggregate hashes to one of 256 buckets and a
// shard owns at least one bucket.
const MaxShards = 256

// Defaults of the spec, repeated in the markers below (markers cannot refer to constants).
const (
	DefaultTable           = "outbox"
	DefaultDatabaseURLKey  = "url"
	DefaultCAKey           = "ca.crt"
	DefaultCertKey         = "tls.crt"
	DefaultKeyKey          = "tls.key"
	DefaultSASLUsernameKey = "username"
	DefaultSASLPasswordKey = "password"
)

// TopicName is a Kafka topic name: 1 to 249 characters out of [a-zA-Z0-9._-], neither "." nor "..".
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=249
// +kubebuilder:validation:XValidation:rule="self.matches('^[a-zA-Z0-9._-]+$') && self != '.' && self != '..'",message="must be a Kafka topic name: 1 to 249 characters out of a-z, A-Z, 0-9, '.', '_' and '-', and neither '.' nor '..'"
type TopicName string

// Broker is a Kafka bootstrap address, host:port.
// +kubebuilder:validation:MinLength=3
// +kubebuilder:validation:MaxLength=261
// +kubebuilder:validation:XValidation:rule="self.matches('^([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?([.][a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*|[[][0-9a-fA-F:.]+[]]):[0-9]{1,5}$')",message="must be host:port, for example kafka-0.kafka.svc:9092 or [fd00::1]:9092"
// +kubebuilder:validation:XValidation:rule="!self.matches(':[0-9]{1,5}$') || (int(self.substring(self.lastIndexOf(':') + 1)) >= 1 && int(self.substring(self.lastIndexOf(':') + 1)) <= 65535)",message="port must be between 1 and 65535"
type Broker string

// SecretName is the name of a Secret in the namespace of the OutboxRelay.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=253
// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="must be the name of a Secret: lowercase letters, digits, '-' and '.'"
type SecretName string

// SecretKey is a key in the data of a Secret.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=253
// +kubebuilder:validation:XValidation:rule="self.matches('^[-._a-zA-Z0-9]+$')",message="must be a Secret key: letters, digits, '-', '_' and '.'"
type SecretKey string

// DatabaseSecretRef selects the key of a Secret that holds the libpq URL of the database.
type DatabaseSecretRef struct {
	// name of the Secret, in the namespace of the OutboxRelay.
	// +required
	Name SecretName `json:"name"`

	// key in the Secret's data that holds the URL, for example
	// postgres://user:password@host:5432/dbname?sslmode=require.
	// +optional
	// +kubebuilder:default=url
	Key SecretKey `json:"key,omitempty"`
}

// SecretKeyRef selects one key of a Secret in the namespace of the OutboxRelay.
type SecretKeyRef struct {
	// name of the Secret.
	// +required
	Name SecretName `json:"name"`

	// key in the Secret's data. The default depends on the field: ca.crt, tls.crt or tls.key.
	// +optional
	Key SecretKey `json:"key,omitempty"`
}

// DatabaseSpec says where the outbox table lives.
type DatabaseSpec struct {
	// secretRef points at the libpq URL of the database. The URL is never inlined in the spec,
	// never passed as an argument, and never printed.
	// +required
	SecretRef DatabaseSecretRef `json:"secretRef"`

	// table is the outbox table, "name" or "schema.name" (default schema public). Each part starts
	// with a lowercase letter or '_' and continues with lowercase letters, digits and '_'; the
	// schema has at most 63 characters, the name at most 40 (names derived from it, such as
	// <name>_p20260101, must fit PostgreSQL's 63). It cannot change after creation.
	// +optional
	// +kubebuilder:default=outbox
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=127
	// +kubebuilder:validation:XValidation:rule="self.matches('^([a-z_][a-z0-9_]{0,62}[.])?[a-z_][a-z0-9_]{0,39}$')",message="table must be 'name' or 'schema.name': a schema of 1 to 63 and a name of 1 to 40 characters, each starting with a lowercase letter or '_' followed by lowercase letters, digits or '_' (no quotes, spaces or other characters)"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="database.table is immutable: create another OutboxRelay to relay another table"
	Table string `json:"table,omitempty"`
}

// KafkaTLS configures TLS towards the brokers. Certificates come from Secrets mounted read-only
// into the relay pods; the three references may name one Secret (for example a kubernetes.io/tls
// or cert-manager Secret holding ca.crt, tls.crt and tls.key).
// +kubebuilder:validation:XValidation:rule="has(self.certSecretRef) == has(self.keySecretRef)",message="tls: set certSecretRef and keySecretRef together"
type KafkaTLS struct {
	// enabled turns TLS on.
	// +optional
	// +kubebuilder:default=true
	Enabled bool `json:"enabled"` //nolint:kubeapilinter // nobools: a v1alpha1 field users set; an enum would break their manifests (left for the next API version)

	// caSecretRef selects the CA bundle that signs the brokers' certificates (default key ca.crt).
	// Without it the system roots are used.
	// +optional
	CASecretRef *SecretKeyRef `json:"caSecretRef,omitempty"`

	// certSecretRef selects the client certificate for mutual TLS (default key tls.crt).
	// +optional
	CertSecretRef *SecretKeyRef `json:"certSecretRef,omitempty"`

	// keySecretRef selects the client private key for mutual TLS (default key tls.key).
	// +optional
	KeySecretRef *SecretKeyRef `json:"keySecretRef,omitempty"`

	// insecureSkipVerify turns off verification of the brokers' certificates. For tests only.
	// +optional
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"` //nolint:kubeapilinter // nobools: a v1alpha1 field users set; an enum would break their manifests (left for the next API version)
}

// SASLMechanism is a Kafka SASL mechanism.
// +kubebuilder:validation:Enum=PLAIN;SCRAM-SHA-256;SCRAM-SHA-512
type SASLMechanism string

// SASL mechanisms.
const (
	SASLPlain       SASLMechanism = "PLAIN"
	SASLScramSHA256 SASLMechanism = "SCRAM-SHA-256"
	SASLScramSHA512 SASLMechanism = "SCRAM-SHA-512"
)

// SASLSecretRef selects the Secret that holds the SASL username and password.
type SASLSecretRef struct {
	// name of the Secret.
	// +required
	Name SecretName `json:"name"`

	// usernameKey is the key of the username.
	// +optional
	// +kubebuilder:default=username
	UsernameKey SecretKey `json:"usernameKey,omitempty"`

	// passwordKey is the key of the password.
	// +optional
	// +kubebuilder:default=password
	PasswordKey SecretKey `json:"passwordKey,omitempty"`
}

// SASLPlaintext says whether SASL credentials may travel without TLS.
// +kubebuilder:validation:Enum=Refused;Allowed
type SASLPlaintext string

// SASLPlaintext values.
const (
	SASLPlaintextRefused SASLPlaintext = "Refused"
	SASLPlaintextAllowed SASLPlaintext = "Allowed"
)

// KafkaSASL configures SASL authentication towards the brokers.
type KafkaSASL struct {
	// mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	// +required
	Mechanism SASLMechanism `json:"mechanism"`

	// plaintext says whether the credentials may travel without TLS (kafka.tls.enabled): Refused
	// (the default: the API refuses sasl without tls) or Allowed. PLAIN sends the password itself
	// over the connection; with SCRAM the password stays secret but everything after the
	// handshake, events included, is readable and alterable on the network path.
	// +optional
	// +kubebuilder:default=Refused
	Plaintext SASLPlaintext `json:"plaintext,omitempty"`

	// secretRef selects the credentials. They reach the relay only as environment variables
	// from the Secret.
	// +required
	SecretRef SASLSecretRef `json:"secretRef"`
}

// KafkaSpec says where events are published.
// +kubebuilder:validation:XValidation:rule="!has(self.sasl) || (has(self.tls) && self.tls.enabled) || (has(self.sasl.plaintext) && self.sasl.plaintext == 'Allowed')",message="kafka.sasl without kafka.tls sends the credentials (PLAIN: the password itself) and every event in clear text: enable kafka.tls, or set kafka.sasl.plaintext: Allowed"
type KafkaSpec struct {
	// brokers are the bootstrap addresses, host:port.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	Brokers []Broker `json:"brokers"`

	// tls configures TLS towards the brokers.
	// +optional
	TLS *KafkaTLS `json:"tls,omitempty"`

	// sasl configures SASL authentication.
	// +optional
	SASL *KafkaSASL `json:"sasl,omitempty"`

	// topics says whether the operator checks, or creates, the topics the relays publish to
	// (spec.topics, spec.defaultTopic, the dead-letter topic). Unset: neither.
	// +optional
	Topics *KafkaTopicsSpec `json:"topics,omitempty"`
}

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
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.tracking) || oldSelf.tracking != 'Snapshot' || (has(self.tracking) && self.tracking == 'Snapshot')",message="publish.tracking cannot go back from Snapshot to Row: rows published under Snapshot are not marked sent, so a Row relay would publish them all again. Row to Snapshot is supported"
type PublishSpec struct {
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

// PlainInserts says whether plain INSERTs into the table take the aggregate's lock.
// +kubebuilder:validation:Enum=Locked;Unlocked
type PlainInserts string

// Plain insert modes.
const (
	// InsertsLocked gives the table a BEFORE INSERT trigger that takes the aggregate's lock and
	// draws the row's id after it (migration 00019): plain INSERTs keep per-aggregate order.
	InsertsLocked PlainInserts = "Locked"
	// InsertsUnlocked drops that trigger: only the writer libraries and <table>_append lock.
	InsertsUnlocked PlainInserts = "Unlocked"
)

// WritersSpec says what the table does for the applications that write it.
type WritersSpec struct {
	// plainInserts is Locked (a trigger gives plain INSERTs, from any language or ORM, the
	// per-aggregate commit order outbox.Append and <table>_append have, at a cost to every
	// insert) or Unlocked (no trigger). Unset: the table is left as it is (relay inserts set
	// changes it by hand).
	// +optional
	PlainInserts PlainInserts `json:"plainInserts,omitempty"`
}

// DeletionPolicy says what deleting an OutboxRelay does with the events not yet published.
// +kubebuilder:validation:Enum=Orphan;Drain
type DeletionPolicy string

// Deletion policies.
const (
	// DeleteOrphan stops the relays at once: the events not yet published stay in the table, for
	// whichever relays the table gets next.
	DeleteOrphan DeletionPolicy = "Orphan"
	// DeleteDrain keeps the relays publishing after the delete, until nothing is pending or the
	// drain timeout passed (a finalizer holds the OutboxRelay meanwhile).
	DeleteDrain DeletionPolicy = "Drain"
)

// DeletionSpec says what deleting the OutboxRelay does with the events not yet published.
type DeletionSpec struct {
	// policy is Orphan (the default: the relays stop at once; the events not yet published stay in
	// the table) or Drain (the operator holds the OutboxRelay with a finalizer and keeps its relays
	// running until nothing is pending or drainTimeout passed; Events say what happened, status
	// the pending count meanwhile). kubectl delete --cascade=foreground deletes the relays first,
	// and so drains nothing.
	// +optional
	// +kubebuilder:default=Orphan
	Policy DeletionPolicy `json:"policy,omitempty"`

	// drainTimeout bounds the drain (Drain): past it the OutboxRelay goes with the events still
	// pending, which stay in the table, and an Event says how many. Between 1s and 24h.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="drainTimeout must be a duration such as 10m"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') || (duration(self) >= duration('1s') && duration(self) <= duration('24h'))",message="drainTimeout must be between 1s and 24h"
	DrainTimeout *metav1.Duration `json:"drainTimeout,omitempty"`
}

// PartitionsSpec says how many daily partitions exist ahead of time and how long sent events are kept.
type PartitionsSpec struct {
	// premakeDays is the number of UTC days after today whose partitions are created ahead.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=30
	PremakeDays *int32 `json:"premakeDays,omitempty"`

	// retention is how long a daily partition is kept after its day ended, longer than 24h.
	// A partition that still holds an unsent event is never dropped.
	// +optional
	// +kubebuilder:default="168h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="retention must be a duration such as 168h or 720h"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') || duration(self) > duration('24h')",message="retention must be longer than 24h"
	Retention *metav1.Duration `json:"retention,omitempty"`
}

// RelayPodSpec customises the relay pods.
type RelayPodSpec struct {
	// image of the relay, which must hold the relay binary at /relay. Unset: the operator's
	// default (its --relay-image flag, normally the operator's own image).
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`

	// imagePullPolicy of the relay container.
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// resources of the relay container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// nodeSelector of the relay pods.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// tolerations of the relay pods.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// affinity of the relay pods.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// serviceAccountName of the relay pods.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// databaseSecretRef points at the libpq URL the relay pods connect with, for example as the
	// least-privilege relay role that relay grants --relay-role provides (docs/privileges.md), while
	// the operator's own work (migrations, partition upkeep, status) keeps the owner's URL of
	// spec.database.secretRef. It must name the same database: the operator connects with it once
	// per change of its value to check, and holds the relays back otherwise. A change of its value
	// rolls the relay pods. Unset: the relays use spec.database.secretRef.
	// +optional
	DatabaseSecretRef *DatabaseSecretRef `json:"databaseSecretRef,omitempty"`

	// env adds environment variables to the relay container, for example OUTBOX_LOG_FORMAT=text.
	// The variables the operator sets from the spec (OUTBOX_DATABASE_URL and the other settings
	// of the relay command line) cannot be set here.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(e, e.name != 'OUTBOX_DATABASE_URL')",message="relay.env must not set OUTBOX_DATABASE_URL: the database URL comes only from spec.relay.databaseSecretRef or spec.database.secretRef"
	// +kubebuilder:validation:XValidation:rule="self.all(e, !(e.name in ['OUTBOX_TABLE', 'OUTBOX_SHARD_COUNT', 'OUTBOX_SHARD_INDEX', 'OUTBOX_KAFKA_BROKERS', 'OUTBOX_TOPIC_MAP', 'OUTBOX_DEFAULT_TOPIC', 'OUTBOX_BATCH_SIZE', 'OUTBOX_POLL_INTERVAL', 'OUTBOX_NOTIFY', 'OUTBOX_MAX_DELAY', 'OUTBOX_IDLE_POLL_INTERVAL', 'OUTBOX_WAIT_FOR_STANDBYS', 'OUTBOX_MAX_ATTEMPTS', 'OUTBOX_POISON_POLICY', 'OUTBOX_TRACKING', 'OUTBOX_RECORD_TIMESTAMP', 'OUTBOX_TOPIC_BY', 'OUTBOX_TOPIC_HEADER', 'OUTBOX_KEY_HEADER', 'OUTBOX_COMPRESSION', 'OUTBOX_NULL_PAYLOAD', 'OUTBOX_CLOUDEVENTS', 'OUTBOX_CLOUDEVENTS_SOURCE', 'OUTBOX_OTLP_ENDPOINT', 'OUTBOX_TRACE_SAMPLE_RATIO', 'OUTBOX_DEAD_LETTER_TOPIC', 'OUTBOX_MAX_PAYLOAD_BYTES', 'OUTBOX_HTTP_ADDR', 'OUTBOX_KAFKA_TLS', 'OUTBOX_KAFKA_TLS_CA_FILE', 'OUTBOX_KAFKA_TLS_CERT_FILE', 'OUTBOX_KAFKA_TLS_KEY_FILE', 'OUTBOX_KAFKA_TLS_INSECURE_SKIP_VERIFY', 'OUTBOX_KAFKA_SASL_MECHANISM', 'OUTBOX_KAFKA_SASL_USERNAME', 'OUTBOX_KAFKA_SASL_PASSWORD']))",message="relay.env must not set a variable the operator manages from the spec (OUTBOX_TABLE, OUTBOX_SHARD_*, OUTBOX_KAFKA_*, OUTBOX_TOPIC_MAP, ...): use the matching spec field"
	Env []corev1.EnvVar `json:"env,omitempty"`

	// podAnnotations are added to the relay pods.
	// +optional
	PodAnnotations map[string]string `json:"podAnnotations,omitempty"`

	// podLabels are added to the relay pods. The operator's own labels (app.kubernetes.io/name,
	// app.kubernetes.io/instance, outbox.dev/shard) cannot be set here.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!('app.kubernetes.io/name' in self) && !('app.kubernetes.io/instance' in self) && !('outbox.dev/shard' in self)",message="relay.podLabels must not set app.kubernetes.io/name, app.kubernetes.io/instance or outbox.dev/shard: the operator selects its pods by them"
	PodLabels map[string]string `json:"podLabels,omitempty"`
}

// AutoscalingSpec configures the built-in autoscaler: it moves the shard count between
// minShards and maxShards on lag, through the same safe resharding path as a change of
// spec.shards.
// +kubebuilder:validation:XValidation:rule="self.minShards <= self.maxShards",message="autoscaling.minShards must not exceed autoscaling.maxShards"
type AutoscalingSpec struct {
	// minShards is the fewest shards the autoscaler keeps.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=256
	MinShards int32 `json:"minShards,omitempty"`

	// maxShards is the most shards the autoscaler runs.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=256
	MaxShards int32 `json:"maxShards"`

	// targetLagSeconds is the lag the autoscaler keeps the relays under: above it, it adds shards
	// in proportion (lag / target); at half of it or less, it removes one shard at a time.
	// +optional
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	TargetLagSeconds int32 `json:"targetLagSeconds,omitempty"`

	// scaleUpStabilization is how long lag must stay above target before shards are added (the
	// smallest recommendation of the window wins). 0s scales up at the first measurement.
	// +optional
	// +kubebuilder:default="0s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('1h')",message="scaleUpStabilization must be between 0s and 1h"
	ScaleUpStabilization *metav1.Duration `json:"scaleUpStabilization,omitempty"`

	// scaleDownStabilization is how long lag must stay at half the target or less before a shard
	// is removed (the largest recommendation of the window wins), so a quiet moment between
	// bursts does not scale down.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="scaleDownStabilization must be between 0s and 24h"
	ScaleDownStabilization *metav1.Duration `json:"scaleDownStabilization,omitempty"`
}

// OutboxRelaySpec is the desired state of an OutboxRelay.
// +kubebuilder:validation:XValidation:rule="(has(self.topics) && size(self.topics) > 0) || has(self.defaultTopic) || (has(self.routing) && has(self.routing.topicHeader))",message="set topics, defaultTopic or routing.topicHeader: without any every event would be poison"
// +kubebuilder:validation:XValidation:rule="!has(self.autoscaling) || !has(oldSelf.autoscaling) || self.shards == oldSelf.shards",message="spec.shards cannot change while spec.autoscaling is set: the built-in autoscaler chooses the shard count (status.desiredShards). Remove spec.autoscaling before scaling by hand, with an HPA or with KEDA"
type OutboxRelaySpec struct {
	// database says where the outbox table lives.
	// +required
	Database DatabaseSpec `json:"database"`

	// kafka says where events are published.
	// +required
	Kafka KafkaSpec `json:"kafka"`

	// topics maps an aggregate type (outbox.aggregate_type) to its Kafka topic.
	// +optional
	// +kubebuilder:validation:MaxProperties=256
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[^,=[:space:]]{1,255}$'))",message="topics: aggregate types must be 1 to 255 characters without ',', '=' or whitespace"
	Topics map[string]TopicName `json:"topics,omitempty"`

	// defaultTopic receives the events of aggregate types missing from topics. Unset: such events
	// are poison.
	// +optional
	DefaultTopic TopicName `json:"defaultTopic,omitempty"`

	// routing routes events by their event type or by one of their headers, and keys them by
	// a header (the options of Debezium's outbox event router). Unset: by aggregate type through
	// topics, keyed by aggregate id.
	// +optional
	Routing *RoutingSpec `json:"routing,omitempty"`

	// shards is the number of shards: shard k publishes the buckets b with b % shards == k, one
	// relay Deployment each. The scale subresource points here (kubectl scale, an HPA, KEDA). A
	// change goes through safe resharding: the relays of the new layout start and stand by, the
	// old layout's relays finish their batch in flight and release their buckets, and the
	// operator switches the layout in PostgreSQL only once no relay holds a bucket. Frozen while
	// autoscaling is set.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=256
	Shards int32 `json:"shards,omitempty"`

	// publish tunes the relay loop.
	// +optional
	// +kubebuilder:default={}
	Publish PublishSpec `json:"publish,omitempty"`

	// poisonEvents says what happens to events that cannot be published.
	// +optional
	// +kubebuilder:default={}
	PoisonEvents PoisonEventsSpec `json:"poisonEvents,omitempty"`

	// partitions says how many daily partitions exist ahead of time and how long they are kept.
	// +optional
	// +kubebuilder:default={}
	Partitions PartitionsSpec `json:"partitions,omitempty"`

	// relay customises the relay pods.
	// +optional
	Relay RelayPodSpec `json:"relay,omitempty"`

	// writers says what the table does for the applications that write it.
	// +optional
	Writers WritersSpec `json:"writers,omitempty"`

	// deletion says what deleting the OutboxRelay does with the events not yet published.
	// +optional
	// +kubebuilder:default={}
	Deletion DeletionSpec `json:"deletion,omitempty"`

	// paused scales every relay Deployment to zero; migrations and partitions are still maintained.
	// +optional
	Paused bool `json:"paused,omitempty"` //nolint:kubeapilinter // nobools: a v1alpha1 field users set; an enum would break their manifests (left for the next API version)

	// autoscaling turns on the built-in autoscaler. It cannot be combined with an external
	// autoscaler: while it is set, the API refuses changes to spec.shards, which is where an HPA or
	// KEDA writes through the scale subresource.
	// +optional
	Autoscaling *AutoscalingSpec `json:"autoscaling,omitempty"`

	// lagTarget is the lag, in seconds, above which LagWithinTarget turns False.
	// +optional
	// +kubebuilder:default=60
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=604800
	LagTarget int32 `json:"lagTarget,omitempty"`
}

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

// OutboxRelay runs the transactional-outbox relays of one outbox table: it applies the schema
// migrations, keeps the daily partitions, runs one relay Deployment per shard and reports lag.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.shards,statuspath=.status.shards,selectorpath=.status.selector
// +kubebuilder:resource:shortName=obr,categories=outbox
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Shards",type=integer,JSONPath=`.status.shards`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desiredShards`,priority=1
// +kubebuilder:printcolumn:name="Ready Shards",type=integer,JSONPath=`.status.readyShards`,priority=1
// +kubebuilder:printcolumn:name="Tracking",type=string,JSONPath=`.status.tracking`,priority=1
// +kubebuilder:printcolumn:name="Pending",type=integer,JSONPath=`.status.pendingEvents`
// +kubebuilder:printcolumn:name="Lag",type=integer,JSONPath=`.status.lagSeconds`,description="Age in seconds of the oldest unsent event"
// +kubebuilder:printcolumn:name="Parked",type=integer,JSONPath=`.status.parkedEvents`,priority=1,description="Events parked after a failure (snapshot tracking)"
// +kubebuilder:printcolumn:name="Table",type=string,JSONPath=`.spec.database.table`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 53",message="metadata.name must have at most 53 characters: the relay Deployments are named <name>-shard-<k>"
type OutboxRelay struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec OutboxRelaySpec `json:"spec"`

	// +optional
	Status OutboxRelayStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// OutboxRelayList is a list of OutboxRelays.
type OutboxRelayList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []OutboxRelay `json:"items"`
}

func init() {
	SchemeBuilder.Register(&OutboxRelay{}, &OutboxRelayList{})
}
