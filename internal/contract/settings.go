package contract

import (
	"slices"
	"strconv"
)

// Access says who sets a setting of `relay run` in the Deployments the operator builds.
type Access int

const (
	// Unclassified is the zero value: a setting nobody decided on yet, which
	// TestEverySettingIsClassified refuses.
	Unclassified Access = iota
	// Managed: the operator derives the setting from the spec (a flag or a variable it sets
	// itself); spec.relay.env may not set it.
	Managed
	// Open: the operator leaves the setting alone; spec.relay.env may set it.
	Open
)

// Setting is one setting of `relay run`: its flag (without the dashes), the environment variable
// that is its twin, and who sets it in an operator's Deployment. The relay's settings table
// (relay/settings.go) is built from these names, the operator's arguments and variables too.
type Setting struct {
	Flag, Env string
	Access    Access
}

// Arg returns the setting as one argument of `relay run`: --flag=value.
func (s Setting) Arg(value string) string { return "--" + s.Flag + "=" + value }

// The settings of `relay run`, in the order of its usage text.
var (
	FlagTable           = Setting{"table", "OUTBOX_TABLE", Managed}
	FlagShardCount      = Setting{"shard-count", "OUTBOX_SHARD_COUNT", Managed}
	FlagShardIndex      = Setting{"shard-index", "OUTBOX_SHARD_INDEX", Managed}
	FlagBrokers         = Setting{"brokers", "OUTBOX_KAFKA_BROKERS", Managed}
	FlagTopicMap        = Setting{"topic-map", "OUTBOX_TOPIC_MAP", Managed}
	FlagDefaultTopic    = Setting{"default-topic", "OUTBOX_DEFAULT_TOPIC", Managed}
	FlagBatchSize       = Setting{"batch-size", "OUTBOX_BATCH_SIZE", Managed}
	FlagPollInterval    = Setting{"poll-interval", "OUTBOX_POLL_INTERVAL", Managed}
	FlagNotify          = Setting{"notify", "OUTBOX_NOTIFY", Managed}
	FlagMaxDelay        = Setting{"max-delay", "OUTBOX_MAX_DELAY", Managed}
	FlagIdlePoll        = Setting{"idle-poll-interval", "OUTBOX_IDLE_POLL_INTERVAL", Managed}
	FlagLockLease       = Setting{"lock-lease", "OUTBOX_LOCK_LEASE", Open}
	FlagQueryTimeout    = Setting{"query-timeout", "OUTBOX_QUERY_TIMEOUT", Open}
	FlagWaitForStandbys = Setting{"wait-for-standbys", "OUTBOX_WAIT_FOR_STANDBYS", Managed}
	FlagMaxAttempts     = Setting{"max-attempts", "OUTBOX_MAX_ATTEMPTS", Managed}
	FlagPoisonPolicy    = Setting{"poison-policy", "OUTBOX_POISON_POLICY", Managed}
	FlagTracking        = Setting{"tracking", "OUTBOX_TRACKING", Managed}
	FlagRecordTimestamp = Setting{"record-timestamp", "OUTBOX_RECORD_TIMESTAMP", Managed}
	FlagDeadLetterTopic = Setting{"dead-letter-topic", "OUTBOX_DEAD_LETTER_TOPIC", Managed}
	FlagTopicBy         = Setting{"topic-by", "OUTBOX_TOPIC_BY", Managed}
	FlagTopicHeader     = Setting{"topic-header", "OUTBOX_TOPIC_HEADER", Managed}
	FlagKeyHeader       = Setting{"key-header", "OUTBOX_KEY_HEADER", Managed}
	FlagCompression     = Setting{"compression", "OUTBOX_COMPRESSION", Managed}
	FlagDelivery        = Setting{"delivery", "OUTBOX_DELIVERY", Managed}
	FlagCursorTopic     = Setting{"cursor-topic", "OUTBOX_CURSOR_TOPIC", Managed}
	FlagNullPayload     = Setting{"null-payload", "OUTBOX_NULL_PAYLOAD", Managed}
	FlagCloudEvents     = Setting{"cloudevents", "OUTBOX_CLOUDEVENTS", Managed}
	FlagCloudEventsSrc  = Setting{"cloudevents-source", "OUTBOX_CLOUDEVENTS_SOURCE", Managed}
	FlagOTLPEndpoint    = Setting{"otlp-endpoint", "OUTBOX_OTLP_ENDPOINT", Managed}
	FlagTraceSample     = Setting{"trace-sample-ratio", "OUTBOX_TRACE_SAMPLE_RATIO", Managed}
	FlagSchemaRegistry  = Setting{"schema-registry-url", "OUTBOX_SCHEMA_REGISTRY_URL", Managed}
	FlagSchemaFormat    = Setting{"schema-format", "OUTBOX_SCHEMA_FORMAT", Managed}
	FlagSchemaSubject   = Setting{"schema-subject-strategy", "OUTBOX_SCHEMA_SUBJECT_STRATEGY", Managed}
	FlagSchemaValidate  = Setting{"schema-validate", "OUTBOX_SCHEMA_VALIDATE", Managed}
	FlagSchemaDir       = Setting{"schema-dir", "OUTBOX_SCHEMA_DIR", Managed}
	FlagSchemaCAFile    = Setting{"schema-registry-ca-file", "OUTBOX_SCHEMA_REGISTRY_CA_FILE", Managed}
	FlagSchemaCertFile  = Setting{"schema-registry-cert-file", "OUTBOX_SCHEMA_REGISTRY_CERT_FILE", Managed}
	FlagSchemaKeyFile   = Setting{"schema-registry-key-file", "OUTBOX_SCHEMA_REGISTRY_KEY_FILE", Managed}
	FlagMaxPayloadBytes = Setting{"max-payload-bytes", "OUTBOX_MAX_PAYLOAD_BYTES", Managed}
	FlagHTTPAddr        = Setting{"http-addr", "OUTBOX_HTTP_ADDR", Managed}
	FlagKafkaTLS        = Setting{"kafka-tls", "OUTBOX_KAFKA_TLS", Managed}
	FlagKafkaTLSCAFile  = Setting{"kafka-tls-ca-file", "OUTBOX_KAFKA_TLS_CA_FILE", Managed}
	FlagKafkaTLSCert    = Setting{"kafka-tls-cert-file", "OUTBOX_KAFKA_TLS_CERT_FILE", Managed}
	FlagKafkaTLSKey     = Setting{"kafka-tls-key-file", "OUTBOX_KAFKA_TLS_KEY_FILE", Managed}
	// FlagKafkaTLSInsecure is set by the operator through its variable, never its flag (see
	// EnvTLSInsecureSkipVerify).
	FlagKafkaTLSInsecure = Setting{"kafka-tls-insecure-skip-verify", EnvTLSInsecureSkipVerify, Managed}
	FlagKafkaSASL        = Setting{"kafka-sasl-mechanism", "OUTBOX_KAFKA_SASL_MECHANISM", Managed}
	FlagLogFormat        = Setting{"log-format", "OUTBOX_LOG_FORMAT", Open}
)

