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
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
)

// TopicsCheckInterval is how often the topics of an OutboxRelay under spec.kafka.topics Verify
// or Create are checked again when its spec did not change.
const TopicsCheckInterval = 5 * time.Minute

// knownTopics returns the topics the spec routes to by name (spec.topics, spec.defaultTopic, the
// dead-letter topic), sorted, each once. Topics named by a header are not known ahead.
func knownTopics(spec *v1alpha1.OutboxRelaySpec) []string {
	var out []string
	for _, t := range spec.Topics {
		out = append(out, string(t))
	}
	for _, t := range []v1alpha1.TopicName{spec.DefaultTopic, spec.PoisonEvents.DeadLetterTopic, cursorTopic(spec)} {
		if t != "" {
			out = append(out, string(t))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// cursorTopic is exactly-once delivery's cursor topic, "" under at-least-once.
func cursorTopic(spec *v1alpha1.OutboxRelaySpec) v1alpha1.TopicName {
	if spec.Publish.Delivery != v1alpha1.DeliveryExactlyOnce {
		return ""
	}
	return spec.Publish.CursorTopic
}

// topicState is what the brokers said of one topic.
type topicState struct {
	exists     bool
	partitions int
	replicas   int    // the fewest replicas of any of its partitions
	minInsync  int    // min.insync.replicas; 0 where unknown
	cleanup    string // cleanup.policy; "" where unknown
}

// topicPlan is what to do about the known topics: those to create, and what is wrong with the
// others, one sentence each.
type topicPlan struct {
	create   []string
	problems []string
}

// planTopics decides, from what the brokers said (states, brokers in the cluster), which topics
// to create (policy Create) and what is wrong: a topic missing (policy Verify), one replica on a
// cluster of several brokers, min.insync.replicas below 2 on a replicated topic, exactly-once's
// cursor topic (cursors, "" for none) not compacted.
func planTopics(policy v1alpha1.TopicPolicy, topics []string, states map[string]topicState, brokers int, cursors string) topicPlan {
	var p topicPlan
	for _, t := range topics {
		st := states[t]
		switch {
		case st.exists && t == cursors && st.cleanup != "" && !strings.Contains(st.cleanup, "compact"):
			p.problems = append(p.problems, fmt.Sprintf("topic %s, the cursor topic of exactly-once delivery, has cleanup.policy %s: "+
				"it keeps every cursor record of its retention, one per batch, and each relay reads it to the end as it starts; set cleanup.policy=compact", t, st.cleanup))
		case !st.exists && policy == v1alpha1.TopicsCreate:
			p.create = append(p.create, t)
		case !st.exists:
			p.problems = append(p.problems, fmt.Sprintf("topic %s does not exist", t))
		case st.replicas == 1 && brokers > 1:
			p.problems = append(p.problems, fmt.Sprintf("topic %s has 1 replica on a cluster of %d brokers: losing its broker loses its events", t, brokers))
		case st.replicas > 1 && st.minInsync > 0 && st.minInsync < 2:
			p.problems = append(p.problems, fmt.Sprintf("topic %s has %d replicas and min.insync.replicas %d: acks=all is then satisfied by one copy", t, st.replicas, st.minInsync))
		}
	}
	return p
}

// ensureTopics checks, and under Create creates, the topics the relays publish to
// (spec.kafka.topics), and sets TopicsReady. It runs after a change of the spec and every
// TopicsCheckInterval, and never fails the pass: a broker that does not answer makes TopicsReady
// Unknown, retried at the next check.
func (r *OutboxRelayReconciler) ensureTopics(ctx context.Context, s *scope) (Result, error) {
	relay := s.relay
	ts := relay.Spec.Kafka.Topics
	if ts == nil || ts.Policy == v1alpha1.TopicsIgnore {
		meta.RemoveStatusCondition(&relay.Status.Conditions, v1alpha1.ConditionTopicsReady)
		return Result{}, nil
	}
	st := r.stateOf(relay)
	now := r.Clock.Now()
	wait, due := st.topicsDue(now, relay.Generation)
	if !due && meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionTopicsReady) != nil {
		return Result{RequeueAfter: wait}, nil
	}
	status, reason, msg := r.checkTopics(ctx, s, ts)
	setCondition(relay, v1alpha1.ConditionTopicsReady, status, reason, msg)
	st.topicsDone(now, relay.Generation, TopicsCheckInterval)
	return Result{RequeueAfter: TopicsCheckInterval}, nil
}

// checkTopics describes the known topics, creates those planTopics says to, and returns
// TopicsReady's status, reason and message.
func (r *OutboxRelayReconciler) checkTopics(ctx context.Context, s *scope, ts *v1alpha1.KafkaTopicsSpec) (metav1.ConditionStatus, string, string) {
	topics := knownTopics(&s.relay.Spec)
	ka, err := r.kafkaAdmin(ctx, s)
	if err != nil {
		return metav1.ConditionUnknown, v1alpha1.ReasonTopicsUnknown, "Kafka settings: " + err.Error()
	}
	defer ka.close()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	states, brokers, err := ka.describe(ctx, topics)
	if err != nil {
		return metav1.ConditionUnknown, v1alpha1.ReasonTopicsUnknown, "the brokers refused or did not answer: " + err.Error()
	}
	plan := planTopics(ts.Policy, topics, states, brokers, string(cursorTopic(&s.relay.Spec)))
	var created []string
	for _, t := range plan.create {
		spec := ts
		if t == string(cursorTopic(&s.relay.Spec)) {
			spec = compacted(ts) // one record per shard and layout: the last one counts
		}
		if err := ka.create(ctx, t, spec); err != nil {
			plan.problems = append(plan.problems, fmt.Sprintf("topic %s does not exist and could not be created: %v", t, err))
			continue
		}
		created = append(created, t)
	}
	if len(created) > 0 {
		// One event for the pass: events of one reason are folded into a series that keeps the
		// first note only.
		r.Recorder.Eventf(s.relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonTopicCreated, "CreateTopic", "created topics %s (%s)",
			strings.Join(created, ", "), describeCreate(ts))
		// What the broker made of them (its defaults, where the spec leaves them out).
		again, _, err := ka.describe(ctx, created)
		if err == nil {
			for t, st := range again {
				states[t] = st
			}
			plan.problems = append(plan.problems, planTopics(v1alpha1.TopicsVerify, created, states, brokers, string(cursorTopic(&s.relay.Spec))).problems...)
		}
	}
	if len(plan.problems) > 0 {
		return metav1.ConditionFalse, v1alpha1.ReasonTopicsNotReady, strings.Join(plan.problems, "; ")
	}
	msg := "checked " + strings.Join(topics, ", ")
	if len(created) > 0 {
		msg += "; created " + strings.Join(created, ", ")
	}
	return metav1.ConditionTrue, v1alpha1.ReasonTopicsReady, msg
}

// describeCreate says with which settings a topic is created, for its event.
func describeCreate(ts *v1alpha1.KafkaTopicsSpec) string {
	part, repl := "the broker's default", "the broker's default"
	if ts.Partitions != nil {
		part = strconv.Itoa(int(*ts.Partitions))
	}
	if ts.ReplicationFactor != nil {
		repl = strconv.Itoa(int(*ts.ReplicationFactor))
	}
	out := "partitions " + part + ", replication factor " + repl
	if len(ts.Configs) > 0 {
		keys := make([]string, 0, len(ts.Configs))
		for k := range ts.Configs {
			keys = append(keys, k+"="+ts.Configs[k])
		}
		slices.Sort(keys)
		out += ", " + strings.Join(keys, ", ")
	}
	return out
}

// compacted returns ts with the settings of the cursor topic: compacted (the last record of each
// shard counts), in small segments, so that the relay that starts a tenure, which reads the
// topic to its end, reads little more than a record per shard: compaction only cleans a closed
// segment, and one transaction per batch writes a record per batch.
func compacted(ts *v1alpha1.KafkaTopicsSpec) *v1alpha1.KafkaTopicsSpec {
	out := ts.DeepCopy()
	if out.Configs == nil {
		out.Configs = map[string]string{}
	}
	out.Configs["cleanup.policy"] = "compact"
	out.Configs["segment.bytes"] = strconv.Itoa(CursorTopicSegmentBytes)
	out.Configs["segment.ms"] = strconv.Itoa(CursorTopicSegmentMs)
	return out
}

// The cursor topic's segments: 16 MiB, or 10 minutes.
const (
	CursorTopicSegmentBytes = 16 << 20
	CursorTopicSegmentMs    = 10 * 60 * 1000
)
