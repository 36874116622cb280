package v1alpha1_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/envtestutil"
)

func TestMain(m *testing.M) { os.Exit(envtestutil.Run(m)) }

// relayObject returns a valid OutboxRelay as unstructured data, so a case can put any JSON in any
// field, including values the Go types could not hold.
func relayObject(ns, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "outbox.dev/v1alpha1",
		"kind":       "OutboxRelay",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"database": map[string]any{"secretRef": map[string]any{"name": "shop-db"}},
			"kafka":    map[string]any{"brokers": []any{"kafka-0.kafka.svc:9092"}},
			"topics":   map[string]any{"order": "orders.events"},
		},
	}}
	return u
}

func set(path string, v any) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		if err := unstructured.SetNestedField(u.Object, v, strings.Split(path, ".")...); err != nil {
			panic(err)
		}
	}
}

func del(path string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		unstructured.RemoveNestedField(u.Object, strings.Split(path, ".")...)
	}
}

// setMap sets a map-valued field whose keys may contain dots.
func setMap(path string, m map[string]any) func(*unstructured.Unstructured) {
	return set(path, m)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// TestInvalidOutboxRelaysAreRejected sends invalid OutboxRelays to a real API server and checks
// that each is refused with a message a person understands.
func TestInvalidOutboxRelaysAreRejected(t *testing.T) {
	env := envtestutil.Shared(t)
	ns := env.CreateNamespace(t, "invalid")
	const tableMsg = "table must be 'name' or 'schema.name'"
	const topicMsg = "must be a Kafka topic name"
	const keyMsg = "aggregate types must be 1 to 255 characters without ',', '=' or whitespace"
	tests := []struct {
		name   string
		mutate []func(*unstructured.Unstructured)
		want   string
	}{
		{"table with a quote", []func(*unstructured.Unstructured){set("spec.database.table", `outbox"; DROP TABLE users; --`)}, tableMsg},
		{"table with a semicolon", []func(*unstructured.Unstructured){set("spec.database.table", "outbox;drop")}, tableMsg},
		{"table with a single quote", []func(*unstructured.Unstructured){set("spec.database.table", "out'box")}, tableMsg},
		{"table with a space", []func(*unstructured.Unstructured){set("spec.database.table", "out box")}, tableMsg},
		{"table in upper case", []func(*unstructured.Unstructured){set("spec.database.table", "Outbox")}, tableMsg},
		{"table starting with a digit", []func(*unstructured.Unstructured){set("spec.database.table", "1outbox")}, tableMsg},
		{"table with three parts", []func(*unstructured.Unstructured){set("spec.database.table", "db.shop.outbox")}, tableMsg},
		{"table name of 41 characters", []func(*unstructured.Unstructured){set("spec.database.table", strings.Repeat("a", 41))}, tableMsg},
		{"schema of 64 characters", []func(*unstructured.Unstructured){set("spec.database.table", strings.Repeat("s", 64)+".outbox")}, tableMsg},
		{"empty table", []func(*unstructured.Unstructured){set("spec.database.table", "")}, "spec.database.table in body should be at least 1 chars long"},
		{"missing secret reference", []func(*unstructured.Unstructured){del("spec.database.secretRef")}, "spec.database.secretRef: Required value"},
		{"missing database", []func(*unstructured.Unstructured){del("spec.database")}, "spec.database: Required value"},
		{"empty secret name", []func(*unstructured.Unstructured){set("spec.database.secretRef.name", "")}, "spec.database.secretRef.name in body should be at least 1 chars long"},
		{"secret name in upper case", []func(*unstructured.Unstructured){set("spec.database.secretRef.name", "Shop_DB")}, "must be the name of a Secret"},
		{"secret key with a space", []func(*unstructured.Unstructured){set("spec.database.secretRef.key", "u rl")}, "must be a Secret key"},
		{"no brokers", []func(*unstructured.Unstructured){set("spec.kafka.brokers", []any{})}, "spec.kafka.brokers in body should have at least 1 items"},
		{"broker without a port", []func(*unstructured.Unstructured){set("spec.kafka.brokers", []any{"kafka"})}, "must be host:port"},
		{"broker with a scheme", []func(*unstructured.Unstructured){set("spec.kafka.brokers", []any{"PLAINTEXT://kafka:9092"})}, "must be host:port"},
		{"broker with port 0", []func(*unstructured.Unstructured){set("spec.kafka.brokers", []any{"kafka:0"})}, "port must be between 1 and 65535"},
		{"broker with port 70000", []func(*unstructured.Unstructured){set("spec.kafka.brokers", []any{"kafka:70000"})}, "port must be between 1 and 65535"},
		{"duplicate brokers", []func(*unstructured.Unstructured){set("spec.kafka.brokers", []any{"k:9092", "k:9092"})}, "Duplicate value"},
		{"topic with a space", []func(*unstructured.Unstructured){setMap("spec.topics", map[string]any{"order": "orders events"})}, topicMsg},
		{"topic with a slash", []func(*unstructured.Unstructured){setMap("spec.topics", map[string]any{"order": "orders/events"})}, topicMsg},
		{"topic '.'", []func(*unstructured.Unstructured){setMap("spec.topics", map[string]any{"order": "."})}, topicMsg},
		{"topic '..'", []func(*unstructured.Unstructured){setMap("spec.topics", map[string]any{"order": ".."})}, topicMsg},
		{"topic of 250 characters", []func(*unstructured.Unstructured){setMap("spec.topics", map[string]any{"order": strings.Repeat("t", 250)})}, "may not be more than 249 bytes"},
		{"empty aggregate type", []func(*unstructured.Unstructured){setMap("spec.topics", map[string]any{"": "orders"})}, keyMsg},
		{"aggregate type with a comma", []func(*unstructured.Unstructured){setMap("spec.topics", map[string]any{"a,b": "orders"})}, keyMsg},
		{"aggregate type with '='", []func(*unstructured.Unstructured){setMap("spec.topics", map[string]any{"a=b": "orders"})}, keyMsg},
		{"aggregate type of 256 characters", []func(*unstructured.Unstructured){setMap("spec.topics", map[string]any{strings.Repeat("a", 256): "orders"})}, keyMsg},
		{"default topic with a quote", []func(*unstructured.Unstructured){set("spec.defaultTopic", "events'")}, topicMsg},
		{"neither topics nor default topic", []func(*unstructured.Unstructured){del("spec.topics")}, "set topics, defaultTopic or routing.topicHeader"},
		{"routed by a key header alone", []func(*unstructured.Unstructured){del("spec.topics"), set("spec.routing.keyHeader", "entity")}, "set topics, defaultTopic or routing.topicHeader"},
		{"topic header the relay sets", []func(*unstructured.Unstructured){set("spec.routing.topicHeader", "event_type")}, "the relay sets this header itself"},
		{"key header the relay sets", []func(*unstructured.Unstructured){set("spec.routing.keyHeader", "outbox_replay")}, "the relay sets this header itself"},
		{"empty key header", []func(*unstructured.Unstructured){set("spec.routing.keyHeader", "")}, "spec.routing.keyHeader in body should be at least 1 chars long"},
		{"topic by aggregate id", []func(*unstructured.Unstructured){set("spec.routing.topicBy", "AggregateId")}, `Unsupported value: "AggregateId"`},
		{"cloud events without a mode", []func(*unstructured.Unstructured){set("spec.publish.cloudEvents", map[string]any{"source": "/x"})}, "spec.publish.cloudEvents.mode: Required value"},
		{"exactly-once without tracking", []func(*unstructured.Unstructured){set("spec.publish.delivery", "ExactlyOnce"), set("spec.publish.cursorTopic", "outbox.cursors")}, "ExactlyOnce needs publish.tracking: Snapshot"},
		{"exactly-once under row tracking", []func(*unstructured.Unstructured){set("spec.publish.delivery", "ExactlyOnce"), set("spec.publish.tracking", "Row"), set("spec.publish.cursorTopic", "outbox.cursors")}, "that gap is at-least-once by construction"},
		{"exactly-once without a cursor topic", []func(*unstructured.Unstructured){set("spec.publish.delivery", "ExactlyOnce"), set("spec.publish.tracking", "Snapshot")}, "ExactlyOnce needs publish.cursorTopic"},
		{"exactly-once with a bad cursor topic", []func(*unstructured.Unstructured){set("spec.publish.delivery", "ExactlyOnce"), set("spec.publish.tracking", "Snapshot"), set("spec.publish.cursorTopic", "no spaces")}, topicMsg},
		{"delivery misspelt", []func(*unstructured.Unstructured){set("spec.publish.delivery", "exactly-once")}, "spec.publish.delivery: Unsupported value"},
		{"schema registry with structured cloud events", []func(*unstructured.Unstructured){set("spec.publish.cloudEvents", map[string]any{"mode": "Structured"}), set("spec.publish.schemaRegistry", map[string]any{"url": "http://registry:8081", "format": "JSON"})}, "use Binary mode"},
		{"schema registry ca over http", []func(*unstructured.Unstructured){set("spec.publish.schemaRegistry", map[string]any{"url": "http://registry:8081", "format": "Avro", "caSecretRef": map[string]any{"name": "registry-ca"}})}, "caSecretRef and certSecretRef need an https:// url"},
		{"schema registry cert without key", []func(*unstructured.Unstructured){set("spec.publish.schemaRegistry", map[string]any{"url": "https://registry:8081", "format": "Avro", "certSecretRef": map[string]any{"name": "client"}})}, "certSecretRef and keySecretRef go together"},
		{"schema registry credentials in the url", []func(*unstructured.Unstructured){set("spec.publish.schemaRegistry", map[string]any{"url": "https://user:pw@registry:8081", "format": "Avro"})}, "spec.publish.schemaRegistry.url in body should match"},
		{"schema registry without a format", []func(*unstructured.Unstructured){set("spec.publish.schemaRegistry", map[string]any{"url": "http://registry:8081"})}, "spec.publish.schemaRegistry.format: Required value"},
		{"schema registry unknown strategy", []func(*unstructured.Unstructured){set("spec.publish.schemaRegistry", map[string]any{"url": "http://registry:8081", "format": "JSON", "subjectStrategy": "Topic"})}, "spec.publish.schemaRegistry.subjectStrategy: Unsupported value"},
		{"cloud events source with a space", []func(*unstructured.Unstructured){set("spec.publish.cloudEvents", map[string]any{"mode": "Structured", "source": "/a b"})}, "spec.publish.cloudEvents.source in body should match"},
		{"tracing to a bare host", []func(*unstructured.Unstructured){set("spec.publish.tracing", map[string]any{"otlpEndpoint": "otel-collector:4317"})}, "spec.publish.tracing.otlpEndpoint in body should match"},
		{"tracing 101 percent", []func(*unstructured.Unstructured){set("spec.publish.tracing", map[string]any{"otlpEndpoint": "http://c:4317", "samplePercent": int64(101)})}, "spec.publish.tracing.samplePercent in body should be less than or equal to 100"},
		{"null payload dropped", []func(*unstructured.Unstructured){set("spec.publish.nullPayload", "Drop")}, `Unsupported value: "Drop"`},
		{"compression brotli", []func(*unstructured.Unstructured){set("spec.publish.compression", "Brotli")}, `Unsupported value: "Brotli"`},
		{"zero shards", []func(*unstructured.Unstructured){set("spec.shards", int64(0))}, "spec.shards in body should be greater than or equal to 1"},
		{"negative shards", []func(*unstructured.Unstructured){set("spec.shards", int64(-1))}, "spec.shards in body should be greater than or equal to 1"},
		{"257 shards", []func(*unstructured.Unstructured){set("spec.shards", int64(257))}, "spec.shards in body should be less than or equal to 256"},
		{"a million shards", []func(*unstructured.Unstructured){set("spec.shards", int64(1_000_000))}, "spec.shards in body should be less than or equal to 256"},
		{"batch size 0", []func(*unstructured.Unstructured){set("spec.publish.batchSize", int64(0))}, "spec.publish.batchSize in body should be greater than or equal to 1"},
		{"batch size 10001", []func(*unstructured.Unstructured){set("spec.publish.batchSize", int64(10001))}, "spec.publish.batchSize in body should be less than or equal to 10000"},
		{"poll interval in words", []func(*unstructured.Unstructured){set("spec.publish.pollInterval", "5 seconds")}, "pollInterval must be a duration"},
		{"poll interval 0s", []func(*unstructured.Unstructured){set("spec.publish.pollInterval", "0s")}, "pollInterval must be between 10ms and 1h"},
		{"max delay in words", []func(*unstructured.Unstructured){set("spec.publish.maxDelay", "5 ms")}, "maxDelay must be a duration"},
		{"max delay 2s", []func(*unstructured.Unstructured){set("spec.publish.maxDelay", "2s")}, "maxDelay must be between 0s and 1s"},
		{"idle poll interval in words", []func(*unstructured.Unstructured){set("spec.publish.idlePollInterval", "5 s")}, "idlePollInterval must be a duration"},
		{"idle poll interval 6m", []func(*unstructured.Unstructured){set("spec.publish.idlePollInterval", "6m")}, "idlePollInterval must be between 0s and 5m"},
		{"max attempts 0", []func(*unstructured.Unstructured){set("spec.publish.maxAttempts", int64(0))}, "spec.publish.maxAttempts in body should be greater than or equal to 1"},
		{"payload limit 10 bytes", []func(*unstructured.Unstructured){set("spec.publish.maxPayloadBytes", int64(10))}, "spec.publish.maxPayloadBytes in body should be greater than or equal to 1024"},
		{"retention of exactly 24h", []func(*unstructured.Unstructured){set("spec.partitions.retention", "24h")}, "retention must be longer than 24h"},
		{"retention of 12h", []func(*unstructured.Unstructured){set("spec.partitions.retention", "12h")}, "retention must be longer than 24h"},
		{"retention in days", []func(*unstructured.Unstructured){set("spec.partitions.retention", "7d")}, "retention must be a duration"},
		{"premake 31 days", []func(*unstructured.Unstructured){set("spec.partitions.premakeDays", int64(31))}, "spec.partitions.premakeDays in body should be less than or equal to 30"},
		{"premake -1 days", []func(*unstructured.Unstructured){set("spec.partitions.premakeDays", int64(-1))}, "spec.partitions.premakeDays in body should be greater than or equal to 0"},
		{"dead letter without topic", []func(*unstructured.Unstructured){set("spec.poisonEvents.policy", "DeadLetter")}, "poisonEvents.deadLetterTopic is required when policy is DeadLetter"},
		{"unknown poison policy", []func(*unstructured.Unstructured){set("spec.poisonEvents.policy", "Drop")}, `Unsupported value: "Drop"`},
		{"dead-letter topic '..'", []func(*unstructured.Unstructured){set("spec.poisonEvents.policy", "DeadLetter"), set("spec.poisonEvents.deadLetterTopic", "..")}, topicMsg},
		{"unknown SASL mechanism", []func(*unstructured.Unstructured){set("spec.kafka.sasl", map[string]any{"mechanism": "GSSAPI", "secretRef": map[string]any{"name": "k"}})}, `Unsupported value: "GSSAPI"`},
		{"SASL without a Secret", []func(*unstructured.Unstructured){set("spec.kafka.sasl", map[string]any{"mechanism": "PLAIN"})}, "spec.kafka.sasl.secretRef: Required value"},
		{"SASL without TLS", []func(*unstructured.Unstructured){set("spec.kafka.sasl", map[string]any{"mechanism": "SCRAM-SHA-512", "secretRef": map[string]any{"name": "k"}})},
			"kafka.sasl without kafka.tls sends the credentials"},
		{"SASL with TLS turned off", []func(*unstructured.Unstructured){set("spec.kafka.sasl", map[string]any{"mechanism": "PLAIN", "secretRef": map[string]any{"name": "k"}}),
			set("spec.kafka.tls", map[string]any{"enabled": false})}, "kafka.sasl without kafka.tls sends the credentials"},
		{"unknown SASL plaintext", []func(*unstructured.Unstructured){set("spec.kafka.sasl", map[string]any{"mechanism": "PLAIN", "secretRef": map[string]any{"name": "k"}, "plaintext": "Maybe"}),
			set("spec.kafka.tls", map[string]any{"enabled": true})}, `Unsupported value: "Maybe"`},
		{"TLS certificate without key", []func(*unstructured.Unstructured){set("spec.kafka.tls", map[string]any{"certSecretRef": map[string]any{"name": "client"}})}, "tls: set certSecretRef and keySecretRef together"},
		{"env overrides the database URL", []func(*unstructured.Unstructured){set("spec.relay.env", []any{map[string]any{"name": "OUTBOX_DATABASE_URL", "value": "postgres://evil"}})}, "relay.env must not set OUTBOX_DATABASE_URL"},
		{"env overrides the shard index", []func(*unstructured.Unstructured){set("spec.relay.env", []any{map[string]any{"name": "OUTBOX_SHARD_INDEX", "value": "3"}})}, "relay.env must not set a variable the operator manages"},
		{"pod label overrides the selector", []func(*unstructured.Unstructured){setMap("spec.relay.podLabels", map[string]any{"app.kubernetes.io/instance": "other"})}, "relay.podLabels must not set"},
		{"unknown pull policy", []func(*unstructured.Unstructured){set("spec.relay.imagePullPolicy", "Sometimes")}, `Unsupported value: "Sometimes"`},
		{"lag target 0", []func(*unstructured.Unstructured){set("spec.lagTarget", int64(0))}, "spec.lagTarget in body should be greater than or equal to 1"},
		{"name of 54 characters", []func(*unstructured.Unstructured){set("metadata.name", strings.Repeat("r", 54))}, "metadata.name must have at most 53 characters"},
		{"autoscaling min above max", []func(*unstructured.Unstructured){set("spec.autoscaling", map[string]any{"minShards": int64(5), "maxShards": int64(4)})}, "autoscaling.minShards must not exceed autoscaling.maxShards"},
		{"autoscaling without max", []func(*unstructured.Unstructured){set("spec.autoscaling", map[string]any{"minShards": int64(2)})}, "spec.autoscaling.maxShards: Required value"},
		{"autoscaling max 257", []func(*unstructured.Unstructured){set("spec.autoscaling", map[string]any{"maxShards": int64(257)})}, "spec.autoscaling.maxShards in body should be less than or equal to 256"},
		{"autoscaling target 0", []func(*unstructured.Unstructured){set("spec.autoscaling", map[string]any{"maxShards": int64(4), "targetLagSeconds": int64(0)})}, "targetLagSeconds in body should be greater than or equal to 1"},
		{"autoscaling window of 2h", []func(*unstructured.Unstructured){set("spec.autoscaling", map[string]any{"maxShards": int64(4), "scaleUpStabilization": "2h"})}, "scaleUpStabilization must be between 0s and 1h"},
		{"autoscaling negative window", []func(*unstructured.Unstructured){set("spec.autoscaling", map[string]any{"maxShards": int64(4), "scaleDownStabilization": "-1m"})}, "scaleDownStabilization must be between 0s and 24h"},
	}
	if len(tests) < 30 {
		t.Fatalf("only %d cases", len(tests))
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := relayObject(ns, "bad-"+strings.ToLower(strings.ReplaceAll(strings.Fields(tc.name)[0], "'", ""))+"-"+itoa(i))
			for _, m := range tc.mutate {
				m(u)
			}
			err := env.Client.Create(ctx(t), u)
			if err == nil {
				t.Fatalf("accepted; want an error containing %q", tc.want)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("error is not Invalid: %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error does not contain %q:\n%v", tc.want, err)
			}
			t.Log(err)
		})
	}
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// TestValidOutboxRelaysAreAcceptedWithDefaults checks that valid variants pass and that the
// server fills in the documented defaults.
func TestValidOutboxRelaysAreAcceptedWithDefaults(t *testing.T) {
	env := envtestutil.Shared(t)
	ns := env.CreateNamespace(t, "valid")
	tests := map[string][]func(*unstructured.Unstructured){
		"minimal":                nil,
		"schema-qualified table": {set("spec.database.table", "shop.outbox_events")},
		"underscore table":       {set("spec.database.table", "_outbox")},
		"longest names":          {set("spec.database.table", strings.Repeat("s", 63)+"."+strings.Repeat("t", 40))},
		"ipv6 broker":            {set("spec.kafka.brokers", []any{"[fd00::1]:9092", "10.0.0.1:9093"})},
		"default topic only":     {del("spec.topics"), set("spec.defaultTopic", "all.events_v1-x")},
		"topic header only":      {del("spec.topics"), set("spec.routing.topicHeader", "destination")},
		"routing and compression": {set("spec.routing", map[string]any{"topicBy": "EventType", "topicHeader": "destination", "keyHeader": "entity"}), set("spec.publish.compression", "Zstd"), set("spec.publish.nullPayload", "Tombstone"),
			set("spec.publish.cloudEvents", map[string]any{"mode": "Binary", "source": "https://shop.example/orders"}),
			set("spec.publish.tracing", map[string]any{"otlpEndpoint": "http://otel-collector:4317", "samplePercent": int64(10)})},
		"schema registry": {set("spec.publish.cloudEvents", map[string]any{"mode": "Binary"}), set("spec.publish.schemaRegistry", map[string]any{
			"url": "https://registry.shop:8081/apis/ccompat/v7", "format": "Protobuf", "subjectStrategy": "TopicRecordName", "validation": "Enforce",
			"schemasConfigMapRef": map[string]any{"name": "shop-schemas"}, "credentialsSecretRef": map[string]any{"name": "registry-user"},
			"caSecretRef": map[string]any{"name": "registry-ca"}, "certSecretRef": map[string]any{"name": "client"}, "keySecretRef": map[string]any{"name": "client"}})},
		"dead letter with topic":     {set("spec.poisonEvents", map[string]any{"policy": "DeadLetter", "deadLetterTopic": "outbox.dlq"})},
		"retention of 25h":           {set("spec.partitions.retention", "25h")},
		"256 shards":                 {set("spec.shards", int64(256))},
		"max delay 0s":               {set("spec.publish.maxDelay", "0s")},
		"max delay 1s":               {set("spec.publish.maxDelay", "1s")},
		"idle poll interval 0s":      {set("spec.publish.idlePollInterval", "0s")},
		"idle poll interval 5m":      {set("spec.publish.idlePollInterval", "5m")},
		"sasl in plaintext, allowed": {set("spec.kafka.sasl", map[string]any{"mechanism": "SCRAM-SHA-256", "secretRef": map[string]any{"name": "kafka-user"}, "plaintext": "Allowed"})},
		"tls and sasl":               {set("spec.kafka.tls", map[string]any{"caSecretRef": map[string]any{"name": "kafka-ca"}, "certSecretRef": map[string]any{"name": "client"}, "keySecretRef": map[string]any{"name": "client"}}), set("spec.kafka.sasl", map[string]any{"mechanism": "SCRAM-SHA-512", "secretRef": map[string]any{"name": "kafka-user"}})},
		"log format env":             {set("spec.relay.env", []any{map[string]any{"name": "OUTBOX_LOG_FORMAT", "value": "text"}})},
		"name of 53 characters":      {set("metadata.name", strings.Repeat("r", 53))},
		"autoscaling":                {set("spec.autoscaling", map[string]any{"minShards": int64(2), "maxShards": int64(8), "scaleUpStabilization": "30s"})},
		"exactly-once, autoscaled": {set("spec.publish.delivery", "ExactlyOnce"), set("spec.publish.tracking", "Snapshot"), set("spec.publish.cursorTopic", "outbox.cursors"),
			set("spec.autoscaling", map[string]any{"minShards": int64(1), "maxShards": int64(4)})},
		"exactly-once on four shards": {set("spec.publish.delivery", "ExactlyOnce"), set("spec.publish.tracking", "Snapshot"), set("spec.publish.cursorTopic", "outbox.cursors"), set("spec.shards", int64(4))},
	}
	i := 0
	for name, mutate := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			u := relayObject(ns, "ok-"+itoa(i))
			for _, m := range mutate {
				m(u)
			}
			if err := env.Client.Create(ctx(t), u); err != nil {
				t.Fatalf("refused: %v", err)
			}
		})
	}

	var got v1alpha1.OutboxRelay
	u := relayObject(ns, "ok-defaults")
	if err := env.Client.Create(ctx(t), u); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: "ok-defaults"}, &got); err != nil {
		t.Fatal(err)
	}
	s := got.Spec
	checks := []struct {
		what      string
		got, want any
	}{
		{"database.secretRef.key", string(s.Database.SecretRef.Key), "url"},
		{"database.table", s.Database.Table, "outbox"},
		{"shards", s.Shards, int32(1)},
		{"publish.batchSize", s.Publish.BatchSize, int32(500)},
		// No default in the API: the relay's depends on notify (contract.DefaultPollInterval).
		{"publish.pollInterval", s.Publish.PollInterval == nil, true},
		{"publish.notify", s.Publish.Notify != nil && !*s.Publish.Notify, true},
		{"publish.maxAttempts", s.Publish.MaxAttempts, int32(10)},
		{"poisonEvents.policy", s.PoisonEvents.Policy, v1alpha1.PoisonBlock},
		// The markers spell the defaults of the database protocol's partition upkeep.
		{"partitions.premakeDays", s.Partitions.PremakeDays != nil && *s.Partitions.PremakeDays == outboxdb.DefaultPremakeDays, true},
		{"partitions.retention", s.Partitions.Retention != nil && s.Partitions.Retention.Duration == outboxdb.DefaultRetention, true},
		{"lagTarget", s.LagTarget, int32(60)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("default %s = %v, want %v", c.what, c.got, c.want)
		}
	}
}

