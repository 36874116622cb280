package relay

import (
	"crypto/tls"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/internal/kafkaauth"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// RecordTimestamp says which time a record carries (contract.RecordTimestamp).
type RecordTimestamp = contract.RecordTimestamp

// PoisonPolicy says what happens to a poison event (contract.PoisonPolicy).
type PoisonPolicy = contract.PoisonPolicy

// The poison policies (contract.PoisonBlock, contract.PoisonDeadLetter).
const (
	PoisonBlock      = contract.PoisonBlock
	PoisonDeadLetter = contract.PoisonDeadLetter
)

// DefaultHTTPAddr is where the relay serves /metrics, /healthz and /readyz unless told otherwise:
// the port the operator's probes point at.
var DefaultHTTPAddr = contract.RelayHTTPAddr

// Tracking says how a relay keeps its progress: the one type of the tracking mode
// (contract.Tracking), named here for the relay's own files.
type Tracking = contract.Tracking

// The tracking modes (contract.TrackRow, contract.TrackSnapshot).
const (
	TrackRow      = contract.TrackRow
	TrackSnapshot = contract.TrackSnapshot
)

// SASL mechanisms.
const (
	SASLPlain       = kafkaauth.Plain
	SASLScramSHA256 = kafkaauth.ScramSHA256
	SASLScramSHA512 = kafkaauth.ScramSHA512
)

// Defaults of the relay command line (docs/architecture.md, "Relay command line").
const (
	DefaultTable           = "public.outbox"
	DefaultBatchSize       = 500
	DefaultMaxAttempts     = 10
	DefaultMaxPayloadBytes = contract.DefaultMaxPayloadBytes
	MaxBatchSize           = 10_000
	// MaxWaitForStandbys bounds --wait-for-standbys.
	MaxWaitForStandbys = 16
	// minQueryTimeout bounds --query-timeout from below (contract.RelayQueryTimeout from above).
	minQueryTimeout = time.Second
)

// Config is everything a relay needs. The binary fills it from flags and environment
// (ParseConfig); tests build it directly and call New.
type Config struct {
	// DatabaseURL is the libpq URL or keyword/value string. Secret: never logged.
	DatabaseURL string
	Table       outboxdb.Table
	// ShardCount is the layout this relay runs: it publishes only while the table's shard layout
	// (<table>_relay_layout) has this many shards, and sets that layout itself when no relay of
	// another layout runs and no change is in progress. 0 follows the table's layout instead
	// (what the operator runs): the relay publishes while ShardIndex is below the layout's shard
	// count and stands by otherwise. See docs/architecture.md, "Resharding".
	ShardCount int
	ShardIndex int

	Kafka KafkaConfig
	// TopicMap maps an aggregate type to its topic.
	TopicMap map[string]string
	// DefaultTopic receives the aggregate types the map does not name. Empty: they are poison.
	DefaultTopic string
	// TopicBy is the column whose value TopicMap matches: aggregate_type (the default, also for
	// "") or event_type.
	TopicBy contract.TopicBy
	// TopicHeader, when set, names a member of the row's headers that, where a row has it, is
	// the event's topic (before TopicMap and DefaultTopic); a value that is not a valid topic
	// name makes the event poison.
	TopicHeader string
	// KeyHeader, when set, names a member of the row's headers that, where a row has it, is the
	// record's key (and so picks its partition) instead of the aggregate id.
	KeyHeader string
	// Delivery is the guarantee: at-least-once (also for "") or exactly-once (txn_*.go).
	Delivery contract.Delivery
	// CursorTopic is exactly-once delivery's compacted topic of the shards' cursor records.
	CursorTopic string
	// Compression is the codec of the record batches produced (none, also for "", gzip,
	// snappy, lz4, zstd).
	Compression contract.Compression
	// NullPayload is what an event without a value (payload and payload_bytes NULL, or
	// payload_bytes empty) becomes: poison (the default, also for "") or a tombstone.
	NullPayload contract.NullPayload
	// CloudEvents publishes each event as a CloudEvent (binary or structured mode of the Kafka
	// protocol binding); none (the default, also for "") publishes the payload as it is.
	CloudEvents contract.CloudEvents
	// CloudEventsSource is the CloudEvents source attribute (a URI-reference); empty: "/outbox/"
	// and the table.
	CloudEventsSource string
	// OTLPEndpoint, when set, exports a producer span per published event over OTLP/gRPC to this
	// URL (http:// plaintext, https:// TLS), a child of the traceparent the writer stored.
	OTLPEndpoint string
	// TraceSampleRatio is the share of events without a sampled parent whose publish is traced
	// (0 to 1; an event whose traceparent says sampled is always traced). 0 with OTLPEndpoint
	// set: only sampled parents.
	TraceSampleRatio float64
	// Schemas frames each payload in the Schema Registry wire format (schema_registry.go); off
	// without a registry URL.
	Schemas SchemaSettings

	BatchSize    int
	PollInterval time.Duration
	Notify       bool
	// MaxDelay is the latency budget of a batch (contract.MaxDelay): after a fetch that found
	// events and did not fill the batch, the next fetch waits until MaxDelay after it began, so
	// that what commits meanwhile travels together (wake.go, gather). 0: fetch again at once.
	MaxDelay time.Duration
	// IdlePollInterval is the longest wait of an idle relay that polls (contract.IdlePollInterval,
	// wake.go nextPoll); at or below PollInterval it does not back off.
	IdlePollInterval time.Duration
	MaxAttempts      int
	PoisonPolicy     PoisonPolicy
	// RecordTimestamp is the time each record carries: the event's created_at (the default) or
	// the produce time. A replay's copies carry the produce time (they are second copies, made now).
	RecordTimestamp RecordTimestamp
	DeadLetterTopic string
	MaxPayloadBytes int
	// Tracking is how progress is kept. A table tracked by snapshot cannot go back to row
	// tracking. ParseConfigFlags leaves it "" where --tracking is not given, for `relay run` to
	// resolve from the table (ResolveTracking); New takes "" as TrackRow.
	Tracking Tracking

	// HTTPAddr serves /metrics, /healthz and /readyz. Empty: no HTTP server (Handler still works).
	HTTPAddr  string
	LogFormat string

	// Tuning that has no flag; zero values take the defaults below.

	// RetryBackoff delays the next attempt of an aggregate whose event failed (default 1s to
	// 5m); a poison event under PoisonBlock waits RetryBackoff.Max.
	RetryBackoff Backoff
	// OutageBackoff delays the next round when PostgreSQL or every broker is unreachable
	// (default 100ms to 10s).
	OutageBackoff Backoff
	// KafkaProbeInterval is how long an idle relay goes without word from the brokers before it
	// asks them for metadata, so that readiness follows their reachability (default 30s).
	KafkaProbeInterval time.Duration
	// StatsInterval is how often outbox_pending and outbox_lag_seconds are refreshed (default 5s).
	StatsInterval time.Duration
	// ReplayCheckInterval is how often the relay asks whether a replay waits (default
	// DefaultReplayCheckInterval; replay.go).
	ReplayCheckInterval time.Duration
	// PendingCountLimit bounds the rows the pending count reads; past it the count is
	// extrapolated from the ids (default 100,000).
	PendingCountLimit int
	// ShutdownTimeout bounds how long a SIGTERM waits for the batch in flight (default
	// contract.RelayShutdownTimeout, which the operator's grace period covers).
	ShutdownTimeout time.Duration
	// QueryTimeout bounds each database round trip (default 30s).
	QueryTimeout time.Duration
	// LockLease is how long PostgreSQL lets the lock connection stay idle before it ends the
	// session and so releases the shard's locks: a frozen relay loses its shard after it (see
	// lease.go; default DefaultLockLease).
	LockLease time.Duration
	// WaitForStandbys, when positive, holds each batch until that many standbys have flushed the
	// WAL of its events (pg_stat_replication), so that no event is published that a promoted
	// asynchronous standby would not have (standbys.go; default 0: publish at once).
	WaitForStandbys int
}

// KafkaConfig is how the relay reaches the brokers.
type KafkaConfig struct {
	Brokers     []string
	TLS         bool
	TLSCAFile   string
	TLSCertFile string
	TLSKeyFile  string
	// TLSInsecureSkipVerify accepts any broker certificate (tests and lab setups only).
	TLSInsecureSkipVerify bool
	// SASLMechanism is "", SASLPlain, SASLScramSHA256 or SASLScramSHA512.
	SASLMechanism string
	SASLUsername  string
	// SASLPassword is secret: never logged.
	SASLPassword string
}

// DefaultConfig returns the defaults of every setting; DatabaseURL and Kafka.Brokers are
// still to be set.
func DefaultConfig() Config {
	return Config{
		Table:            outboxdb.MustParseTable(DefaultTable),
		ShardCount:       1,
		BatchSize:        DefaultBatchSize,
		PollInterval:     contract.DefaultPollInterval(contract.DefaultNotify),
		Notify:           contract.DefaultNotify,
		MaxDelay:         contract.MaxDelay,
		IdlePollInterval: contract.IdlePollInterval,
		MaxAttempts:      DefaultMaxAttempts,
		PoisonPolicy:     PoisonBlock,
		RecordTimestamp:  contract.TimestampCreated,
		TopicBy:          contract.TopicByAggregateType,
		Compression:      contract.CompressionNone,
		Delivery:         contract.DeliveryAtLeastOnce,
		NullPayload:      contract.NullPayloadPoison,
		CloudEvents:      contract.CloudEventsNone,
		Schemas:          SchemaSettings{Format: contract.SchemaNone, Strategy: contract.SubjectTopic},
		TraceSampleRatio: 1,
		MaxPayloadBytes:  DefaultMaxPayloadBytes,
		Tracking:         TrackRow,
		HTTPAddr:         DefaultHTTPAddr,
		LogFormat:        "json",
		ShutdownTimeout:  contract.RelayShutdownTimeout,
		QueryTimeout:     contract.RelayQueryTimeout,
		LockLease:        DefaultLockLease,
	}
}

func (c *Config) setDefaults() {
	if c.Table == (outboxdb.Table{}) {
		c.Table = outboxdb.MustParseTable(DefaultTable)
	}
	if c.Tracking == "" {
		c.Tracking = TrackRow
	}
	if c.TopicBy == "" {
		c.TopicBy = contract.TopicByAggregateType
	}
	if c.Delivery == "" {
		c.Delivery = contract.DeliveryAtLeastOnce
	}
	if c.Compression == "" {
		c.Compression = contract.CompressionNone
	}
	if c.NullPayload == "" {
		c.NullPayload = contract.NullPayloadPoison
	}
	if c.CloudEvents == "" {
		c.CloudEvents = contract.CloudEventsNone
	}
	if c.Schemas.Format == "" {
		c.Schemas.Format = contract.SchemaNone
	}
	if c.Schemas.Strategy == "" {
		c.Schemas.Strategy = contract.SubjectTopic
	}
	if c.RetryBackoff == (Backoff{}) {
		c.RetryBackoff = Backoff{Min: time.Second, Max: 5 * time.Minute}
	}
	if c.OutageBackoff == (Backoff{}) {
		c.OutageBackoff = Backoff{Min: 100 * time.Millisecond, Max: 10 * time.Second}
	}
	if c.StatsInterval <= 0 {
		c.StatsInterval = 5 * time.Second
	}
	if c.ReplayCheckInterval <= 0 {
		c.ReplayCheckInterval = DefaultReplayCheckInterval
	}
	if c.KafkaProbeInterval <= 0 {
		c.KafkaProbeInterval = 30 * time.Second
	}
	if c.PendingCountLimit <= 0 {
		c.PendingCountLimit = 100_000
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = contract.RelayShutdownTimeout
	}
	if c.QueryTimeout <= 0 {
		c.QueryTimeout = contract.RelayQueryTimeout
	}
	if c.LockLease == 0 {
		c.LockLease = DefaultLockLease
	}
	if c.LogFormat == "" {
		c.LogFormat = "json"
	}
}

// tlsConfig builds the TLS configuration for the brokers, nil when TLS is off.
func (k *KafkaConfig) tlsConfig() (*tls.Config, error) {
	if !k.TLS {
		return nil, nil
	}
	var ca, cert, key []byte
	var err error
	if k.TLSCAFile != "" {
		if ca, err = os.ReadFile(k.TLSCAFile); err != nil {
			return nil, fmt.Errorf("--kafka-tls-ca-file: %w", err)
		}
	}
	if k.TLSCertFile != "" {
		if cert, err = os.ReadFile(k.TLSCertFile); err != nil {
			return nil, fmt.Errorf("--kafka-tls-cert-file: %w", err)
		}
		if key, err = os.ReadFile(k.TLSKeyFile); err != nil {
			return nil, fmt.Errorf("--kafka-tls-key-file: %w", err)
		}
	}
	cfg, err := kafkaauth.TLS(ca, cert, key, k.TLSInsecureSkipVerify)
	if err != nil {
		return nil, fmt.Errorf("--kafka-tls-ca-file %s, --kafka-tls-cert-file %s: %w", k.TLSCAFile, k.TLSCertFile, err)
	}
	return cfg, nil
}

// ParseTopicMap parses "aggregateType=topic,aggregateType=topic".
func ParseTopicMap(s string) (map[string]string, error) {
	m := map[string]string{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("%q is not aggregateType=topic", part)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("aggregate type %q appears twice", k)
		}
		m[k] = v
	}
	return m, nil
}
