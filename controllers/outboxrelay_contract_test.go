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

package controllers

import (
	"fmt"
	"io"
	"path"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	relaypkg "github.com/outbox-operator/outbox-operator/relay"
)

// TestRelayParsesItsDeployment: the operator and the relay agree on every flag and variable. The
// Deployment built for a spec with every field set is handed, as the kubelet would run it, to the
// relay's own parser: its container's args, its environment with each Secret reference resolved,
// its volume mounts for the files the args name. The configuration the relay ends up with must be
// the one the spec says, field by field; a flag renamed on one side, a variable the relay no
// longer reads, a mount path that drifted, fails here rather than in a cluster. With
// spec.relay.databaseSecretRef the relay connects with the URL of that Secret, and the operator's
// own Secret (the owner's URL) is not among those it can resolve.
func TestRelayParsesItsDeployment(t *testing.T) {
	tests := map[string]struct {
		relayDB *v1alpha1.DatabaseSecretRef
		db      map[string]map[string]string // the database Secrets the relay may resolve
		wantURL string
	}{
		"the operator's Secret": {
			db:      map[string]map[string]string{"shop-db": {"dsn": "postgres://owner:pw@db.shop:5432/shop"}},
			wantURL: "postgres://owner:pw@db.shop:5432/shop",
		},
		"the relays' own Secret": {
			relayDB: &v1alpha1.DatabaseSecretRef{Name: "shop-relay-db", Key: "relay-url"},
			db:      map[string]map[string]string{"shop-relay-db": {"relay-url": "postgres://outbox_relay:pw@db.shop:5432/shop"}},
			wantURL: "postgres://outbox_relay:pw@db.shop:5432/shop",
		},
		"the relays' own Secret, default key": {
			relayDB: &v1alpha1.DatabaseSecretRef{Name: "shop-relay-db"},
			db:      map[string]map[string]string{"shop-relay-db": {"url": "postgres://outbox_relay:pw@db.shop:5432/shop"}},
			wantURL: "postgres://outbox_relay:pw@db.shop:5432/shop",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { testRelayParsesItsDeployment(t, tc.relayDB, tc.db, tc.wantURL) })
	}
}

// containerConfig is the relay configuration container c starts with, as the kubelet would start
// it: its args (the run subcommand first) and its environment, each Secret reference resolved by
// secret.
func containerConfig(t *testing.T, c corev1.Container, secret func(name, key string) (string, error)) relaypkg.Config {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, err := secret(ref.Name, ref.Key)
			if err != nil {
				t.Fatalf("env %s: %v", e.Name, err)
			}
			env[e.Name] = v
		default:
			t.Fatalf("env %s: unexpected source %+v", e.Name, e.ValueFrom)
		}
	}
	if len(c.Args) == 0 || c.Args[0] != "run" {
		t.Fatalf("args %q: want the run subcommand first", c.Args)
	}
	cfg, err := relaypkg.ParseConfig(c.Args[1:], func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatalf("the relay refuses its Deployment: %v\nargs %q\nenv %v", err, c.Args, env)
	}
	return cfg
}