// TestTableIsImmutable checks the CEL transition rule on spec.database.table, also when the table
// was defaulted, and that other fields stay editable.
func TestTableIsImmutable(t *testing.T) {
	env := envtestutil.Shared(t)
	ns := env.CreateNamespace(t, "immutable")
	tests := map[string]struct {
		initial, changed string // "" leaves the field out
	}{
		"explicit to other":           {initial: "shop.outbox", changed: "shop.outbox2"},
		"defaulted to other":          {initial: "", changed: "shop.outbox"},
		"defaulted to qualified same": {initial: "", changed: "public.outbox"},
	}
	i := 0
	for name, tc := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			u := relayObject(ns, "imm-"+itoa(i))
			if tc.initial != "" {
				set("spec.database.table", tc.initial)(u)
			}
			if err := env.Client.Create(ctx(t), u); err != nil {
				t.Fatal(err)
			}
			set("spec.database.table", tc.changed)(u)
			err := env.Client.Update(ctx(t), u)
			if err == nil || !strings.Contains(err.Error(), "database.table is immutable") {
				t.Fatalf("table change %q -> %q: got %v, want immutable error", tc.initial, tc.changed, err)
			}
			// Other fields stay editable.
			if err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(u), u); err != nil {
				t.Fatal(err)
			}
			set("spec.shards", int64(4))(u)
			if err := env.Client.Update(ctx(t), u); err != nil {
				t.Fatalf("shards change refused: %v", err)
			}
		})
	}
}

