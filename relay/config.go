package relay

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// PoisonPolicy says what happens to a poison event: an aggregate type with no topic, a payload
// over the size limit, or an event that failed MaxAttempts times.
type PoisonPolicy string

const (
	// PoisonBlock keeps the event's aggregate blocked and retries the event at the longest
	// backoff, visible in the row's attempts and error and in the metrics.
	PoisonBlock PoisonPolicy = "block"
	// PoisonDeadLetter publishes the event, with its headers plus "error", to the dead-letter
	// topic and marks it sent with the error recorded.
	PoisonDeadLetter PoisonPolicy = "dead-letter"
)

// Tracking says how a relay keeps its progress (docs/architecture.md, "Tracking progress").
type Tracking string

const (
	// TrackRow marks every published row sent (sent_at): progress and outcome visible per row.
	TrackRow Tracking = "row"
	// TrackSnapshot never updates an event row: the relay publishes the events committed between
	// two PostgreSQL snapshots and keeps one cursor row per set of buckets; failed events and the
	// later events of their aggregates are parked in <table>_parked and retried from there.
	TrackSnapshot Tracking = "snapshot"
)

// SASL mechanisms.
const (
	SASLPlain       = "plain"
	SASLScramSHA256 = "scram-sha-256"
	SASLScramSHA512 = "scram-sha-512"
)

// Defaults of the relay command line (docs/architecture.md, "Relay command line").
const (
	DefaultTable           = "public.outbox"
	DefaultBatchSize       = 500
	DefaultMaxAttempts     = 10
	DefaultMaxPayloadBytes = contract.DefaultMaxPayloadBytes
	DefaultHTTPAddr        = ":8080"
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

	BatchSize       int
	PollInterval    time.Duration
	Notify          bool
	MaxAttempts     int
	PoisonPolicy    PoisonPolicy
	DeadLetterTopic string
	MaxPayloadBytes int
	// Tracking is how progress is kept (default TrackRow). A table tracked by snapshot cannot go
	// back to row tracking.
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
		Table:           outboxdb.MustParseTable(DefaultTable),
		ShardCount:      1,
		BatchSize:       DefaultBatchSize,
		PollInterval:    contract.DefaultPollInterval(contract.DefaultNotify),
		Notify:          contract.DefaultNotify,
		MaxAttempts:     DefaultMaxAttempts,
		PoisonPolicy:    PoisonBlock,
		MaxPayloadBytes: DefaultMaxPayloadBytes,
		Tracking:        TrackRow,
		HTTPAddr:        DefaultHTTPAddr,
		LogFormat:       "json",
		ShutdownTimeout: contract.RelayShutdownTimeout,
		QueryTimeout:    contract.RelayQueryTimeout,
		LockLease:       DefaultLockLease,
	}
}