func testRelayParsesItsDeployment(t *testing.T, relayDB *v1alpha1.DatabaseSecretRef, dbSecrets map[string]map[string]string, wantURL string) {
	ref := func(name, key string) *v1alpha1.SecretKeyRef {
		return &v1alpha1.SecretKeyRef{Name: v1alpha1.SecretName(name), Key: v1alpha1.SecretKey(key)}
	}
	relay := testRelay(func(r *v1alpha1.OutboxRelay) {
		r.Spec.Database = v1alpha1.DatabaseSpec{SecretRef: v1alpha1.DatabaseSecretRef{Name: "shop-db", Key: "dsn"}, Table: "shop.events"}
		r.Spec.DefaultTopic = "all.events"
		r.Spec.Publish = v1alpha1.PublishSpec{BatchSize: 250, PollInterval: &metav1.Duration{Duration: 20 * time.Millisecond},
			Notify: ptr.To(true), MaxAttempts: 7, MaxPayloadBytes: ptr.To[int32](4096), Tracking: v1alpha1.TrackSnapshot,
			WaitForStandbys: ptr.To[int32](2), MaxDelay: &metav1.Duration{Duration: 30 * time.Millisecond},
			IdlePollInterval: &metav1.Duration{Duration: 2 * time.Second}, RecordTimestamp: v1alpha1.TimestampProduceTime,
			Compression: v1alpha1.CompressionZstd, NullPayload: v1alpha1.NullPayloadTombstone,
			Delivery: v1alpha1.DeliveryExactlyOnce, CursorTopic: "shop.outbox-cursors",
			CloudEvents: &v1alpha1.CloudEventsSpec{Mode: v1alpha1.CloudEventsBinary},
			Tracing:     &v1alpha1.TracingSpec{OTLPEndpoint: "http://otel-collector.observability:4317", SamplePercent: ptr.To[int32](25)},
			SchemaRegistry: &v1alpha1.SchemaRegistrySpec{URL: "https://registry.shop:8081/apis/ccompat/v7", Format: v1alpha1.SchemaAvro,
				SubjectStrategy: v1alpha1.SubjectTopicRecordName, Validation: v1alpha1.SchemaValidationEnforce,
				SchemasConfigMapRef:  &v1alpha1.ConfigMapRef{Name: "shop-schemas"},
				CredentialsSecretRef: &v1alpha1.SASLSecretRef{Name: "registry-user"}, CASecretRef: ref("registry-ca", ""),
				CertSecretRef: ref("registry-client", ""), KeySecretRef: ref("registry-client", "")}}
		r.Spec.Routing = &v1alpha1.RoutingSpec{TopicBy: v1alpha1.TopicByEventType, TopicHeader: "destination", KeyHeader: "entity"}
		r.Spec.PoisonEvents = v1alpha1.PoisonEventsSpec{Policy: v1alpha1.PoisonDeadLetter, DeadLetterTopic: "outbox.dlq"}
		r.Spec.Kafka.TLS = &v1alpha1.KafkaTLS{Enabled: true, InsecureSkipVerify: true,
			CASecretRef: ref("kafka-ca", ""), CertSecretRef: ref("kafka-client", "client.pem"), KeySecretRef: ref("kafka-client", "")}
		r.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: v1alpha1.SASLScramSHA512,
			SecretRef: v1alpha1.SASLSecretRef{Name: "kafka-user", PasswordKey: "secret"}}
		r.Spec.Relay.Env = []corev1.EnvVar{
			{Name: "OUTBOX_LOG_FORMAT", Value: "text"},
			{Name: "OUTBOX_LOCK_LEASE", Value: "10s"},
			{Name: "OUTBOX_TABLE", Value: "evil.table"}, // the spec's own field wins: not passed
		}
		r.Spec.Relay.DatabaseSecretRef = relayDB
	})
	secrets := map[string]map[string]string{
		"kafka-user":    {"username": "relay", "secret": "s3cret"},
		"registry-user": {"username": "relay-sr", "password": "sr-pw"},
	}
	for name, data := range dbSecrets {
		secrets[name] = data
	}
	d := build(t, relay, 3, "h")
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]

	got := containerConfig(t, c, func(name, key string) (string, error) {
		v, ok := secrets[name][key]
		if !ok {
			return "", fmt.Errorf("refers to Secret %s key %s, which the spec does not name", name, key)
		}
		return v, nil
	})

	want := relaypkg.DefaultConfig()
	want.DatabaseURL = wantURL
	want.Table = outboxdb.MustParseTable("shop.events")
	want.ShardCount, want.ShardIndex = 0, 3 // the relays follow the table's shard layout
	want.Kafka.Brokers = []string{"kafka-0:9092", "kafka-1:9092"}
	want.Kafka.TLS, want.Kafka.TLSInsecureSkipVerify = true, true
	want.Kafka.SASLMechanism, want.Kafka.SASLUsername, want.Kafka.SASLPassword = relaypkg.SASLScramSHA512, "relay", "s3cret"
	want.TopicMap = map[string]string{"order": "orders.events", "user": "users.events"}
	want.DefaultTopic = "all.events"
	want.BatchSize, want.PollInterval, want.Notify, want.MaxAttempts = 250, 20*time.Millisecond, true, 7
	want.PoisonPolicy, want.DeadLetterTopic = relaypkg.PoisonDeadLetter, "outbox.dlq"
	want.MaxPayloadBytes = 4096
	want.Tracking = relaypkg.TrackSnapshot
	want.WaitForStandbys = 2
	want.MaxDelay = 30 * time.Millisecond
	want.IdlePollInterval = 2 * time.Second
	want.RecordTimestamp = contract.TimestampProduce
	want.Compression = contract.CompressionZstd
	want.NullPayload = contract.NullPayloadTombstone
	want.Delivery, want.CursorTopic = contract.DeliveryExactlyOnce, "shop.outbox-cursors"
	want.OTLPEndpoint, want.TraceSampleRatio = "http://otel-collector.observability:4317", 0.25
	want.CloudEvents, want.CloudEventsSource = contract.CloudEventsBinary, "/outbox-operator/"+relay.Namespace+"/"+relay.Name
	want.Schemas = relaypkg.SchemaSettings{URL: "https://registry.shop:8081/apis/ccompat/v7", Format: contract.SchemaAvro,
		Strategy: contract.SubjectTopicRecord, Validate: true, Username: "relay-sr", Password: "sr-pw",
		CAFile: got.Schemas.CAFile, CertFile: got.Schemas.CertFile, KeyFile: got.Schemas.KeyFile, Dir: got.Schemas.Dir}
	for key, p := range map[string]string{"ca.crt": got.Schemas.CAFile, "tls.crt": got.Schemas.CertFile, "tls.key": got.Schemas.KeyFile} {
		if !mountedSecretKey(pod, c, p, key) {
			t.Errorf("the relay reads the registry's %s from %q, which no volume mount provides", key, p)
		}
	}
	if !mountedConfigMap(pod, c, got.Schemas.Dir, "shop-schemas") {
		t.Errorf("the relay reads its schemas from %q, where ConfigMap shop-schemas is not mounted", got.Schemas.Dir)
	}
	want.TopicBy, want.TopicHeader, want.KeyHeader = contract.TopicByEventType, "destination", "entity"
	want.LogFormat, want.LockLease = "text", 10*time.Second
	// The TLS files: wherever the args put them, a volume mount must bring the Secret's key there.
	files := map[string]*string{"ca.crt": &want.Kafka.TLSCAFile, "client.pem": &want.Kafka.TLSCertFile, "tls.key": &want.Kafka.TLSKeyFile}
	for key, p := range map[string]string{"ca.crt": got.Kafka.TLSCAFile, "client.pem": got.Kafka.TLSCertFile, "tls.key": got.Kafka.TLSKeyFile} {
		if !mountedSecretKey(pod, c, p, key) {
			t.Errorf("the relay reads %q for Secret key %s, which no volume mount provides", p, key)
		}
		*files[key] = p
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the relay parsed\n  %+v\nthe spec says\n  %+v", redactCfg(got), redactCfg(want))
	}
	if got.HTTPAddr != ":8080" || len(c.Ports) != 1 || ":"+strconv.Itoa(int(c.Ports[0].ContainerPort)) != got.HTTPAddr {
		t.Errorf("the relay listens on %q, the container exposes %+v", got.HTTPAddr, c.Ports)
	}
}

// mountedConfigMap reports whether ConfigMap name is mounted at dir into container c of pod.
func mountedConfigMap(pod corev1.PodSpec, c corev1.Container, dir, name string) bool {
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == name {
				return true
			}
		}
	}
	return false
}

// mountedSecretKey reports whether file is a Secret key mounted into container c of pod.
func mountedSecretKey(pod corev1.PodSpec, c corev1.Container, file, key string) bool {
	dir, name := path.Split(file)
	for _, m := range c.VolumeMounts {
		if strings.TrimSuffix(dir, "/") != m.MountPath {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.Projected == nil {
				continue
			}
			for _, src := range v.Projected.Sources {
				if src.Secret == nil {
					continue
				}
				for _, it := range src.Secret.Items {
					if it.Key == key && it.Path == name {
						return true
					}
				}
			}
		}
	}
	return false
}

// redactCfg hides the secrets of a relay configuration in a failure message.
func redactCfg(c relaypkg.Config) relaypkg.Config {
	c.DatabaseURL = "[url]"
	c.Kafka.SASLPassword = "[password]"
	return c
}
