// Validating a relay's Config (Config.Validate): every problem found, naming the flag or
// environment variable to fix.

package relay

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

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

// problems collects what is wrong with a configuration.
type problems []error

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Errorf(format, args...)) }

func (p *problems) addErr(err error) { *p = append(*p, err) }