// TestScaleSubresource checks that the scale subresource reads and writes spec.shards and is bounded
// by the same schema.
func TestScaleSubresource(t *testing.T) {
	env := envtestutil.Shared(t)
	ns := env.CreateNamespace(t, "scale")
	u := relayObject(ns, "scaled")
	if err := env.Client.Create(ctx(t), u); err != nil {
		t.Fatal(err)
	}
	relay := &v1alpha1.OutboxRelay{}
	if err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(u), relay); err != nil {
		t.Fatal(err)
	}
	relay.Status.Selector = "app.kubernetes.io/name=outbox-relay,app.kubernetes.io/instance=scaled"
	relay.Status.Shards = 1
	if err := env.Client.Status().Update(ctx(t), relay); err != nil {
		t.Fatal(err)
	}
	scale := &autoscalingv1.Scale{}
	if err := env.Client.SubResource("scale").Get(ctx(t), relay, scale); err != nil {
		t.Fatal(err)
	}
	if scale.Spec.Replicas != 1 || scale.Status.Selector != relay.Status.Selector {
		t.Fatalf("scale = %+v", scale)
	}
	scale.Spec.Replicas = 6
	if err := env.Client.SubResource("scale").Update(ctx(t), relay, client.WithSubResourceBody(scale)); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(u), relay); err != nil {
		t.Fatal(err)
	}
	if relay.Spec.Shards != 6 {
		t.Fatalf("spec.shards = %d after scaling to 6", relay.Spec.Shards)
	}
	scale.Spec.Replicas = 300
	scale.ResourceVersion = ""
	err := env.Client.SubResource("scale").Update(ctx(t), relay, client.WithSubResourceBody(scale))
	if err == nil || !strings.Contains(err.Error(), "less than or equal to 256") {
		t.Fatalf("scaling to 300: %v", err)
	}
}

