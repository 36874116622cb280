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
	"context"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestPlanTopics(t *testing.T) {
	ok := topicState{exists: true, partitions: 6, replicas: 3, minInsync: 2}
	tests := map[string]struct {
		policy       v1alpha1.TopicPolicy
		states       map[string]topicState
		brokers      int
		wantCreate   []string
		wantProblems []string
	}{
		"all sound": {policy: v1alpha1.TopicsVerify, states: map[string]topicState{"a": ok, "b": ok}, brokers: 3},
		"missing, verify": {policy: v1alpha1.TopicsVerify, states: map[string]topicState{"a": ok}, brokers: 3,
			wantProblems: []string{"topic b does not exist"}},
		"missing, create": {policy: v1alpha1.TopicsCreate, states: map[string]topicState{"a": ok}, brokers: 3, wantCreate: []string{"b"}},
		"one replica on three brokers": {policy: v1alpha1.TopicsCreate, brokers: 3,
			states:       map[string]topicState{"a": ok, "b": {exists: true, partitions: 1, replicas: 1, minInsync: 1}},
			wantProblems: []string{"topic b has 1 replica on a cluster of 3 brokers: losing its broker loses its events"}},
		"one replica on one broker": {policy: v1alpha1.TopicsVerify, brokers: 1,
			states: map[string]topicState{"a": {exists: true, partitions: 1, replicas: 1, minInsync: 1}, "b": {exists: true, replicas: 1}}},
		"min.insync.replicas 1": {policy: v1alpha1.TopicsVerify, brokers: 3,
			states:       map[string]topicState{"a": {exists: true, partitions: 3, replicas: 3, minInsync: 1}, "b": ok},
			wantProblems: []string{"topic a has 3 replicas and min.insync.replicas 1: acks=all is then satisfied by one copy"}},
		"min.insync.replicas unknown": {policy: v1alpha1.TopicsVerify, brokers: 3,
			states: map[string]topicState{"a": {exists: true, partitions: 3, replicas: 3}, "b": ok}},
		"cursor topic compacted": {policy: v1alpha1.TopicsVerify, brokers: 3,
			states: map[string]topicState{"a": ok, "b": {exists: true, partitions: 3, replicas: 3, minInsync: 2, cleanup: "compact"}}},
		"cursor topic compacted and deleted": {policy: v1alpha1.TopicsVerify, brokers: 3,
			states: map[string]topicState{"a": ok, "b": {exists: true, partitions: 3, replicas: 3, minInsync: 2, cleanup: "compact,delete"}}},
		"cursor topic not compacted": {policy: v1alpha1.TopicsCreate, brokers: 3,
			states:       map[string]topicState{"a": {exists: true, partitions: 3, replicas: 3, minInsync: 2, cleanup: "delete"}, "b": {exists: true, partitions: 3, replicas: 3, minInsync: 2, cleanup: "delete"}},
			wantProblems: []string{"topic b, the cursor topic of exactly-once delivery, has cleanup.policy delete: it keeps every cursor record of its retention, one per batch, and each relay reads it to the end as it starts; set cleanup.policy=compact"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			p := planTopics(tt.policy, []string{"a", "b"}, tt.states, tt.brokers, "b")
			if !reflect.DeepEqual(p.create, tt.wantCreate) || !reflect.DeepEqual(p.problems, tt.wantProblems) {
				t.Errorf("create %q problems %q, want %q %q", p.create, p.problems, tt.wantCreate, tt.wantProblems)
			}
		})
	}
}

func TestKnownTopics(t *testing.T) {
	spec := &v1alpha1.OutboxRelaySpec{Topics: map[string]v1alpha1.TopicName{"order": "orders", "invoice": "billing", "user": "orders"},
		DefaultTopic: "other", PoisonEvents: v1alpha1.PoisonEventsSpec{Policy: v1alpha1.PoisonDeadLetter, DeadLetterTopic: "dlq"}}
	if got, want := knownTopics(spec), []string{"billing", "dlq", "orders", "other"}; !reflect.DeepEqual(got, want) {
		t.Errorf("known topics %q, want %q", got, want)
	}
	spec.Publish.CursorTopic = "cursors" // only exactly-once delivery's
	if got, want := knownTopics(spec), []string{"billing", "dlq", "orders", "other"}; !reflect.DeepEqual(got, want) {
		t.Errorf("known topics %q at least once, want %q", got, want)
	}
	spec.Publish.Delivery = v1alpha1.DeliveryExactlyOnce
	if got, want := knownTopics(spec), []string{"billing", "cursors", "dlq", "orders", "other"}; !reflect.DeepEqual(got, want) {
		t.Errorf("known topics %q exactly once, want %q", got, want)
	}
}