// RunSettings lists every setting of `relay run` that has a flag. The relay's settings table
// holds exactly these (TestSettingsAreTheContract in relay), each classified Managed or Open
// (TestEverySettingIsClassified).
var RunSettings = []Setting{
	FlagTable, FlagShardCount, FlagShardIndex, FlagBrokers, FlagTopicMap, FlagDefaultTopic,
	FlagBatchSize, FlagPollInterval, FlagNotify, FlagMaxDelay, FlagIdlePoll, FlagLockLease, FlagQueryTimeout,
	FlagWaitForStandbys, FlagMaxAttempts, FlagPoisonPolicy, FlagTracking, FlagRecordTimestamp,
	FlagTopicBy, FlagTopicHeader, FlagKeyHeader, FlagCompression, FlagDelivery, FlagCursorTopic, FlagNullPayload,
	FlagCloudEvents, FlagCloudEventsSrc, FlagOTLPEndpoint, FlagTraceSample,
	FlagSchemaRegistry, FlagSchemaFormat, FlagSchemaSubject, FlagSchemaValidate, FlagSchemaDir, FlagSchemaCAFile,
	FlagSchemaCertFile, FlagSchemaKeyFile, FlagDeadLetterTopic, FlagMaxPayloadBytes, FlagHTTPAddr, FlagKafkaTLS, FlagKafkaTLSCAFile, FlagKafkaTLSCert,
	FlagKafkaTLSKey, FlagKafkaTLSInsecure, FlagKafkaSASL, FlagLogFormat,
}

// SecretEnv lists the variables of `relay run` that have no flag, the secrets: the operator sets
// each from a Secret reference, so all are managed.
var SecretEnv = []string{EnvDatabaseURL, EnvSASLUsername, EnvSASLPassword, EnvRegistryUsername, EnvRegistryPassword}

// ManagedEnv lists the relay's environment variables the operator derives from the spec: the
// twins of the Managed settings and the secrets. spec.relay.env may not set them. The CRD's CEL
// rule on spec.relay.env spells the same list (markers cannot name a Go constant;
// TestManagedEnvMatchesTheCRD compares them; the API server's refusal of each is tested by
// TestManagedEnvIsRefused in api/v1alpha1).
var ManagedEnv = managedEnv()

func managedEnv() []string {
	var env []string
	for _, s := range RunSettings {
		if s.Access == Managed {
			env = append(env, s.Env)
		}
	}
	return append(env, SecretEnv...)
}

// IsManagedEnv reports whether the operator sets the variable name itself (ManagedEnv).
func IsManagedEnv(name string) bool { return slices.Contains(ManagedEnv, name) }

// The relay's HTTP server (relay --http-addr), which the operator's container port and probes
// point at.
const (
	// RelayHTTPPort is the port the operator runs the relays' HTTP server on.
	RelayHTTPPort = 8080
	// PathMetrics serves the relay's Prometheus metrics.
	PathMetrics = "/metrics"
	// PathHealthz answers 200 while the relay runs its loop (the liveness probe).
	PathHealthz = "/healthz"
	// PathReadyz answers 200 while the relay holds its locks and reaches the database and Kafka
	// (the readiness probe).
	PathReadyz = "/readyz"
)

// RelayHTTPAddr is the relay's default --http-addr, on RelayHTTPPort on every interface.
var RelayHTTPAddr = ":" + strconv.Itoa(RelayHTTPPort)
