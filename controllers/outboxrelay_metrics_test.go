package controllers

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestRelayCollector reads the gauges from the manager's cache: a Ready relay exports ready 1,
// its pending/lag and its shard counts (no reshard pause: no relay ever held its buckets), a relay waiting for its Secret exports ready 0 and no numbers, and a deleted
// relay disappears.
func TestRelayCollector(t *testing.T) {
	s := sharedSuite(t)
	ns := s.env.CreateNamespace(t, "metrics")
	s.createSecret(t, ns, "db", map[string]string{"url": pgtest.NewDatabase(t)})
	s.createRelay(t, newRelay(ns, "good", "db"))
	s.createRelay(t, newRelay(ns, "waiting", "missing"))
	s.markAvailable(t, ns, "good-shard-0")
	s.waitCondition(t, ns, "good", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReady)
	s.waitCondition(t, ns, "waiting", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewRelayCollector(s.mgr.GetClient()))
	want := map[string]float64{
		`outbox_relay_ready{good}`:                1,
		`outbox_relay_pending_events{good}`:       0,
		`outbox_relay_lag_seconds{good}`:          0,
		`outbox_relay_scalable_lag_seconds{good}`: 0,
		`outbox_relay_shards{good}`:               1,
		`outbox_relay_desired_shards{good}`:       1,
		`outbox_relay_ready{waiting}`:             0,
	}
	eventually(t, 10*time.Second, func() error { // the cache follows the API server
		return compareGauges(reg, ns, want)
	})

	if err := s.c.Delete(testCtx(t), s.getRelay(t, ns, "waiting")); err != nil {
		t.Fatal(err)
	}
	delete(want, `outbox_relay_ready{waiting}`)
	eventually(t, 10*time.Second, func() error { return compareGauges(reg, ns, want) })
}

// compareGauges gathers reg and compares the gauges of namespace ns, keyed "metric{name}".
func compareGauges(reg prometheus.Gatherer, ns string, want map[string]float64) error {
	mfs, err := reg.Gather()
	if err != nil {
		return err
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			if len(labels) != 2 {
				return fmt.Errorf("%s has labels %v, want namespace and name", mf.GetName(), labels)
			}
			if mf.GetType() != dto.MetricType_GAUGE {
				return fmt.Errorf("%s is a %s", mf.GetName(), mf.GetType())
			}
			if labels["namespace"] == ns {
				got[mf.GetName()+"{"+labels["name"]+"}"] = m.GetGauge().GetValue()
			}
		}
	}
	if !maps.Equal(got, want) {
		return fmt.Errorf("gauges %v, want %v", got, want)
	}
	return nil
}
