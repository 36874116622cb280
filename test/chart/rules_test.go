package chart

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// promtoolBin is the path of promtool, built by hack/promtool.sh (make setup).
func promtoolBin(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("bash", "../../hack/promtool.sh").Output()
	if err != nil {
		t.Fatalf("hack/promtool.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// rulesTest is a promtool unit test of the chart's alerts (promtool test rules): synthetic series
// as the relays and the operator export them, through the scrape (PodMonitor: namespace and pod
// added; ServiceMonitor: the operator's own labels kept), and the alerts each must raise, or not.
const rulesTest = `rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # Shard 0 of shop/orders: 2,000 pending, the oldest 300 s old, failing 1 publish a second,
      # its loop's iterations about 2 s. Shard 1: 10 pending, 5 s, no errors, 10 ms iterations.
      - series: 'outbox_pending{namespace="shop", pod="orders-shard-0-abc", table="public.outbox", shard="0"}'
        values: '2000x30'
      - series: 'outbox_pending{namespace="shop", pod="orders-shard-1-def", table="public.outbox", shard="1"}'
        values: '10x30'
      - series: 'outbox_lag_seconds{namespace="shop", pod="orders-shard-0-abc", table="public.outbox", shard="0"}'
        values: '300x30'
      - series: 'outbox_lag_seconds{namespace="shop", pod="orders-shard-1-def", table="public.outbox", shard="1"}'
        values: '5x30'
      - series: 'outbox_publish_errors_total{namespace="shop", pod="orders-shard-0-abc", table="public.outbox", shard="0"}'
        values: '0+60x30'
      - series: 'outbox_publish_errors_total{namespace="shop", pod="orders-shard-1-def", table="public.outbox", shard="1"}'
        values: '0x30'
      - series: 'outbox_worker_tick_duration_seconds_bucket{namespace="shop", pod="orders-shard-0-abc", table="public.outbox", shard="0", le="1"}'
        values: '0x30'
      - series: 'outbox_worker_tick_duration_seconds_bucket{namespace="shop", pod="orders-shard-0-abc", table="public.outbox", shard="0", le="5"}'
        values: '0+60x30'
      - series: 'outbox_worker_tick_duration_seconds_bucket{namespace="shop", pod="orders-shard-0-abc", table="public.outbox", shard="0", le="+Inf"}'
        values: '0+60x30'
      - series: 'outbox_worker_tick_duration_seconds_bucket{namespace="shop", pod="orders-shard-1-def", table="public.outbox", shard="1", le="0.05"}'
        values: '0+60x30'
      - series: 'outbox_worker_tick_duration_seconds_bucket{namespace="shop", pod="orders-shard-1-def", table="public.outbox", shard="1", le="1"}'
        values: '0+60x30'
      - series: 'outbox_worker_tick_duration_seconds_bucket{namespace="shop", pod="orders-shard-1-def", table="public.outbox", shard="1", le="+Inf"}'
        values: '0+60x30'
      # The operator: shop/orders wants 3 shards and stays at 2; shop/billing is settled.
      - series: 'outbox_relay_desired_shards{namespace="shop", name="orders", pod="outbox-operator-0"}'
        values: '3x30'
      - series: 'outbox_relay_shards{namespace="shop", name="orders", pod="outbox-operator-0"}'
        values: '2x30'
      - series: 'outbox_relay_desired_shards{namespace="shop", name="billing", pod="outbox-operator-0"}'
        values: '2x30'
      - series: 'outbox_relay_shards{namespace="shop", name="billing", pod="outbox-operator-0"}'
        values: '2x30'
    alert_rule_test:
      # Not yet: each condition must hold for 5m (the reshard, 10m).
      - {eval_time: 4m, alertname: OutboxPendingHigh}
      - {eval_time: 9m, alertname: OutboxReshardStuck}
      - eval_time: 10m
        alertname: OutboxPendingHigh
        exp_alerts:
          - exp_labels: {severity: warning, namespace: shop, pod: orders-shard-0-abc, table: public.outbox, shard: "0"}
            exp_annotations:
              summary: "Outbox shard 0 of public.outbox has 2000 pending events"
              description: "More than 1000 events are waiting to be published. Check the relay's logs and Kafka."
      - eval_time: 10m
        alertname: OutboxLagHigh
        exp_alerts:
          - exp_labels: {severity: warning, namespace: shop, pod: orders-shard-0-abc, table: public.outbox, shard: "0"}
            exp_annotations:
              summary: "Outbox shard 0 of public.outbox lags 300s"
              description: "The oldest pending event is older than 60s. Consider more shards or check for a blocked aggregate."
      - eval_time: 15m
        alertname: OutboxPublishErrors
        exp_alerts:
          - exp_labels: {severity: warning, namespace: shop, pod: orders-shard-0-abc, table: public.outbox, shard: "0"}
            exp_annotations:
              summary: "Outbox shard 0 of public.outbox fails to publish"
              description: "Publish errors above 0.01/s. The failing rows carry attempts and error in the outbox table."
      - eval_time: 15m
        alertname: OutboxTickSlow
        exp_alerts:
          - exp_labels: {severity: warning, namespace: shop, pod: orders-shard-0-abc, table: public.outbox, shard: "0"}
            exp_annotations:
              summary: "Outbox relay loop of shard 0 is slow"
              description: "The 95th percentile of a relay loop iteration is above 1s."
      - eval_time: 15m
        alertname: OutboxReshardStuck
        exp_alerts:
          - exp_labels: {severity: warning, namespace: shop, name: orders}
            exp_annotations:
              summary: "OutboxRelay shop/orders does not reach its desired shard count"
              description: "Its ShardsSettled condition says why: WaitingForIndex (the bucket index a layout of several shards reads is being built, CONCURRENTLY, on a large table), WaitingForRelays (a new shard's relay pod does not start; the old layout keeps publishing) or Draining (a relay of the old layout does not release its buckets)."
`

// TestAlertsEvaluate renders the chart's PrometheusRule and has Prometheus's own rule engine
// (promtool test rules) evaluate every alert on synthetic series: each fires for the shard or the
// OutboxRelay that crosses its threshold, after its for:, with its summary filled in, and for no
// other.
func TestAlertsEvaluate(t *testing.T) {
	promtool := promtoolBin(t)
	objs := render(t, "prometheusRule.enabled=true")
	rule := objs["PrometheusRule/outbox-outbox-operator"]
	if rule == nil {
		t.Fatal("no PrometheusRule rendered")
	}
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	rules, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), []byte(rulesTest), 0o600); err != nil {
		t.Fatal(err)
	}
	check := exec.Command(promtool, "check", "rules", "rules.yaml")
	check.Dir = dir
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	test := exec.Command(promtool, "test", "rules", "rules_test.yaml")
	test.Dir = dir
	out, err := test.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	t.Logf("promtool test rules:\n%s", out)
}
