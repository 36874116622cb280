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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
)

var (
	readyDesc = prometheus.NewDesc("outbox_relay_ready",
		"1 when the OutboxRelay's Ready condition is True, else 0.", []string{"namespace", "name"}, nil)
	pendingDesc = prometheus.NewDesc("outbox_relay_pending_events",
		"Unsent events of the OutboxRelay's table, as last written to status (coarse; the relays export live numbers).",
		[]string{"namespace", "name"}, nil)
	lagDesc = prometheus.NewDesc("outbox_relay_lag_seconds",
		"Age of the oldest unsent event, as last written to status (coarse; the relays export live numbers).",
		[]string{"namespace", "name"}, nil)
	scalableLagDesc = prometheus.NewDesc("outbox_relay_scalable_lag_seconds",
		"The lag more shards can fix (status.scalableLagSeconds: the oldest unsent event not held back behind a failed one), as last written to status: what the built-in autoscaler scales on, for external autoscalers.",
		[]string{"namespace", "name"}, nil)
	shardsDesc = prometheus.NewDesc("outbox_relay_shards",
		"Shard count of the layout the OutboxRelay's relays run, as recorded in the database.", []string{"namespace", "name"}, nil)
	desiredShardsDesc = prometheus.NewDesc("outbox_relay_desired_shards",
		"Shard count the operator moves the layout to: spec.shards or the built-in autoscaler's choice.", []string{"namespace", "name"}, nil)
	reshardPauseDesc = prometheus.NewDesc("outbox_relay_last_reshard_pause_seconds",
		"How long publishing stopped during the last change of shard layout.", []string{"namespace", "name"}, nil)
)

// RelayCollector exports per-OutboxRelay gauges read from the informer cache at scrape time, so
// a deleted relay disappears from the output. Register it on
// sigs.k8s.io/controller-runtime/pkg/metrics.Registry.
type RelayCollector struct {
	Reader client.Reader // the manager's cached client
}

// NewRelayCollector returns a collector reading OutboxRelays through reader.
func NewRelayCollector(reader client.Reader) *RelayCollector { return &RelayCollector{Reader: reader} }

// Describe implements prometheus.Collector.
func (c *RelayCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- readyDesc
	ch <- pendingDesc
	ch <- lagDesc
	ch <- scalableLagDesc
	ch <- shardsDesc
	ch <- desiredShardsDesc
	ch <- reshardPauseDesc
}

// Collect implements prometheus.Collector.
func (c *RelayCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var list v1alpha1.OutboxRelayList
	if err := c.Reader.List(ctx, &list); err != nil {
		ch <- prometheus.NewInvalidMetric(readyDesc, err)
		return
	}
	for i := range list.Items {
		relay := &list.Items[i]
		labels := []string{relay.Namespace, relay.Name}
		ready := 0.0
		if meta.IsStatusConditionPresentAndEqual(relay.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionTrue) {
			ready = 1
		}
		ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, ready, labels...)
		if p := relay.Status.PendingEvents; p != nil {
			ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(*p), labels...)
		}
		if l := relay.Status.LagSeconds; l != nil {
			ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(*l), labels...)
		}
		if l := relay.Status.ScalableLagSeconds; l != nil {
			ch <- prometheus.MustNewConstMetric(scalableLagDesc, prometheus.GaugeValue, float64(*l), labels...)
		}
		if n := relay.Status.Shards; n > 0 {
			ch <- prometheus.MustNewConstMetric(shardsDesc, prometheus.GaugeValue, float64(n), labels...)
		}
		if n := relay.Status.DesiredShards; n > 0 {
			ch <- prometheus.MustNewConstMetric(desiredShardsDesc, prometheus.GaugeValue, float64(n), labels...)
		}
		if lr := relay.Status.LastReshard; lr != nil && lr.PauseMilliseconds != nil {
			ch <- prometheus.MustNewConstMetric(reshardPauseDesc, prometheus.GaugeValue, float64(*lr.PauseMilliseconds)/1000, labels...)
		}
	}
}
