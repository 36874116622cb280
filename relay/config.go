package relay

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

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

// kafkaTopicRE is what Kafka accepts as a topic name (at most 249 characters).
var kafkaTopicRE = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

func checkTopic(what, topic string) error {
	if !kafkaTopicRE.MatchString(topic) || topic == "." || topic == ".." {
		return fmt.Errorf("%s: %q is not a valid Kafka topic name (1 to 249 characters of a-z, A-Z, 0-9, '.', '_', '-')", what, topic)
	}
	return nil
}

// Validate checks c and returns every problem found, one per line, naming the flag or
// environment variable to fix.
func (c *Config) Validate() error {
	var p problems
	c.validateDatabase(&p)
	c.validateKafka(&p)
	c.validateTopics(&p)
	c.validatePublishing(&p)
	return errors.Join(p...)
}

// validateDatabase checks the database URL, the table and the shard.
func (c *Config) validateDatabase(p *problems) {
	if c.DatabaseURL == "" {
		p.add("OUTBOX_DATABASE_URL is required (the database URL is read from the environment only, never from a flag)")
	} else if _, err := pgx.ParseConfig(c.DatabaseURL); err != nil {
		p.add("OUTBOX_DATABASE_URL is not a valid PostgreSQL connection string (details withheld: they could contain the password)")
	}
	if err := c.Table.Validate(); err != nil {
		p.add("--table: %v", err)
	}
	if c.ShardCount < 0 || c.ShardCount > outboxdb.Buckets {
		p.add("--shard-count %d out of range: want 1 to %d, or 0 to follow the table's shard layout", c.ShardCount, outboxdb.Buckets)
	} else if c.ShardCount == 0 && (c.ShardIndex < 0 || c.ShardIndex >= outboxdb.Buckets) {
		p.add("--shard-index %d out of range: want 0 to %d", c.ShardIndex, outboxdb.Buckets-1)
	} else if c.ShardCount > 0 && (c.ShardIndex < 0 || c.ShardIndex >= c.ShardCount) {
		p.add("--shard-index %d out of range: want 0 to %d for --shard-count %d", c.ShardIndex, c.ShardCount-1, c.ShardCount)
	}
}

