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

// Checks says where events the outbox's rules refuse are refused: an empty aggregate type,
// aggregate id or event type, headers that are not a JSON object.
// +kubebuilder:validation:Enum=Table;Relay
type Checks string

// Where bad events are refused.
const (
	// ChecksTable keeps the table's four CHECKs (migration 00001): PostgreSQL refuses such an
	// insert, whichever writer made it.
	ChecksTable Checks = "Table"
	// ChecksRelay drops them (migration 00022; every insert is cheaper by what PostgreSQL spends
	// reading and planning them): outbox.Append still refuses in the application and
	// <table>_append in the database (migration 00023); a plain INSERT is accepted, and the
	// relays park the event as poison (reason invalid) by the poison policy. A new table's
	// default.
	ChecksRelay Checks = "Relay"
)

// WritersSpec says what the table does for the applications that write it.
type WritersSpec struct {
	// plainInserts is Locked (a trigger gives plain INSERTs, from any language or ORM, the
	// per-aggregate commit order outbox.Append and <table>_append have, at a cost to every
	// insert) or Unlocked (no trigger). Unset: the table is left as it is (relay inserts set
	// changes it by hand).
	// +optional
	PlainInserts PlainInserts `json:"plainInserts,omitempty"`

	// checks is Table (the table's CHECKs refuse a bad event at insert) or Relay (no CHECKs:
	// each insert is cheaper; outbox.Append and <table>_append still refuse a bad event, and the
	// relays deal with one from a plain INSERT as poison, by spec.poisonEvents). Switching back
	// to Table adds the CHECKs NOT VALID, without scanning the rows written meanwhile. Unset: a
	// table the operator makes gets Relay; an existing table is left as it is (relay checks set
	// changes it by hand).
	// +optional
	Checks Checks `json:"checks,omitempty"`
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
	// +kubebuilder:validation:XValidation:rule="self.all(e, !(e.name in ['OUTBOX_TABLE', 'OUTBOX_SHARD_COUNT', 'OUTBOX_SHARD_INDEX', 'OUTBOX_KAFKA_BROKERS', 'OUTBOX_TOPIC_MAP', 'OUTBOX_DEFAULT_TOPIC', 'OUTBOX_BATCH_SIZE', 'OUTBOX_POLL_INTERVAL', 'OUTBOX_NOTIFY', 'OUTBOX_MAX_DELAY', 'OUTBOX_IDLE_POLL_INTERVAL', 'OUTBOX_WAIT_FOR_STANDBYS', 'OUTBOX_MAX_ATTEMPTS', 'OUTBOX_POISON_POLICY', 'OUTBOX_TRACKING', 'OUTBOX_RECORD_TIMESTAMP', 'OUTBOX_TOPIC_BY', 'OUTBOX_TOPIC_HEADER', 'OUTBOX_KEY_HEADER', 'OUTBOX_COMPRESSION', 'OUTBOX_DELIVERY', 'OUTBOX_CURSOR_TOPIC', 'OUTBOX_NULL_PAYLOAD', 'OUTBOX_CLOUDEVENTS', 'OUTBOX_CLOUDEVENTS_SOURCE', 'OUTBOX_OTLP_ENDPOINT', 'OUTBOX_TRACE_SAMPLE_RATIO', 'OUTBOX_SCHEMA_REGISTRY_URL', 'OUTBOX_SCHEMA_FORMAT', 'OUTBOX_SCHEMA_SUBJECT_STRATEGY', 'OUTBOX_SCHEMA_VALIDATE', 'OUTBOX_SCHEMA_DIR', 'OUTBOX_SCHEMA_REGISTRY_CA_FILE', 'OUTBOX_SCHEMA_REGISTRY_CERT_FILE', 'OUTBOX_SCHEMA_REGISTRY_KEY_FILE', 'OUTBOX_DEAD_LETTER_TOPIC', 'OUTBOX_MAX_PAYLOAD_BYTES', 'OUTBOX_HTTP_ADDR', 'OUTBOX_KAFKA_TLS', 'OUTBOX_KAFKA_TLS_CA_FILE', 'OUTBOX_KAFKA_TLS_CERT_FILE', 'OUTBOX_KAFKA_TLS_KEY_FILE', 'OUTBOX_KAFKA_TLS_INSECURE_SKIP_VERIFY', 'OUTBOX_KAFKA_SASL_MECHANISM', 'OUTBOX_KAFKA_SASL_USERNAME', 'OUTBOX_KAFKA_SASL_PASSWORD', 'OUTBOX_SCHEMA_REGISTRY_USERNAME', 'OUTBOX_SCHEMA_REGISTRY_PASSWORD']))",message="relay.env must not set a variable the operator manages from the spec (OUTBOX_TABLE, OUTBOX_SHARD_*, OUTBOX_KAFKA_*, OUTBOX_TOPIC_MAP, ...): use the matching spec field"
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