// TestTopicsCreatedAndVerified, against a real broker, read back by an independent admin client
// (franz-go's): under Create the operator creates a missing topic with the spec's partitions and
// configs, says so in an Event and in TopicsReady; under Verify it reports a missing topic and
// creates nothing, and checks again when the spec changes; brokers that do not answer make
// TopicsReady Unknown without stopping the pass.
func TestTopicsCreatedAndVerified(t *testing.T) {
	s := sharedSuite(t)
	k := kafkatest.Start(t, kafkatest.Apache)
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	ctx := testCtx(t)
	brokers := make([]v1alpha1.Broker, len(k.Brokers))
	for i, b := range k.Brokers {
		brokers[i] = v1alpha1.Broker(b)
	}
	ns := s.env.CreateNamespace(t, "topics")
	s.createSecret(t, ns, "shop-db", map[string]string{"url": pgtest.NewDatabase(t)})

	created, cursors := kafkatest.UniqueTopic("op.created"), kafkatest.UniqueTopic("op.cursors")
	s.createRelay(t, newRelay(ns, "creates", "shop-db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Kafka.Brokers = brokers
		r.Spec.Topics = map[string]v1alpha1.TopicName{"order": v1alpha1.TopicName(created)}
		// Exactly-once delivery's cursor topic is created compacted.
		r.Spec.Publish.Delivery, r.Spec.Publish.Tracking = v1alpha1.DeliveryExactlyOnce, v1alpha1.TrackSnapshot
		r.Spec.Publish.CursorTopic = v1alpha1.TopicName(cursors)
		r.Spec.Kafka.Topics = &v1alpha1.KafkaTopicsSpec{Policy: v1alpha1.TopicsCreate, Partitions: ptr.To[int32](3),
			Configs: map[string]string{"retention.ms": "3600000"}}
	}))
	relay := s.waitCondition(t, ns, "creates", v1alpha1.ConditionTopicsReady, metav1.ConditionTrue, v1alpha1.ReasonTopicsReady)
	t.Logf("TopicsReady: %s", conditionMessage(relay, v1alpha1.ConditionTopicsReady))
	details, err := adm.ListTopics(ctx, created)
	if err != nil || details[created].Err != nil {
		t.Fatalf("the created topic, as the broker describes it: %v %+v", err, details[created])
	}
	if n := len(details[created].Partitions); n != 3 {
		t.Errorf("created with %d partitions, want 3", n)
	}
	cfgs, err := adm.DescribeTopicConfigs(ctx, created)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cfgs.On(created, nil)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range rc.Configs {
		if c.Key == "retention.ms" {
			found = c.MaybeValue() == "3600000"
		}
	}
	if !found {
		t.Errorf("retention.ms of the created topic is not 3600000: %+v", rc.Configs)
	}
	cc, err := adm.DescribeTopicConfigs(ctx, cursors)
	if err != nil {
		t.Fatal(err)
	}
	rc, err = cc.On(cursors, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"cleanup.policy": "compact", "segment.bytes": strconv.Itoa(CursorTopicSegmentBytes), "segment.ms": strconv.Itoa(CursorTopicSegmentMs)}
	for _, c := range rc.Configs {
		if w, ok := want[c.Key]; ok && c.MaybeValue() != w {
			t.Errorf("the cursor topic's %s is %q, want %s", c.Key, c.MaybeValue(), w)
		}
	}
	s.waitEvents(t, ns, "creates", "Normal "+v1alpha1.ReasonTopicCreated+" created topics "+created+", "+cursors+" (partitions 3, replication factor the broker's default, retention.ms=3600000)")

	// Verify: the missing topic is reported and stays missing.
	missing := kafkatest.UniqueTopic("op.missing")
	s.createRelay(t, newRelay(ns, "verifies", "shop-db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Database.Table = "public.other_outbox"
		r.Spec.Kafka.Brokers = brokers
		r.Spec.Topics = map[string]v1alpha1.TopicName{"order": v1alpha1.TopicName(missing)}
		r.Spec.Kafka.Topics = &v1alpha1.KafkaTopicsSpec{Policy: v1alpha1.TopicsVerify}
	}))
	relay = s.waitCondition(t, ns, "verifies", v1alpha1.ConditionTopicsReady, metav1.ConditionFalse, v1alpha1.ReasonTopicsNotReady)
	if msg := conditionMessage(relay, v1alpha1.ConditionTopicsReady); msg != "topic "+missing+" does not exist" {
		t.Errorf("TopicsReady message %q", msg)
	}
	if details, err := adm.ListTopics(ctx, missing); err != nil || details.Has(missing) {
		t.Errorf("Verify created %s (or the broker could not say): %v", missing, err)
	}
	// A change of the spec checks again: routed to the topic created above, it is ready.
	relay = s.getRelay(t, ns, "verifies")
	relay.Spec.Topics = map[string]v1alpha1.TopicName{"order": v1alpha1.TopicName(created)}
	if err := s.c.Update(ctx, relay); err != nil {
		t.Fatal(err)
	}
	s.waitCondition(t, ns, "verifies", v1alpha1.ConditionTopicsReady, metav1.ConditionTrue, v1alpha1.ReasonTopicsReady)

	// Brokers that do not answer: Unknown, and the pass goes on (the migrations are applied).
	s.createRelay(t, newRelay(ns, "unreachable", "shop-db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Database.Table = "public.third_outbox"
		r.Spec.Kafka.Brokers = []v1alpha1.Broker{"127.0.0.1:1"}
		r.Spec.Kafka.Topics = &v1alpha1.KafkaTopicsSpec{Policy: v1alpha1.TopicsVerify}
	}))
	relay = s.waitCondition(t, ns, "unreachable", v1alpha1.ConditionTopicsReady, metav1.ConditionUnknown, v1alpha1.ReasonTopicsUnknown)
	if msg := conditionMessage(relay, v1alpha1.ConditionTopicsReady); !strings.HasPrefix(msg, "the brokers refused or did not answer: ") {
		t.Errorf("TopicsReady message %q", msg)
	}
	s.waitCondition(t, ns, "unreachable", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)

	// Ignore (policy removed): the condition goes.
	relay = s.getRelay(t, ns, "unreachable")
	relay.Spec.Kafka.Topics = nil
	if err := s.c.Update(ctx, relay); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, func() error {
		if c := conditionMessage(s.getRelay(t, ns, "unreachable"), v1alpha1.ConditionTopicsReady); c != "" {
			return context.DeadlineExceeded
		}
		return nil
	})
}

