package relay

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// RunEnv returns every environment variable `relay run` reads: the twins of its flags and the
// secrets (contract.SecretEnv), which have no flag.
func RunEnv() []string {
	var c Config
	var env []string
	for _, s := range runSettings(&c) {
		env = append(env, s.Env)
	}
	return append(env, contract.SecretEnv...)
}

// Environment variables of the relay command line.
const (
	EnvDatabaseURL  = contract.EnvDatabaseURL
	EnvSASLUsername = contract.EnvSASLUsername
	EnvSASLPassword = contract.EnvSASLPassword
)

// setting is one flag with its environment variable (the names in contract.Setting, which the
// operator builds its Deployments from), its usage and how it writes its value.
type setting struct {
	contract.Setting
	usage  string
	def    string // shown in the usage
	isBool bool
	set    func(string) error
}

// runSettings lists the flags of `relay run`, each with its environment variable, writing into c:
// exactly contract.RunSettings (TestSettingsAreTheContract).
func runSettings(c *Config) []setting {
	return []setting{
		{Setting: contract.FlagTable, def: DefaultTable, usage: "outbox table, schema.table", set: func(s string) error {
			t, err := outboxdb.ParseTable(s)
			if err == nil {
				c.Table = t
			}
			return err
		}},
		{Setting: contract.FlagShardCount, def: "1", usage: "number of shards (1 to 256); 0 follows the table's shard layout (as the operator runs relays)", set: intSetter(&c.ShardCount)},
		{Setting: contract.FlagShardIndex, def: "0", usage: "this relay's shard, 0 to shard-count-1 (0 to 255 when following the layout)", set: intSetter(&c.ShardIndex)},
		{Setting: contract.FlagBrokers, usage: "Kafka bootstrap brokers, host:port,...", set: func(s string) error {
			c.Kafka.Brokers = nil
			for _, b := range strings.Split(s, ",") {
				if b = strings.TrimSpace(b); b != "" {
					c.Kafka.Brokers = append(c.Kafka.Brokers, b)
				}
			}
			return nil
		}},
		{Setting: contract.FlagTopicMap, usage: "aggregateType=topic,...", set: func(s string) error {
			m, err := ParseTopicMap(s)
			if err == nil {
				c.TopicMap = m
			}
			return err
		}},
		{Setting: contract.FlagDefaultTopic, usage: "topic of aggregate types the map does not name (empty: they are poison)", set: stringSetter(&c.DefaultTopic)},
		{Setting: contract.FlagBatchSize, def: "500", usage: "rows fetched and published per batch", set: intSetter(&c.BatchSize)},
		{Setting: contract.FlagPollInterval, def: contract.PollInterval.String() + "; " + contract.NotifyPollInterval.String() + " with --notify", usage: "how often a relay that has just published looks for rows (idle, it backs off to --idle-poll-interval; with --notify, how often it looks when no notification comes)", set: durationSetter(&c.PollInterval)},
		{Setting: contract.FlagNotify, def: strconv.FormatBool(contract.DefaultNotify), usage: "wake up on LISTEN/NOTIFY rather than poll: needs the table's insert trigger (relay wakeups set notify), which costs every inserting transaction", isBool: true, set: boolSetter(&c.Notify)},
		{Setting: contract.FlagMaxDelay, def: contract.MaxDelay.String(), usage: "the latency budget of a batch: after a fetch that found events and did not fill a batch, fetch again only this long after it began, so that what commits meanwhile is published together (0 to " + contract.MaxDelayLimit.String() + "; 0: at once)", set: durationSetter(&c.MaxDelay)},
		{Setting: contract.FlagIdlePoll, def: contract.IdlePollInterval.String(), usage: "the longest wait of an idle relay that polls: after an idle spell of T it waits at most T/16 between polls, up to this (0 to " + contract.IdlePollIntervalLimit.String() + "; at or below --poll-interval: no backoff; ignored with --notify)", set: durationSetter(&c.IdlePollInterval)},
		{Setting: contract.FlagLockLease, def: "30s", usage: "how long the lock connection may stay silent before PostgreSQL ends it and a standby takes the shard (a frozen relay; on PostgreSQL 13 the standby ends it)", set: durationSetter(&c.LockLease)},
		{Setting: contract.FlagQueryTimeout, def: contract.RelayQueryTimeout.String(), usage: "how long one database round trip may take before the relay gives up on its connection and connects again (1s to " + contract.RelayQueryTimeout.String() + "; lower notices sooner a database host that vanished without a reset, behind an address that moves)", set: durationSetter(&c.QueryTimeout)},
		{Setting: contract.FlagWaitForStandbys, def: "0", usage: "publish a batch only once this many standbys have flushed its events' WAL, so that a failover to an asynchronous standby never loses a published event (0: publish at once; needs pg_read_all_stats)", set: intSetter(&c.WaitForStandbys)},
		{Setting: contract.FlagMaxAttempts, def: "10", usage: "failed attempts after which an event is poison", set: intSetter(&c.MaxAttempts)},
		{Setting: contract.FlagPoisonPolicy, def: "block", usage: "block or dead-letter", set: modeSetter(&c.PoisonPolicy)},
		{Setting: contract.FlagTracking, usage: "how progress is kept: snapshot (a cursor per shard, no event row updated) or row (sent_at per event); unset, relay run resolves it from the table: snapshot, or row where a row relay marked events sent", set: modeSetter(&c.Tracking)},
		{Setting: contract.FlagRecordTimestamp, def: string(contract.TimestampCreated), usage: "the time each record carries: created (the event's created_at, when the application appended it) or produce (when the relay produced it)", set: modeSetter(&c.RecordTimestamp)},
		{Setting: contract.FlagTopicBy, def: string(contract.TopicByAggregateType), usage: "the column whose value --topic-map matches: aggregate_type or event_type", set: modeSetter(&c.TopicBy)},
		{Setting: contract.FlagTopicHeader, usage: "a member of the row's headers that, where a row has it, names the event's topic (before --topic-map and --default-topic)", set: stringSetter(&c.TopicHeader)},
		{Setting: contract.FlagKeyHeader, usage: "a member of the row's headers that, where a row has it, is the record's key (and picks its partition) instead of the aggregate id", set: stringSetter(&c.KeyHeader)},
		{Setting: contract.FlagCompression, def: string(contract.CompressionNone), usage: "codec of the record batches produced: none, gzip, snappy, lz4 or zstd", set: modeSetter(&c.Compression)},
		{Setting: contract.FlagDelivery, def: string(contract.DeliveryAtLeastOnce), usage: "at-least-once, or exactly-once (snapshot tracking only): each batch and the shard's cursor in one Kafka transaction, for read_committed consumers", set: modeSetter(&c.Delivery)},
		{Setting: contract.FlagCursorTopic, usage: "exactly-once: the compacted topic the shards' cursor records go to, in the transactions of their batches", set: stringSetter(&c.CursorTopic)},
		{Setting: contract.FlagNullPayload, def: string(contract.NullPayloadPoison), usage: "what an event without a value (payload and payload_bytes NULL, or payload_bytes empty) becomes: poison or tombstone (a record with a null value, for compacted topics)", set: modeSetter(&c.NullPayload)},
		{Setting: contract.FlagCloudEvents, def: string(contract.CloudEventsNone), usage: "publish each event as a CloudEvent (Kafka protocol binding): none, binary (the payload as the value, attributes as ce_ headers) or structured (the whole event as the value, application/cloudevents+json)", set: modeSetter(&c.CloudEvents)},
		{Setting: contract.FlagCloudEventsSrc, usage: "the CloudEvents source attribute (empty: /outbox/<table>)", set: stringSetter(&c.CloudEventsSource)},
		{Setting: contract.FlagOTLPEndpoint, usage: "export a producer span per published event over OTLP/gRPC to this URL (http:// or https://), a child of the event's traceparent (empty: off)", set: stringSetter(&c.OTLPEndpoint)},
		{Setting: contract.FlagTraceSample, def: "1", usage: "share of events without a sampled traceparent whose publish is traced, 0 to 1", set: func(s string) error {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return fmt.Errorf("%q is not a number", s)
			}
			c.TraceSampleRatio = v
			return nil
		}},
		{Setting: contract.FlagSchemaRegistry, usage: "frame each payload in the Schema Registry wire format (magic byte, schema id), the schema looked up in this registry's Confluent-compatible API, e.g. http://registry:8081/apis/ccompat/v7 (credentials from " + contract.EnvRegistryUsername + "/PASSWORD; empty: off)", set: stringSetter(&c.Schemas.URL)},
		{Setting: contract.FlagSchemaFormat, def: string(contract.SchemaNone), usage: "the payloads' schema type with --schema-registry-url: json (the jsonb payload), avro or protobuf (payload_bytes, encoded by the application)", set: modeSetter(&c.Schemas.Format)},
		{Setting: contract.FlagSchemaSubject, def: string(contract.SubjectTopic), usage: "the subject of an event's schema: topic (<topic>-value), record (<event type>) or topic-record (<topic>-<event type>)", set: modeSetter(&c.Schemas.Strategy)},
		{Setting: contract.FlagSchemaValidate, def: "false", usage: "check each payload against its schema before publishing it: one that does not fit is poison", isBool: true, set: boolSetter(&c.Schemas.Validate)},
		{Setting: contract.FlagSchemaDir, usage: "a directory of schemas named <event type>.json, .avsc or .proto: the relay registers an event type's schema under its subject (the registry keeps one version per distinct schema) instead of looking up the subject's latest version", set: stringSetter(&c.Schemas.Dir)},
		{Setting: contract.FlagSchemaCAFile, usage: "PEM CA bundle for the registry's https:// URL (empty: the system's)", set: stringSetter(&c.Schemas.CAFile)},
		{Setting: contract.FlagSchemaCertFile, usage: "PEM client certificate for the registry (mutual TLS; with --schema-registry-key-file)", set: stringSetter(&c.Schemas.CertFile)},
		{Setting: contract.FlagSchemaKeyFile, usage: "PEM client key for the registry", set: stringSetter(&c.Schemas.KeyFile)},
		{Setting: contract.FlagDeadLetterTopic, usage: "topic of poison events under dead-letter", set: stringSetter(&c.DeadLetterTopic)},
		{Setting: contract.FlagMaxPayloadBytes, def: strconv.Itoa(contract.DefaultMaxPayloadBytes), usage: "larger payloads are poison", set: intSetter(&c.MaxPayloadBytes)},
		{Setting: contract.FlagHTTPAddr, def: DefaultHTTPAddr, usage: "address of /metrics, /healthz and /readyz (empty: off)", set: stringSetter(&c.HTTPAddr)},
		{Setting: contract.FlagKafkaTLS, def: "false", usage: "connect to the brokers with TLS", isBool: true, set: boolSetter(&c.Kafka.TLS)},
		{Setting: contract.FlagKafkaTLSCAFile, usage: "PEM CA bundle for the brokers", set: stringSetter(&c.Kafka.TLSCAFile)},
		{Setting: contract.FlagKafkaTLSCert, usage: "PEM client certificate", set: stringSetter(&c.Kafka.TLSCertFile)},
		{Setting: contract.FlagKafkaTLSKey, usage: "PEM client key", set: stringSetter(&c.Kafka.TLSKeyFile)},
		{Setting: contract.FlagKafkaTLSInsecure, def: "false", usage: "do not verify the brokers' certificates (lab setups only)", isBool: true, set: boolSetter(&c.Kafka.TLSInsecureSkipVerify)},
		{Setting: contract.FlagKafkaSASL, usage: "plain, scram-sha-256 or scram-sha-512 (credentials from OUTBOX_KAFKA_SASL_USERNAME/PASSWORD)", set: stringSetter(&c.Kafka.SASLMechanism)},
		{Setting: contract.FlagLogFormat, def: "json", usage: "json or text", set: stringSetter(&c.LogFormat)},
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

// modeSetter sets a setting whose type spells its choices (a mode, a policy, a codec) as given;
// Validate says when it is none of them.
func modeSetter[T ~string](p *T) func(string) error {
	return func(s string) error {
		*p = T(s)
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
		usage := s.usage + " (env " + s.Env + ")"
		if s.def != "" {
			usage += " (default " + s.def + ")"
		}
		if s.isBool {
			fs.BoolFunc(s.Flag, usage, s.set)
		} else {
			fs.Func(s.Flag, usage, s.set)
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
		if given[s.Flag] {
			continue
		}
		if v := getenv(s.Env); v != "" {
			given[s.Flag] = true
			if err := s.set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", s.Env, err))
			}
		}
	}
	return given, errors.Join(errs...)
}

// ParseSettings defines on fs the flags of `relay run` that only names, each with its environment variable and usage as `relay run -h` shows them, writing into
// c; it parses args, then fills from getenv what no flag set (a flag wins over its environment
// variable). The subcommands that share some of relay run's settings (--table, --log-format)
// parse them with it, after defining their own flags on fs.
func ParseSettings(fs *flag.FlagSet, c *Config, args []string, getenv func(string) string, only ...contract.Setting) error {
	_, err := parseSettings(fs, pickSettings(runSettings(c), only), args, getenv)
	return err
}

// pickSettings returns the settings that only names, in their order.
func pickSettings(all []setting, only []contract.Setting) []setting {
	var picked []setting
	for _, s := range all {
		if slices.Contains(only, s.Setting) {
			picked = append(picked, s)
		}
	}
	return picked
}

// ParseConfig builds the Config of `relay run` from its flags (args, without the subcommand)
// and the environment (getenv, os.Getenv in the binary), and validates it. The database URL and
// the SASL credentials come from the environment only. Help (-h) is written to usageOut.
func ParseConfig(args []string, getenv func(string) string, usageOut io.Writer) (Config, error) {
	fs := flag.NewFlagSet("relay run", flag.ContinueOnError)
	fs.SetOutput(usageOut)
	return ParseConfigFlags(fs, args, getenv)
}

// ParseConfigFlags is ParseConfig on a flag set of the caller's, with its name, output and
// usage (the relay command line's help precedes fs.PrintDefaults).
func ParseConfigFlags(fs *flag.FlagSet, args []string, getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	given, err := parseSettings(fs, runSettings(&c), args, getenv)
	if err != nil {
		return c, err
	}
	if !given[contract.FlagPollInterval.Flag] {
		c.PollInterval = contract.DefaultPollInterval(c.Notify)
	}
	if !given[contract.FlagTracking.Flag] {
		c.Tracking = "" // the caller resolves it from the table (ResolveTracking)
	}
	c.DatabaseURL = getenv(EnvDatabaseURL)
	c.Kafka.SASLUsername = getenv(EnvSASLUsername)
	c.Kafka.SASLPassword = getenv(EnvSASLPassword)
	c.Schemas.Username = getenv(contract.EnvRegistryUsername)
	c.Schemas.Password = getenv(contract.EnvRegistryPassword)
	return c, c.Validate()
}