func (c *Config) setDefaults() {
	if c.Table == (outboxdb.Table{}) {
		c.Table = outboxdb.MustParseTable(DefaultTable)
	}
	if c.Tracking == "" {
		c.Tracking = TrackRow
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
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.DatabaseURL == "" {
		add("OUTBOX_DATABASE_URL is required (the database URL is read from the environment only, never from a flag)")
	} else if _, err := pgx.ParseConfig(c.DatabaseURL); err != nil {
		add("OUTBOX_DATABASE_URL is not a valid PostgreSQL connection string (details withheld: they could contain the password)")
	}
	if err := c.Table.Validate(); err != nil {
		add("--table: %v", err)
	}
	if c.ShardCount < 0 || c.ShardCount > outboxdb.Buckets {
		add("--shard-count %d out of range: want 1 to %d, or 0 to follow the table's shard layout", c.ShardCount, outboxdb.Buckets)
	} else if c.ShardCount == 0 && (c.ShardIndex < 0 || c.ShardIndex >= outboxdb.Buckets) {
		add("--shard-index %d out of range: want 0 to %d", c.ShardIndex, outboxdb.Buckets-1)
	} else if c.ShardCount > 0 && (c.ShardIndex < 0 || c.ShardIndex >= c.ShardCount) {
		add("--shard-index %d out of range: want 0 to %d for --shard-count %d", c.ShardIndex, c.ShardCount-1, c.ShardCount)
	}
	if len(c.Kafka.Brokers) == 0 {
		add("--brokers (OUTBOX_KAFKA_BROKERS) is required: host:port[,host:port...]")
	}
	for _, b := range c.Kafka.Brokers {
		if i := strings.LastIndexByte(b, ':'); i <= 0 || i == len(b)-1 {
			add("--brokers: %q is not host:port", b)
		} else if p, err := strconv.Atoi(b[i+1:]); err != nil || p < 1 || p > 65535 {
			add("--brokers: %q has an invalid port", b)
		}
	}
	types := make([]string, 0, len(c.TopicMap))
	for t := range c.TopicMap {
		types = append(types, t)
	}
	sort.Strings(types)
	for _, t := range types {
		if err := checkTopic("--topic-map "+t, c.TopicMap[t]); err != nil {
			errs = append(errs, err)
		}
	}
	if c.DefaultTopic != "" {
		if err := checkTopic("--default-topic", c.DefaultTopic); err != nil {
			errs = append(errs, err)
		}
	}
	if len(c.TopicMap) == 0 && c.DefaultTopic == "" {
		add("no topic: set --topic-map (aggregateType=topic,...) or --default-topic, or every event is poison")
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		add("--batch-size %d out of range: want 1 to %d", c.BatchSize, MaxBatchSize)
	}
	if c.PollInterval <= 0 {
		add("--poll-interval must be positive, got %s", c.PollInterval)
	}
	if c.LockLease < minLockLease {
		add("--lock-lease must be at least %s, got %s", minLockLease, c.LockLease)
	}
	if c.QueryTimeout < minQueryTimeout || c.QueryTimeout > contract.RelayQueryTimeout {
		// At most the default: the pods' termination grace period (contract.RelayGracePeriod)
		// leaves room for one round trip of that length after the last batch.
		add("--query-timeout %s out of range: want %s to %s", c.QueryTimeout, minQueryTimeout, contract.RelayQueryTimeout)
	}
	if c.WaitForStandbys < 0 || c.WaitForStandbys > MaxWaitForStandbys {
		add("--wait-for-standbys %d out of range: want 0 to %d", c.WaitForStandbys, MaxWaitForStandbys)
	}
	if c.MaxAttempts < 1 {
		add("--max-attempts must be at least 1, got %d", c.MaxAttempts)
	}
	switch c.PoisonPolicy {
	case PoisonBlock:
	case PoisonDeadLetter:
		if c.DeadLetterTopic == "" {
			add("--poison-policy dead-letter needs --dead-letter-topic (OUTBOX_DEAD_LETTER_TOPIC)")
		}
	default:
		add("--poison-policy %q: want %q or %q", c.PoisonPolicy, PoisonBlock, PoisonDeadLetter)
	}
	switch c.Tracking {
	case TrackRow, TrackSnapshot:
	default:
		add("--tracking %q: want %q or %q", c.Tracking, TrackRow, TrackSnapshot)
	}
	if c.DeadLetterTopic != "" {
		if err := checkTopic("--dead-letter-topic", c.DeadLetterTopic); err != nil {
			errs = append(errs, err)
		}
	}
	if c.MaxPayloadBytes < 1 {
		add("--max-payload-bytes must be positive, got %d", c.MaxPayloadBytes)
	}
	if !c.Kafka.TLS && (c.Kafka.TLSCAFile != "" || c.Kafka.TLSCertFile != "" || c.Kafka.TLSKeyFile != "" || c.Kafka.TLSInsecureSkipVerify) {
		add("--kafka-tls-ca-file, --kafka-tls-cert-file, --kafka-tls-key-file and --kafka-tls-insecure-skip-verify need --kafka-tls=true")
	}
	if (c.Kafka.TLSCertFile == "") != (c.Kafka.TLSKeyFile == "") {
		add("--kafka-tls-cert-file and --kafka-tls-key-file go together: set both or neither")
	}
	switch c.Kafka.SASLMechanism {
	case "":
		if c.Kafka.SASLUsername != "" || c.Kafka.SASLPassword != "" {
			add("OUTBOX_KAFKA_SASL_USERNAME/OUTBOX_KAFKA_SASL_PASSWORD are set but --kafka-sasl-mechanism is empty")
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if c.Kafka.SASLUsername == "" || c.Kafka.SASLPassword == "" {
			add("--kafka-sasl-mechanism %s needs OUTBOX_KAFKA_SASL_USERNAME and OUTBOX_KAFKA_SASL_PASSWORD", c.Kafka.SASLMechanism)
		}
	default:
		add("--kafka-sasl-mechanism %q: want %q, %q or %q", c.Kafka.SASLMechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
	}
	switch c.LogFormat {
	case "json", "text", "":
	default:
		add("--log-format %q: want json or text", c.LogFormat)
	}
	return errors.Join(errs...)
}

// tlsConfig builds the TLS configuration for the brokers, nil when TLS is off.
func (k *KafkaConfig) tlsConfig() (*tls.Config, error) {
	if !k.TLS {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: k.TLSInsecureSkipVerify} //nolint:gosec // opt-in, documented
	if k.TLSCAFile != "" {
		pem, err := os.ReadFile(k.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--kafka-tls-ca-file %s: no PEM certificate in it", k.TLSCAFile)
		}
		cfg.RootCAs = pool
	}
	if k.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(k.TLSCertFile, k.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-cert-file/--kafka-tls-key-file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
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

// RunEnv returns every environment variable `relay run` reads.
func RunEnv() []string {
	var c Config
	env := []string{EnvDatabaseURL, EnvSASLUsername, EnvSASLPassword}
	for _, s := range runSettings(&c) {
		env = append(env, s.env)
	}
	return env
}

// Environment variables of the relay command line.
const (
	EnvDatabaseURL  = contract.EnvDatabaseURL
	EnvSASLUsername = contract.EnvSASLUsername
	EnvSASLPassword = contract.EnvSASLPassword
)

// setting is one flag with its environment variable.
type setting struct {
	flag, env, usage string
	def              string // shown in the usage
	isBool           bool
	set              func(string) error
}

// runSettings lists the flags of `relay run`, each with its environment variable, writing into c.
func runSettings(c *Config) []setting {
	return []setting{
		{flag: "table", env: "OUTBOX_TABLE", def: DefaultTable, usage: "outbox table, schema.table", set: func(s string) error {
			t, err := outboxdb.ParseTable(s)
			if err == nil {
				c.Table = t
			}
			return err
		}},
		{flag: "shard-count", env: "OUTBOX_SHARD_COUNT", def: "1", usage: "number of shards (1 to 256); 0 follows the table's shard layout (as the operator runs relays)", set: intSetter(&c.ShardCount)},
		{flag: "shard-index", env: "OUTBOX_SHARD_INDEX", def: "0", usage: "this relay's shard, 0 to shard-count-1 (0 to 255 when following the layout)", set: intSetter(&c.ShardIndex)},
		{flag: "brokers", env: "OUTBOX_KAFKA_BROKERS", usage: "Kafka bootstrap brokers, host:port,...", set: func(s string) error {
			c.Kafka.Brokers = nil
			for _, b := range strings.Split(s, ",") {
				if b = strings.TrimSpace(b); b != "" {
					c.Kafka.Brokers = append(c.Kafka.Brokers, b)
				}
			}
			return nil
		}},
		{flag: "topic-map", env: "OUTBOX_TOPIC_MAP", usage: "aggregateType=topic,...", set: func(s string) error {
			m, err := ParseTopicMap(s)
			if err == nil {
				c.TopicMap = m
			}
			return err
		}},
		{flag: "default-topic", env: "OUTBOX_DEFAULT_TOPIC", usage: "topic of aggregate types the map does not name (empty: they are poison)", set: stringSetter(&c.DefaultTopic)},
		{flag: "batch-size", env: "OUTBOX_BATCH_SIZE", def: "500", usage: "rows fetched and published per batch", set: intSetter(&c.BatchSize)},
		{flag: "poll-interval", env: "OUTBOX_POLL_INTERVAL", def: contract.PollInterval.String() + "; " + contract.NotifyPollInterval.String() + " with --notify", usage: "how often an idle relay looks for rows (with --notify, when no notification comes)", set: durationSetter(&c.PollInterval)},
		{flag: "notify", env: "OUTBOX_NOTIFY", def: strconv.FormatBool(contract.DefaultNotify), usage: "wake up on LISTEN/NOTIFY rather than poll: needs the table's insert trigger (relay wakeups set notify), which costs every inserting transaction", isBool: true, set: boolSetter(&c.Notify)},
		{flag: "lock-lease", env: "OUTBOX_LOCK_LEASE", def: "30s", usage: "how long the lock connection may stay silent before PostgreSQL ends it and a standby takes the shard (a frozen relay; on PostgreSQL 13 the standby ends it)", set: durationSetter(&c.LockLease)},
		{flag: "query-timeout", env: "OUTBOX_QUERY_TIMEOUT", def: contract.RelayQueryTimeout.String(), usage: "how long one database round trip may take before the relay gives up on its connection and connects again (1s to " + contract.RelayQueryTimeout.String() + "; lower notices sooner a database host that vanished without a reset, behind an address that moves)", set: durationSetter(&c.QueryTimeout)},
		{flag: "wait-for-standbys", env: "OUTBOX_WAIT_FOR_STANDBYS", def: "0", usage: "publish a batch only once this many standbys have flushed its events' WAL, so that a failover to an asynchronous standby never loses a published event (0: publish at once; needs pg_read_all_stats)", set: intSetter(&c.WaitForStandbys)},
		{flag: "max-attempts", env: "OUTBOX_MAX_ATTEMPTS", def: "10", usage: "failed attempts after which an event is poison", set: intSetter(&c.MaxAttempts)},
		{flag: "poison-policy", env: "OUTBOX_POISON_POLICY", def: "block", usage: "block or dead-letter", set: func(s string) error {
			c.PoisonPolicy = PoisonPolicy(s)
			return nil
		}},
		{flag: "tracking", env: "OUTBOX_TRACKING", def: string(TrackRow), usage: "how progress is kept: row (sent_at per event) or snapshot (a cursor per shard, no event row updated)", set: func(s string) error {
			c.Tracking = Tracking(s)
			return nil
		}},
		{flag: "dead-letter-topic", env: "OUTBOX_DEAD_LETTER_TOPIC", usage: "topic of poison events under dead-letter", set: stringSetter(&c.DeadLetterTopic)},
		{flag: "max-payload-bytes", env: "OUTBOX_MAX_PAYLOAD_BYTES", def: strconv.Itoa(contract.DefaultMaxPayloadBytes), usage: "larger payloads are poison", set: intSetter(&c.MaxPayloadBytes)},
		{flag: "http-addr", env: "OUTBOX_HTTP_ADDR", def: DefaultHTTPAddr, usage: "address of /metrics, /healthz and /readyz (empty: off)", set: stringSetter(&c.HTTPAddr)},
		{flag: "kafka-tls", env: "OUTBOX_KAFKA_TLS", def: "false", usage: "connect to the brokers with TLS", isBool: true, set: boolSetter(&c.Kafka.TLS)},
		{flag: "kafka-tls-ca-file", env: "OUTBOX_KAFKA_TLS_CA_FILE", usage: "PEM CA bundle for the brokers", set: stringSetter(&c.Kafka.TLSCAFile)},
		{flag: "kafka-tls-cert-file", env: "OUTBOX_KAFKA_TLS_CERT_FILE", usage: "PEM client certificate", set: stringSetter(&c.Kafka.TLSCertFile)},
		{flag: "kafka-tls-key-file", env: "OUTBOX_KAFKA_TLS_KEY_FILE", usage: "PEM client key", set: stringSetter(&c.Kafka.TLSKeyFile)},
		{flag: "kafka-tls-insecure-skip-verify", env: contract.EnvTLSInsecureSkipVerify, def: "false", usage: "do not verify the brokers' certificates (lab setups only)", isBool: true, set: boolSetter(&c.Kafka.TLSInsecureSkipVerify)},
		{flag: "kafka-sasl-mechanism", env: "OUTBOX_KAFKA_SASL_MECHANISM", usage: "plain, scram-sha-256 or scram-sha-512 (credentials from OUTBOX_KAFKA_SASL_USERNAME/PASSWORD)", set: stringSetter(&c.Kafka.SASLMechanism)},
		{flag: "log-format", env: "OUTBOX_LOG_FORMAT", def: "json", usage: "json or text", set: stringSetter(&c.LogFormat)},
	}
}

func intSetter(p *int) func(string) error {
	return func(s string) error {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("%q is not an integer", s)
		}
		*p = v
		return nil
	}
}

func durationSetter(p *time.Duration) func(string) error {
	return func(s string) error {
		v, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("%q is not a duration (e.g. 500ms, 5s, 1m)", s)
		}
		*p = v
		return nil
	}
}

func boolSetter(p *bool) func(string) error {
	return func(s string) error {
		v, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("%q is not a boolean (true or false)", s)
		}
		*p = v
		return nil
	}
}

func stringSetter(p *string) func(string) error {
	return func(s string) error {
		*p = strings.TrimSpace(s)
		return nil
	}
}

// parseSettings parses args into the settings, then fills what no flag set from the
// environment. A flag wins over its environment variable. It returns the flag names of the
// settings given either way.
func parseSettings(fs *flag.FlagSet, settings []setting, args []string, getenv func(string) string) (map[string]bool, error) {
	for _, s := range settings {
		usage := s.usage + " (env " + s.env + ")"
		if s.def != "" {
			usage += " (default " + s.def + ")"
		}
		if s.isBool {
			fs.BoolFunc(s.flag, usage, s.set)
		} else {
			fs.Func(s.flag, usage, s.set)
		}
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	for _, s := range settings {
		if given[s.flag] {
			continue
		}
		if v := getenv(s.env); v != "" {
			given[s.flag] = true
			if err := s.set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", s.env, err))
			}
		}
	}
	return given, errors.Join(errs...)
}

// ParseConfig builds the Config of `relay run` from its flags (args, without the subcommand)
// and the environment (getenv, os.Getenv in the binary), and validates it. The database URL and
// the SASL credentials come from the environment only.
func ParseConfig(args []string, getenv func(string) string, usageOut io.Writer) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("relay run", flag.ContinueOnError)
	fs.SetOutput(usageOut)
	fs.Usage = func() {
		fmt.Fprint(usageOut, usageText+"\nFlags of relay run (a flag wins over its environment variable):\n")
		fs.PrintDefaults()
	}
	given, err := parseSettings(fs, runSettings(&c), args, getenv)
	if err != nil {
		return c, err
	}
	if !given["poll-interval"] {
		c.PollInterval = contract.DefaultPollInterval(c.Notify)
	}
	c.DatabaseURL = getenv(EnvDatabaseURL)
	c.Kafka.SASLUsername = getenv(EnvSASLUsername)
	c.Kafka.SASLPassword = getenv(EnvSASLPassword)
	return c, c.Validate()
}
