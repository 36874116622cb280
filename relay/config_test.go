package relay

import (
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

const testURL = "postgres://relay:s3cr3t-pw@db.example:5432/shop?sslmode=disable"

func TestParseConfig(t *testing.T) {
	base := map[string]string{
		EnvDatabaseURL:         testURL,
		"OUTBOX_KAFKA_BROKERS": "k1:9092, k2:9092",
		"OUTBOX_DEFAULT_TOPIC": "events",
	}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for k, v := range extra {
			if v == "" {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		return m
	}
	tests := map[string]struct {
		args  []string
		env   map[string]string
		check func(t *testing.T, c Config)
	}{
		"defaults": {
			env: base,
			check: func(t *testing.T, c Config) {
				want := DefaultConfig()
				want.DatabaseURL = testURL
				want.Kafka.Brokers = []string{"k1:9092", "k2:9092"}
				want.DefaultTopic = "events"
				want.Tracking = "" // not given: relay run resolves it from the table
				if !reflect.DeepEqual(c, want) {
					t.Errorf("got  %+v\nwant %+v", c, want)
				}
				if c.Table != outboxdb.MustParseTable("public.outbox") || c.BatchSize != 500 || c.PollInterval != 10*time.Millisecond ||
					c.Notify || c.MaxAttempts != 10 || c.PoisonPolicy != PoisonBlock || c.MaxPayloadBytes != 900000 ||
					c.HTTPAddr != ":8080" || c.LogFormat != "json" || c.ShardCount != 1 || c.ShardIndex != 0 || c.LockLease != 30*time.Second {
					t.Errorf("defaults differ from docs/architecture.md: %+v", c)
				}
			},
		},
		"environment": {
			env: with(map[string]string{
				"OUTBOX_TABLE": "shop.events", "OUTBOX_SHARD_COUNT": "4", "OUTBOX_SHARD_INDEX": "3",
				"OUTBOX_TOPIC_MAP": "order=orders.v1, user=users.v1", "OUTBOX_BATCH_SIZE": "1000",
				"OUTBOX_POLL_INTERVAL": "250ms", "OUTBOX_NOTIFY": "false", "OUTBOX_MAX_ATTEMPTS": "3",
				"OUTBOX_LOCK_LEASE": "10s", "OUTBOX_QUERY_TIMEOUT": "5s", "OUTBOX_POISON_POLICY": "dead-letter", "OUTBOX_DEAD_LETTER_TOPIC": "outbox.dlq",
				"OUTBOX_MAX_PAYLOAD_BYTES": "1000", "OUTBOX_HTTP_ADDR": "127.0.0.1:9000", "OUTBOX_LOG_FORMAT": "text",
				"OUTBOX_KAFKA_SASL_MECHANISM": "scram-sha-512", EnvSASLUsername: "relay", EnvSASLPassword: "pw",
			}),
			check: func(t *testing.T, c Config) {
				if c.Table.String() != "shop.events" || c.ShardCount != 4 || c.ShardIndex != 3 || c.BatchSize != 1000 ||
					c.PollInterval != 250*time.Millisecond || c.Notify || c.MaxAttempts != 3 || c.LockLease != 10*time.Second || c.QueryTimeout != 5*time.Second || c.PoisonPolicy != PoisonDeadLetter ||
					c.DeadLetterTopic != "outbox.dlq" || c.MaxPayloadBytes != 1000 || c.HTTPAddr != "127.0.0.1:9000" ||
					c.LogFormat != "text" || c.Kafka.SASLMechanism != SASLScramSHA512 || c.Kafka.SASLUsername != "relay" ||
					c.Kafka.SASLPassword != "pw" {
					t.Errorf("environment not applied: %+v", c)
				}
				if want := map[string]string{"order": "orders.v1", "user": "users.v1"}; !reflect.DeepEqual(c.TopicMap, want) {
					t.Errorf("topic map %v, want %v", c.TopicMap, want)
				}
			},
		},
		"flags win over the environment": {
			args: []string{"--batch-size", "42", "--notify=false", "--shard-count=2", "-shard-index", "1", "--brokers", "x:1"},
			env:  with(map[string]string{"OUTBOX_BATCH_SIZE": "7", "OUTBOX_NOTIFY": "true", "OUTBOX_SHARD_COUNT": "3"}),
			check: func(t *testing.T, c Config) {
				if c.BatchSize != 42 || c.Notify || c.ShardCount != 2 || c.ShardIndex != 1 || !reflect.DeepEqual(c.Kafka.Brokers, []string{"x:1"}) {
					t.Errorf("flags did not win: %+v", c)
				}
			},
		},
		"insecure skip verify from the environment, as the operator sets it": {
			env: with(map[string]string{"OUTBOX_KAFKA_TLS": "true", "OUTBOX_KAFKA_TLS_INSECURE_SKIP_VERIFY": "true"}),
			check: func(t *testing.T, c Config) {
				tc, err := c.Kafka.tlsConfig()
				if err != nil || tc == nil || !tc.InsecureSkipVerify {
					t.Errorf("tls config %+v, %v: want InsecureSkipVerify", tc, err)
				}
			},
		},
		"a bare bool flag means true": {
			args: []string{"--notify", "--kafka-tls"},
			env:  with(map[string]string{"OUTBOX_NOTIFY": "false"}),
			check: func(t *testing.T, c Config) {
				if !c.Notify || !c.Kafka.TLS {
					t.Errorf("notify %v, tls %v", c.Notify, c.Kafka.TLS)
				}
			},
		},
		"a relay that listens falls back to a slow poll": {
			env: with(map[string]string{"OUTBOX_NOTIFY": "true"}),
			check: func(t *testing.T, c Config) {
				if !c.Notify || c.PollInterval != contract.NotifyPollInterval {
					t.Errorf("notify %v, poll interval %s; want true, %s", c.Notify, c.PollInterval, contract.NotifyPollInterval)
				}
			},
		},
		"a poll interval given stays, notify or not": {
			args: []string{"--notify"},
			env:  with(map[string]string{"OUTBOX_POLL_INTERVAL": "20ms"}),
			check: func(t *testing.T, c Config) {
				if !c.Notify || c.PollInterval != 20*time.Millisecond {
					t.Errorf("notify %v, poll interval %s; want true, 20ms", c.Notify, c.PollInterval)
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, err := ParseConfig(tc.args, envOf(tc.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	valid := map[string]string{
		EnvDatabaseURL:         testURL,
		"OUTBOX_KAFKA_BROKERS": "k1:9092",
		"OUTBOX_TOPIC_MAP":     "order=orders",
	}
	tests := map[string]struct {
		args []string
		env  map[string]string // merged over valid; "" deletes
		want []string          // substrings of the error
	}{
		"no database url":                  {env: map[string]string{EnvDatabaseURL: ""}, want: []string{"OUTBOX_DATABASE_URL is required", "never from a flag"}},
		"database url is a flag":           {args: []string{"--database-url", testURL}, want: []string{"flag provided but not defined: -database-url"}},
		"bad database url":                 {env: map[string]string{EnvDatabaseURL: "postgres://u:s3cr3t-pw@h:notaport/db"}, want: []string{"OUTBOX_DATABASE_URL is not a valid PostgreSQL connection string"}},
		"no brokers":                       {env: map[string]string{"OUTBOX_KAFKA_BROKERS": ""}, want: []string{"--brokers (OUTBOX_KAFKA_BROKERS) is required"}},
		"broker without port":              {args: []string{"--brokers", "kafka"}, want: []string{`--brokers: "kafka" is not host:port`}},
		"bad env integer":                  {env: map[string]string{"OUTBOX_BATCH_SIZE": "lots"}, want: []string{`OUTBOX_BATCH_SIZE: "lots" is not an integer`}},
		"bad env duration":                 {env: map[string]string{"OUTBOX_POLL_INTERVAL": "5"}, want: []string{`OUTBOX_POLL_INTERVAL: "5" is not a duration`}},
		"bad env bool":                     {env: map[string]string{"OUTBOX_NOTIFY": "yes please"}, want: []string{`OUTBOX_NOTIFY: "yes please" is not a boolean`}},
		"bad flag integer":                 {args: []string{"--max-attempts=x"}, want: []string{`invalid value "x" for flag -max-attempts`}},
		"shard index too large":            {args: []string{"--shard-count", "4", "--shard-index", "4"}, want: []string{"--shard-index 4 out of range: want 0 to 3 for --shard-count 4"}},
		"shard count too large":            {args: []string{"--shard-count", "257"}, want: []string{"--shard-count 257 out of range: want 1 to 256, or 0 to follow"}},
		"negative shard count":             {args: []string{"--shard-count", "-1"}, want: []string{"--shard-count -1 out of range"}},
		"following, index 256":             {args: []string{"--shard-count", "0", "--shard-index", "256"}, want: []string{"--shard-index 256 out of range: want 0 to 255"}},
		"batch size zero":                  {args: []string{"--batch-size", "0"}, want: []string{"--batch-size 0 out of range"}},
		"poll interval zero":               {args: []string{"--poll-interval", "0s"}, want: []string{"--poll-interval must be positive"}},
		"max attempts zero":                {args: []string{"--max-attempts", "0"}, want: []string{"--max-attempts must be at least 1"}},
		"lock lease too short":             {args: []string{"--lock-lease", "1s"}, want: []string{"--lock-lease must be at least 3s"}},
		"query timeout too long":           {args: []string{"--query-timeout", "1m"}, want: []string{"--query-timeout 1m0s out of range: want 1s to 30s"}},
		"query timeout too short":          {env: map[string]string{"OUTBOX_QUERY_TIMEOUT": "100ms"}, want: []string{"--query-timeout 100ms out of range"}},
		"unknown policy":                   {args: []string{"--poison-policy", "drop"}, want: []string{`--poison-policy "drop": want "block" or "dead-letter"`}},
		"unknown record timestamp":         {args: []string{"--record-timestamp", "log-append"}, want: []string{`--record-timestamp "log-append": want "created" or "produce"`}},
		"unknown topic-by":                 {args: []string{"--topic-by", "aggregate_id"}, want: []string{`--topic-by "aggregate_id": want "aggregate_type" or "event_type"`}},
		"reserved topic header":            {args: []string{"--topic-header", "event_type"}, want: []string{`--topic-header "event_type": the relay sets that header itself`}},
		"reserved key header":              {env: map[string]string{"OUTBOX_KEY_HEADER": "aggregate_id"}, want: []string{`--key-header "aggregate_id": the relay sets that header itself`}},
		"otlp endpoint without a scheme":   {args: []string{"--otlp-endpoint", "otel:4317"}, want: []string{`--otlp-endpoint "otel:4317": want an http:// or https:// URL`}},
		"unknown compression":              {args: []string{"--compression", "brotli"}, want: []string{`--compression "brotli": want one of [none gzip snappy lz4 zstd]`}},
		"schema format without a registry": {args: []string{"--schema-format", "avro"}, want: []string{"--schema-format avro needs --schema-registry-url"}},
		"registry without a format":        {args: []string{"--schema-registry-url", "http://registry:8081"}, want: []string{"--schema-registry-url needs --schema-format"}},
		"registry url without a scheme":    {args: []string{"--schema-registry-url", "registry:8081", "--schema-format", "json"}, want: []string{"--schema-registry-url: want an http:// or https:// URL"}},
		"registry credentials in the url":  {args: []string{"--schema-registry-url", "http://u:s3cret@registry:8081", "--schema-format", "json"}, want: []string{"credentials do not belong in the URL"}},
		"registry ca over http":            {args: []string{"--schema-registry-url", "http://registry:8081", "--schema-format", "json", "--schema-registry-ca-file", "/ca.pem"}, want: []string{"--schema-registry-ca-file and --schema-registry-cert-file need an https://"}},
		"registry cert without key":        {args: []string{"--schema-registry-url", "https://registry:8081", "--schema-format", "json", "--schema-registry-cert-file", "/c.pem"}, want: []string{"--schema-registry-cert-file and --schema-registry-key-file go together"}},
		"registry username alone": {args: []string{"--schema-registry-url", "http://registry:8081", "--schema-format", "json"},
			env: map[string]string{"OUTBOX_SCHEMA_REGISTRY_USERNAME": "relay"}, want: []string{"need both OUTBOX_SCHEMA_REGISTRY_USERNAME and OUTBOX_SCHEMA_REGISTRY_PASSWORD"}},
		"registry with structured cloud events": {args: []string{"--schema-registry-url", "http://registry:8081", "--schema-format", "json", "--cloudevents", "structured"}, want: []string{"use binary mode"}},
		"unknown schema format":                 {args: []string{"--schema-format", "thrift"}, want: []string{`--schema-format "thrift": want`}},
		"unknown subject strategy":              {args: []string{"--schema-subject-strategy", "topic-name"}, want: []string{`--schema-subject-strategy "topic-name": want "topic", "record" or "topic-record"`}},
		"dead letter needs a topic": {
			args: []string{"--poison-policy", "dead-letter"}, want: []string{"--poison-policy dead-letter needs --dead-letter-topic"}},
		"bad topic map":   {env: map[string]string{"OUTBOX_TOPIC_MAP": "order"}, want: []string{`OUTBOX_TOPIC_MAP: "order" is not aggregateType=topic`}},
		"dup topic map":   {args: []string{"--topic-map", "a=x,a=y"}, want: []string{`aggregate type "a" appears twice`}},
		"bad topic name":  {args: []string{"--topic-map", "order=orders/v1"}, want: []string{`--topic-map order: "orders/v1" is not a valid Kafka topic name`}},
		"no topic at all": {env: map[string]string{"OUTBOX_TOPIC_MAP": ""}, want: []string{"no topic: set --topic-map"}},
		"bad table":       {args: []string{"--table", "Shop.Outbox"}, want: []string{"invalid outbox table name"}},
		"tls files without tls": {
			args: []string{"--kafka-tls-ca-file", "/ca.pem"}, want: []string{"need --kafka-tls=true"}},
		"skip verify without tls": {
			env: map[string]string{"OUTBOX_KAFKA_TLS_INSECURE_SKIP_VERIFY": "true"}, want: []string{"need --kafka-tls=true"}},
		"cert without key": {
			args: []string{"--kafka-tls", "--kafka-tls-cert-file", "/c.pem"}, want: []string{"--kafka-tls-cert-file and --kafka-tls-key-file go together"}},
		"sasl without credentials": {
			args: []string{"--kafka-sasl-mechanism", "plain"}, want: []string{"--kafka-sasl-mechanism plain needs OUTBOX_KAFKA_SASL_USERNAME and OUTBOX_KAFKA_SASL_PASSWORD"}},
		"unknown sasl": {
			args: []string{"--kafka-sasl-mechanism", "gssapi"}, want: []string{`--kafka-sasl-mechanism "gssapi": want`}},
		"credentials without sasl": {
			env: map[string]string{EnvSASLPassword: "pw"}, want: []string{"--kafka-sasl-mechanism is empty"}},
		"bad log format": {args: []string{"--log-format", "xml"}, want: []string{`--log-format "xml": want json or text`}},
		"stray argument": {args: []string{"extra"}, want: []string{`unexpected argument "extra"`}},
		"every problem at once": {
			args: []string{"--batch-size", "0", "--max-attempts", "0"},
			env:  map[string]string{EnvDatabaseURL: ""},
			want: []string{"OUTBOX_DATABASE_URL is required", "--batch-size 0", "--max-attempts must be at least 1"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range valid {
				env[k] = v
			}
			for k, v := range tc.env {
				if v == "" {
					delete(env, k)
				} else {
					env[k] = v
				}
			}
			_, err := ParseConfig(tc.args, envOf(env), io.Discard)
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "s3cr3t-pw") {
				t.Errorf("error leaks the database password: %q", err)
			}
		})
	}
}

func TestParseTopicMap(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    map[string]string
		wantErr string
	}{
		"empty":      {in: "", want: map[string]string{}},
		"one":        {in: "order=orders", want: map[string]string{"order": "orders"}},
		"spaces":     {in: " order = orders , user=users ,", want: map[string]string{"order": "orders", "user": "users"}},
		"no equals":  {in: "order", wantErr: `"order" is not aggregateType=topic`},
		"no topic":   {in: "order=", wantErr: `"order=" is not aggregateType=topic`},
		"no type":    {in: "=orders", wantErr: `"=orders" is not aggregateType=topic`},
		"duplicated": {in: "a=x,a=x", wantErr: `aggregate type "a" appears twice`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseTopicMap(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestRedactor(t *testing.T) {
	const pw = "p@ss w/rd"
	r := newRedactor(testURL, "s3cr3t-pw", pw, "")
	for _, in := range []string{
		"connect " + testURL + " failed",
		"password s3cr3t-pw rejected",
		"as typed: " + pw,
		"query-escaped: p%40ss+w%2Frd",
		"path-escaped: p@ss%20w%2Frd",
	} {
		out := r.String(in)
		if strings.Contains(out, "s3cr3t") || strings.Contains(out, "ss w") || strings.Contains(out, "w%2Frd") {
			t.Errorf("%q -> %q still holds the secret", in, out)
		}
	}
	if got := r.String("nothing secret"); got != "nothing secret" {
		t.Errorf("changed a string without secrets: %q", got)
	}
}

func TestDBTargetHidesPassword(t *testing.T) {
	got := DBTarget(testURL)
	if got != "db.example:5432/shop" {
		t.Errorf("dbTarget = %q", got)
	}
	if strings.Contains(DBTarget("postgres://u:p@h:x/d"), "p@") {
		t.Error("dbTarget of a bad URL leaks it")
	}
}

// TestManagedEnvIsReadByTheRelay: every variable the operator sets (and forbids in
// spec.relay.env) is one `relay run` reads; a renamed setting would otherwise be silently
// ignored in every pod.
func TestManagedEnvIsReadByTheRelay(t *testing.T) {
	reads := RunEnv()
	for _, name := range contract.ManagedEnv {
		if !slices.Contains(reads, name) {
			t.Errorf("the operator manages %s, which relay run does not read", name)
		}
	}
}
