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
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/kafkaauth"
)

// kafkaAdmin is the operator's own Kafka client, with the relays' brokers, TLS and SASL (from
// the same Secrets): it describes and creates topics (spec.kafka.topics).
type kafkaAdmin struct {
	client    *kafka.Client
	transport *kafka.Transport
}

// kafkaAdmin builds the client from the spec and the Secrets it names. The error never holds a
// secret's value.
func (r *OutboxRelayReconciler) kafkaAdmin(ctx context.Context, s *scope) (*kafkaAdmin, error) {
	spec := s.relay.Spec.Kafka
	tr := &kafka.Transport{DialTimeout: 5 * time.Second, ClientID: "outbox-operator"}
	if t := spec.TLS; t != nil && t.Enabled {
		values := map[string][]byte{}
		for _, f := range tlsFiles(t) {
			v, err := r.readSecretKey(ctx, s, string(f.ref.Name), string(f.ref.Key))
			if err != nil {
				return nil, err
			}
			values[f.path] = v
		}
		cfg, err := kafkaauth.TLS(values["ca.crt"], values["tls.crt"], values["tls.key"], t.InsecureSkipVerify)
		if err != nil {
			return nil, fmt.Errorf("TLS: %w", err)
		}
		tr.TLS = cfg
	}
	if sa := spec.SASL; sa != nil {
		uk, pk := sa.SecretRef.Keys()
		user, err := r.readSecretKey(ctx, s, string(sa.SecretRef.Name), uk)
		if err != nil {
			return nil, err
		}
		pass, err := r.readSecretKey(ctx, s, string(sa.SecretRef.Name), pk)
		if err != nil {
			return nil, err
		}
		if tr.SASL, err = kafkaauth.SASL(string(sa.Mechanism), string(user), string(pass)); err != nil {
			return nil, err
		}
	}
	brokers := make([]string, len(spec.Brokers))
	for i, b := range spec.Brokers {
		brokers[i] = string(b)
	}
	return &kafkaAdmin{client: &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr, Timeout: 10 * time.Second}, transport: tr}, nil
}

func (k *kafkaAdmin) close() { k.transport.CloseIdleConnections() }

// describe returns what the brokers say of topics (without creating any: the metadata request
// does not allow auto-creation) and how many brokers the cluster has.
func (k *kafkaAdmin) describe(ctx context.Context, topics []string) (map[string]topicState, int, error) {
	md, err := k.client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return nil, 0, err
	}
	states := map[string]topicState{}
	var existing []string
	for _, t := range md.Topics {
		if t.Error != nil {
			if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
				continue
			}
			return nil, 0, fmt.Errorf("topic %s: %w", t.Name, t.Error)
		}
		st := topicState{exists: true, partitions: len(t.Partitions)}
		for i, p := range t.Partitions {
			if i == 0 || len(p.Replicas) < st.replicas {
				st.replicas = len(p.Replicas)
			}
		}
		states[t.Name] = st
		existing = append(existing, t.Name)
	}
	if len(existing) > 0 {
		req := &kafka.DescribeConfigsRequest{}
		for _, t := range existing {
			req.Resources = append(req.Resources, kafka.DescribeConfigRequestResource{
				ResourceType: kafka.ResourceTypeTopic, ResourceName: t, ConfigNames: []string{"min.insync.replicas", "cleanup.policy"}})
		}
		cr, err := k.client.DescribeConfigs(ctx, req)
		if err != nil {
			return nil, 0, err
		}
		for _, res := range cr.Resources {
			if res.Error != nil {
				continue // unknown, as a principal without DescribeConfigs sees it
			}
			for _, e := range res.ConfigEntries {
				st := states[res.ResourceName]
				switch e.ConfigName {
				case "min.insync.replicas":
					st.minInsync, _ = strconv.Atoi(e.ConfigValue)
				case "cleanup.policy":
					st.cleanup = e.ConfigValue
				}
				states[res.ResourceName] = st
			}
		}
	}
	return states, len(md.Brokers), nil
}

// create creates topic with the spec's partitions, replication factor and configs (the broker's
// defaults where unset). A topic created meanwhile by someone else is no error.
func (k *kafkaAdmin) create(ctx context.Context, topic string, ts *v1alpha1.KafkaTopicsSpec) error {
	tc := kafka.TopicConfig{Topic: topic, NumPartitions: -1, ReplicationFactor: -1}
	if ts.Partitions != nil {
		tc.NumPartitions = int(*ts.Partitions)
	}
	if ts.ReplicationFactor != nil {
		tc.ReplicationFactor = int(*ts.ReplicationFactor)
	}
	for _, name := range slices.Sorted(maps.Keys(ts.Configs)) {
		tc.ConfigEntries = append(tc.ConfigEntries, kafka.ConfigEntry{ConfigName: name, ConfigValue: ts.Configs[name]})
	}
	res, err := k.client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{tc}})
	if err != nil {
		return err
	}
	if err := res.Errors[topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return err
	}
	return nil
}