// TestAutoscalingRefusesExternalScaling: while spec.autoscaling is set, spec.shards is frozen,
// so an HPA, KEDA or kubectl scale writing through the scale subresource is refused with a
// message that says why; turning autoscaling off lets them scale again.
func TestAutoscalingRefusesExternalScaling(t *testing.T) {
	env := envtestutil.Shared(t)
	ns := env.CreateNamespace(t, "autoscaled")
	u := relayObject(ns, "autoscaled")
	set("spec.autoscaling", map[string]any{"maxShards": int64(8)})(u)
	if err := env.Client.Create(ctx(t), u); err != nil {
		t.Fatal(err)
	}
	relay := &v1alpha1.OutboxRelay{}
	if err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(u), relay); err != nil {
		t.Fatal(err)
	}
	if a := relay.Spec.Autoscaling; a == nil || a.MinShards != 1 || a.TargetLagSeconds != 30 ||
		a.ScaleUpStabilization == nil || a.ScaleUpStabilization.Duration != 0 ||
		a.ScaleDownStabilization == nil || a.ScaleDownStabilization.Duration != 5*time.Minute {
		t.Fatalf("autoscaling defaults: %+v", a)
	}
	const msg = "spec.shards cannot change while spec.autoscaling is set"
	scale := &autoscalingv1.Scale{}
	if err := env.Client.SubResource("scale").Get(ctx(t), relay, scale); err != nil {
		t.Fatal(err)
	}
	scale.Spec.Replicas = 3
	err := env.Client.SubResource("scale").Update(ctx(t), relay, client.WithSubResourceBody(scale))
	if err == nil || !strings.Contains(err.Error(), msg) {
		t.Fatalf("scaling an autoscaled relay through /scale: %v", err)
	}
	relay.Spec.Shards = 3
	if err := env.Client.Update(ctx(t), relay); err == nil || !strings.Contains(err.Error(), msg) {
		t.Fatalf("editing spec.shards of an autoscaled relay: %v", err)
	}

	// Autoscaling off: the scale subresource works again.
	if err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(u), relay); err != nil {
		t.Fatal(err)
	}
	relay.Spec.Autoscaling = nil
	if err := env.Client.Update(ctx(t), relay); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.SubResource("scale").Get(ctx(t), relay, scale); err != nil {
		t.Fatal(err)
	}
	scale.Spec.Replicas = 3
	if err := env.Client.SubResource("scale").Update(ctx(t), relay, client.WithSubResourceBody(scale)); err != nil {
		t.Fatalf("scaling after autoscaling was removed: %v", err)
	}
}