// validateKafka checks the brokers, TLS and SASL.
func (c *Config) validateKafka(p *problems) {
	if len(c.Kafka.Brokers) == 0 {
		p.add("--brokers (OUTBOX_KAFKA_BROKERS) is required: host:port[,host:port...]")
	}
	for _, b := range c.Kafka.Brokers {
		if i := strings.LastIndexByte(b, ':'); i <= 0 || i == len(b)-1 {
			p.add("--brokers: %q is not host:port", b)
		} else if port, err := strconv.Atoi(b[i+1:]); err != nil || port < 1 || port > 65535 {
			p.add("--brokers: %q has an invalid port", b)
		}
	}
	if !c.Kafka.TLS && (c.Kafka.TLSCAFile != "" || c.Kafka.TLSCertFile != "" || c.Kafka.TLSKeyFile != "" || c.Kafka.TLSInsecureSkipVerify) {
		p.add("--kafka-tls-ca-file, --kafka-tls-cert-file, --kafka-tls-key-file and --kafka-tls-insecure-skip-verify need --kafka-tls=true")
	}
	if (c.Kafka.TLSCertFile == "") != (c.Kafka.TLSKeyFile == "") {
		p.add("--kafka-tls-cert-file and --kafka-tls-key-file go together: set both or neither")
	}
	switch c.Kafka.SASLMechanism {
	case "":
		if c.Kafka.SASLUsername != "" || c.Kafka.SASLPassword != "" {
			p.add("OUTBOX_KAFKA_SASL_USERNAME/OUTBOX_KAFKA_SASL_PASSWORD are set but --kafka-sasl-mechanism is empty")
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if c.Kafka.SASLUsername == "" || c.Kafka.SASLPassword == "" {
			p.add("--kafka-sasl-mechanism %s needs OUTBOX_KAFKA_SASL_USERNAME and OUTBOX_KAFKA_SASL_PASSWORD", c.Kafka.SASLMechanism)
		}
	default:
		p.add("--kafka-sasl-mechanism %q: want %q, %q or %q", c.Kafka.SASLMechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
	}
}

// validateTopics checks how events are routed: the topic map and the default topic (each a
// valid name; one of them or --topic-header), the column the map matches, the routing headers.
func (c *Config) validateTopics(p *problems) {
	types := make([]string, 0, len(c.TopicMap))
	for t := range c.TopicMap {
		types = append(types, t)
	}
	sort.Strings(types)
	for _, t := range types {
		if err := checkTopic("--topic-map "+t, c.TopicMap[t]); err != nil {
			p.addErr(err)
		}
	}
	if c.DefaultTopic != "" {
		if err := checkTopic("--default-topic", c.DefaultTopic); err != nil {
			p.addErr(err)
		}
	}
	if len(c.TopicMap) == 0 && c.DefaultTopic == "" && c.TopicHeader == "" {
		p.add("no topic: set --topic-map (aggregateType=topic,...), --default-topic or --topic-header, or every event is poison")
	}
	if !c.TopicBy.Valid() {
		p.add("--topic-by %q: want %q or %q", c.TopicBy, contract.TopicByAggregateType, contract.TopicByEventType)
	}
	for _, h := range []struct{ flag, name string }{{"--topic-header", c.TopicHeader}, {"--key-header", c.KeyHeader}} {
		switch {
		case h.name == "":
		case reservedHeader([]byte(h.name)):
			p.add("%s %q: the relay sets that header itself, a row's headers cannot carry it", h.flag, h.name)
		case len(h.name) > contract.MaxHeaderNameLength:
			p.add("%s: %d characters, want at most %d", h.flag, len(h.name), contract.MaxHeaderNameLength)
		}
	}
}

// validatePublishing checks how the relay publishes and keeps progress: batch, polling, lease,
// timeouts, standbys, attempts, tracing, the envelope, null payloads, compression, the poison
// policy, the record timestamp, the tracking mode, the payload limit, the log format.
func (c *Config) validatePublishing(p *problems) {
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		p.add("--batch-size %d out of range: want 1 to %d", c.BatchSize, MaxBatchSize)
	}
	if c.PollInterval <= 0 {
		p.add("--poll-interval must be positive, got %s", c.PollInterval)
	}
	if c.MaxDelay < 0 || c.MaxDelay > contract.MaxDelayLimit {
		p.add("--max-delay %s out of range: want 0 to %s", c.MaxDelay, contract.MaxDelayLimit)
	}
	if c.IdlePollInterval < 0 || c.IdlePollInterval > contract.IdlePollIntervalLimit {
		p.add("--idle-poll-interval %s out of range: want 0 to %s", c.IdlePollInterval, contract.IdlePollIntervalLimit)
	}
	if c.LockLease < minLockLease {
		p.add("--lock-lease must be at least %s, got %s", minLockLease, c.LockLease)
	}
	if c.QueryTimeout < minQueryTimeout || c.QueryTimeout > contract.RelayQueryTimeout {
		// At most the default: the pods' termination grace period (contract.RelayGracePeriod)
		// leaves room for one round trip of that length after the last batch.
		p.add("--query-timeout %s out of range: want %s to %s", c.QueryTimeout, minQueryTimeout, contract.RelayQueryTimeout)
	}
	if c.WaitForStandbys < 0 || c.WaitForStandbys > MaxWaitForStandbys {
		p.add("--wait-for-standbys %d out of range: want 0 to %d", c.WaitForStandbys, MaxWaitForStandbys)
	}
	if c.MaxAttempts < 1 {
		p.add("--max-attempts must be at least 1, got %d", c.MaxAttempts)
	}
	switch c.PoisonPolicy {
	case PoisonBlock:
	case PoisonDeadLetter:
		if c.DeadLetterTopic == "" {
			p.add("--poison-policy dead-letter needs --dead-letter-topic (OUTBOX_DEAD_LETTER_TOPIC)")
		}
	default:
		p.add("--poison-policy %q: want %q or %q", c.PoisonPolicy, PoisonBlock, PoisonDeadLetter)
	}
	if c.OTLPEndpoint != "" && !contract.ValidOTLPEndpoint(c.OTLPEndpoint) {
		p.add("--otlp-endpoint %q: want an http:// or https:// URL, such as http://otel-collector:4317", c.OTLPEndpoint)
	}
	if c.TraceSampleRatio < 0 || c.TraceSampleRatio > 1 {
		p.add("--trace-sample-ratio %g out of range: want 0 to 1", c.TraceSampleRatio)
	}
	if !c.CloudEvents.Valid() {
		p.add("--cloudevents %q: want %q, %q or %q", c.CloudEvents, contract.CloudEventsNone, contract.CloudEventsBinary, contract.CloudEventsStructured)
	}
	if len(c.CloudEventsSource) > 1024 || strings.ContainsAny(c.CloudEventsSource, " \t\n\"") {
		p.add("--cloudevents-source: a URI-reference of at most 1024 characters without spaces or quotes")
	}
	c.Schemas.validate(p, c.CloudEvents)
	if !c.NullPayload.Valid() {
		p.add("--null-payload %q: want %q or %q", c.NullPayload, contract.NullPayloadPoison, contract.NullPayloadTombstone)
	}
	if !c.Compression.Valid() {
		p.add("--compression %q: want one of %v", c.Compression, contract.Compressions)
	}
	if !c.RecordTimestamp.Valid() {
		p.add("--record-timestamp %q: want %q or %q", c.RecordTimestamp, contract.TimestampCreated, contract.TimestampProduce)
	}
	if c.Tracking != "" && !c.Tracking.Valid() {
		p.add("--tracking %q: want %q or %q", c.Tracking, TrackRow, TrackSnapshot)
	}
	switch {
	case c.Delivery != "" && !c.Delivery.Valid():
		p.add("--delivery %q: want %q or %q", c.Delivery, contract.DeliveryAtLeastOnce, contract.DeliveryExactlyOnce)
	case c.Delivery == contract.DeliveryExactlyOnce && c.Tracking == TrackRow:
		p.add("--delivery %s needs --tracking %s: under row tracking a row's sent_at is written after its publish, and that gap is at-least-once by construction",
			c.Delivery, TrackSnapshot)
	case c.Delivery == contract.DeliveryExactlyOnce && c.CursorTopic == "":
		p.add("--delivery %s needs --cursor-topic: the compacted topic of the shards' cursor records", c.Delivery)
	case c.Delivery == contract.DeliveryExactlyOnce:
		if err := checkTopic("--cursor-topic", c.CursorTopic); err != nil {
			p.addErr(err)
		}
	}
	if c.DeadLetterTopic != "" {
		if err := checkTopic("--dead-letter-topic", c.DeadLetterTopic); err != nil {
			p.addErr(err)
		}
	}
	if c.MaxPayloadBytes < 1 {
		p.add("--max-payload-bytes must be positive, got %d", c.MaxPayloadBytes)
	}
	switch c.LogFormat {
	case "json", "text", "":
	default:
		p.add("--log-format %q: want json or text", c.LogFormat)
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

// problems collects what is wrong with a configuration.
type problems []error

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Errorf(format, args...)) }

func (p *problems) addErr(err error) { *p = append(*p, err) }

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