// TestTopicsOverTLSAndSCRAM: the operator's own Kafka client takes the relays' TLS and SASL
// settings from the same Secrets: against a broker with SCRAM-SHA-512 over TLS and ACLs, it
// describes the topic (TopicsReady True); with a wrong password in the Secret the brokers refuse
// it, and TopicsReady says so (Unknown) without the password in any message.
func TestTopicsOverTLSAndSCRAM(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	k := kafkatest.StartSecure(t, kafkatest.SecureOptions{})
	topic := kafkatest.UniqueTopic("op.secure")
	k.CreateTopic(t, topic, 1)
	k.AllowProduce(t, "User:operator", topic)
	k.SetSCRAM(t, "operator", "right-horse")
	ca, err := os.ReadFile(k.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	ns := s.env.CreateNamespace(t, "topics-secure")
	s.createSecret(t, ns, "shop-db", map[string]string{"url": pgtest.NewDatabase(t)})
	s.createSecret(t, ns, "kafka-ca", map[string]string{"ca.crt": string(ca)})
	s.createSecret(t, ns, "kafka-user", map[string]string{"username": "operator", "password": "right-horse"})
	s.createRelay(t, newRelay(ns, "secure", "shop-db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Kafka.Brokers = []v1alpha1.Broker{v1alpha1.Broker(k.SASLSSL)}
		r.Spec.Kafka.TLS = &v1alpha1.KafkaTLS{Enabled: true, CASecretRef: &v1alpha1.SecretKeyRef{Name: "kafka-ca"}}
		r.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: v1alpha1.SASLScramSHA512, SecretRef: v1alpha1.SASLSecretRef{Name: "kafka-user"}}
		r.Spec.Topics = map[string]v1alpha1.TopicName{"order": v1alpha1.TopicName(topic)}
		r.Spec.Kafka.Topics = &v1alpha1.KafkaTopicsSpec{Policy: v1alpha1.TopicsVerify}
	}))
	s.waitCondition(t, ns, "secure", v1alpha1.ConditionTopicsReady, metav1.ConditionTrue, v1alpha1.ReasonTopicsReady)

	// A wrong password, and a spec change so that the topics are checked again at once.
	sec := &corev1.Secret{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kafka-user"}, sec); err != nil {
		t.Fatal(err)
	}
	sec.Data["password"] = []byte("wrong-horse")
	if err := s.c.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	relay := s.getRelay(t, ns, "secure")
	relay.Spec.LagTarget = 61
	if err := s.c.Update(ctx, relay); err != nil {
		t.Fatal(err)
	}
	relay = s.waitCondition(t, ns, "secure", v1alpha1.ConditionTopicsReady, metav1.ConditionUnknown, v1alpha1.ReasonTopicsUnknown)
	if msg := conditionMessage(relay, v1alpha1.ConditionTopicsReady); strings.Contains(msg, "horse") {
		t.Errorf("TopicsReady quotes the password: %q", msg)
	} else {
		t.Logf("refused: %s", msg)
	}
}