// TestTrackingOnlyMovesToSnapshot: the schema has no default (the operator resolves an unset
// field from the table: a schema default would also apply to stored objects that omit it, and
// switch them), Row may change to Snapshot (the first snapshot batch publishes every event still
// unsent), Snapshot may not change back (its events are not marked sent, so a Row relay would
// publish them all again), nor to unset.
func TestTrackingOnlyMovesToSnapshot(t *testing.T) {
	env := envtestutil.Shared(t)
	ns := env.CreateNamespace(t, "tracking")
	u := relayObject(ns, "tracked")
	if err := env.Client.Create(ctx(t), u); err != nil {
		t.Fatal(err)
	}
	relay := &v1alpha1.OutboxRelay{}
	if err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(u), relay); err != nil {
		t.Fatal(err)
	}
	if relay.Spec.Publish.Tracking != "" {
		t.Fatalf("the API server defaulted tracking to %q, want it unset", relay.Spec.Publish.Tracking)
	}
	relay.Spec.Publish.Tracking = v1alpha1.TrackRow
	if err := env.Client.Update(ctx(t), relay); err != nil {
		t.Fatalf("unset to Row: %v", err)
	}
	relay.Spec.Publish.Tracking = v1alpha1.TrackSnapshot
	if err := env.Client.Update(ctx(t), relay); err != nil {
		t.Fatalf("Row to Snapshot: %v", err)
	}
	relay.Spec.Publish.Tracking = v1alpha1.TrackRow
	const msg = "publish.tracking cannot go back from Snapshot to Row"
	if err := env.Client.Update(ctx(t), relay); err == nil || !strings.Contains(err.Error(), msg) {
		t.Fatalf("Snapshot to Row: %v, want %q", err, msg)
	}
	if err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(u), relay); err != nil {
		t.Fatal(err)
	}
	relay.Spec.Publish.Tracking = ""
	if err := env.Client.Update(ctx(t), relay); err == nil || !strings.Contains(err.Error(), msg) {
		t.Fatalf("Snapshot to the default: %v, want %q", err, msg)
	}
}
