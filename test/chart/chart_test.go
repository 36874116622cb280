// Package chart tests the Helm chart: helm lint, and what helm template renders for the values a
// platform engineer would set. helm is built from the Go module proxy by hack/helm.sh.
package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const chartDir = "../../charts/outbox-operator"

func helmBin(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	out, err := exec.Command("bash", "../../hack/helm.sh").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("hack/helm.sh: %v: %s", err, ee.Stderr)
		}
		t.Fatalf("hack/helm.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), errors.New(stderr.String())
	}
	return stdout.String(), nil
}

// render runs helm template with --set pairs and returns the objects by "Kind/name".
func render(t *testing.T, sets ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", "outbox", chartDir, "--namespace", "outbox-system", "--kube-version", "1.37.2"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v", sets, err)
	}
	objs := map[string]*unstructured.Unstructured{}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("decode rendered chart: %v", err)
		}
		if m == nil {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		key := u.GetKind() + "/" + u.GetName()
		if objs[key] != nil { // the same name in another namespace (a RoleBinding per namespace)
			key += "@" + u.GetNamespace()
		}
		objs[key] = u
	}
	return objs
}

func convert(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	b, err := yaml.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, into); err != nil {
		t.Fatalf("%s/%s: %v", u.GetKind(), u.GetName(), err)
	}
}

func TestLint(t *testing.T) {
	if out, err := helm(t, "lint", "--strict", chartDir); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
}

func TestDefaultsAreSecureAndComplete(t *testing.T) {
	objs := render(t)
	for _, want := range []string{
		"CustomResourceDefinition/outboxrelays.outbox.dev", "ServiceAccount/outbox-outbox-operator",
		"ClusterRole/outbox-outbox-operator-manager", "ClusterRoleBinding/outbox-outbox-operator-manager",
		"Role/outbox-outbox-operator-leader-election", "Deployment/outbox-outbox-operator",
		"Service/outbox-outbox-operator-metrics", "PodDisruptionBudget/outbox-outbox-operator",
	} {
		if objs[want] == nil {
			t.Errorf("default render lacks %s", want)
		}
	}
	for _, unwanted := range []string{"ServiceMonitor/outbox-outbox-operator", "PrometheusRule/outbox-outbox-operator",
		"PodMonitor/outbox-outbox-operator-relays", "ConfigMap/outbox-outbox-operator-dashboard"} {
		if objs[unwanted] != nil {
			t.Errorf("default render has optional %s", unwanted)
		}
	}

	var crd apiextensionsv1.CustomResourceDefinition
	convert(t, objs["CustomResourceDefinition/outboxrelays.outbox.dev"], &crd)
	if crd.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("CRD is not kept on uninstall: annotations %v", crd.Annotations)
	}

	var dep appsv1.Deployment
	convert(t, objs["Deployment/outbox-outbox-operator"], &dep)
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	sc := c.SecurityContext
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		pod.SecurityContext.SeccompProfile == nil || pod.SecurityContext.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("pod security context is not restricted: %+v", pod.SecurityContext)
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil ||
		!*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container security context is not restricted: %+v", sc)
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--leader-elect=true", "--relay-image=localhost/outbox-operator:0.1.0", "--metrics-bind-address=:8080", "--autoscale-interval=10s"} {
		if !strings.Contains(args, want) {
			t.Errorf("manager args %q lack %q", args, want)
		}
	}
	if c.LivenessProbe == nil || c.ReadinessProbe == nil || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("manager lacks probes or resources")
	}

	var role rbacv1.ClusterRole
	convert(t, objs["ClusterRole/outbox-outbox-operator-manager"], &role)
	verbs := map[string]bool{}
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			for _, v := range r.Verbs {
				verbs[res+":"+v] = true
				if v == "*" || res == "*" {
					t.Errorf("wildcard in the manager's rules: %+v", r)
				}
			}
		}
	}
	for _, want := range []string{"outboxrelays:watch", "outboxrelays/status:patch", "deployments:create", "secrets:watch"} {
		if !verbs[want] {
			t.Errorf("manager role lacks %s (has %v)", want, verbs)
		}
	}
	if verbs["secrets:create"] || verbs["secrets:update"] || verbs["secrets:delete"] {
		t.Errorf("manager may write Secrets: %v", verbs)
	}
}

func TestOptionalObjects(t *testing.T) {
	objs := render(t, "crds.enabled=false", "serviceMonitor.enabled=true", "prometheusRule.enabled=true",
		"relayPodMonitor.enabled=true", "grafanaDashboard.enabled=true", "prometheusRule.lagSecondsThreshold=45",
		"image.tag=v9", "relay.repository=example.com/relay")
	if objs["CustomResourceDefinition/outboxrelays.outbox.dev"] != nil {
		t.Error("crds.enabled=false still renders the CRD")
	}
	for _, want := range []string{"ServiceMonitor/outbox-outbox-operator", "PrometheusRule/outbox-outbox-operator",
		"PodMonitor/outbox-outbox-operator-relays", "ConfigMap/outbox-outbox-operator-dashboard"} {
		if objs[want] == nil {
			t.Errorf("missing %s", want)
		}
	}
	// The operator's per-OutboxRelay series keep their namespace label through the scrape.
	eps, _, _ := unstructured.NestedSlice(objs["ServiceMonitor/outbox-outbox-operator"].Object, "spec", "endpoints")
	if len(eps) != 1 || eps[0].(map[string]any)["honorLabels"] != true {
		t.Errorf("ServiceMonitor endpoints %v: want honorLabels", eps)
	}
	var exprs []string
	rules, _, _ := unstructured.NestedSlice(objs["PrometheusRule/outbox-outbox-operator"].Object, "spec", "groups")
	for _, g := range rules {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			exprs = append(exprs, r.(map[string]any)["expr"].(string))
		}
	}
	rule := strings.Join(exprs, "\n")
	for _, want := range []string{"outbox_pending", "> 1000", "outbox_lag_seconds", "> 45", "rate(outbox_publish_errors_total[5m])) > 0.01",
		"histogram_quantile(0.95", "outbox_worker_tick_duration_seconds_bucket", "> 1",
		"outbox_relay_desired_shards) != max by (namespace, name) (outbox_relay_shards)"} {
		if !strings.Contains(rule, want) {
			t.Errorf("PrometheusRule lacks %q:\n%s", want, rule)
		}
	}
	dash := objs["ConfigMap/outbox-outbox-operator-dashboard"].Object["data"].(map[string]any)["outbox-relay.json"].(string)
	for _, metric := range []string{"outbox_pending", "outbox_lag_seconds", "outbox_published_total", "outbox_publish_errors_total", "outbox_worker_tick_duration_seconds_bucket",
		"outbox_relay_shards", "outbox_relay_desired_shards", "outbox_relay_last_reshard_pause_seconds"} {
		if !strings.Contains(dash, metric) {
			t.Errorf("dashboard lacks %s", metric)
		}
	}
	var dep appsv1.Deployment
	convert(t, objs["Deployment/outbox-outbox-operator"], &dep)
	if img := dep.Spec.Template.Spec.Containers[0].Image; img != "localhost/outbox-operator:v9" {
		t.Errorf("image %s", img)
	}
	if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--relay-image=example.com/relay:v9") {
		t.Errorf("relay image not passed: %s", args)
	}
}

// TestWatchNamespaces: with watchNamespaces the manager watches those namespaces only and its
// rules are granted by a RoleBinding in each, never cluster-wide (cmd/manager's
// TestRunWatchNamespaces runs the manager with exactly that).
func TestWatchNamespaces(t *testing.T) {
	objs := render(t, "watchNamespaces={shop,billing}")
	if objs["ClusterRoleBinding/outbox-outbox-operator-manager"] != nil {
		t.Error("watchNamespaces still binds the manager's rules cluster-wide")
	}
	var bound []string
	for _, o := range objs {
		if o.GetKind() != "RoleBinding" || o.GetName() != "outbox-outbox-operator-manager" {
			continue
		}
		var rb rbacv1.RoleBinding
		convert(t, o, &rb)
		if rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != "outbox-outbox-operator-manager" ||
			len(rb.Subjects) != 1 || rb.Subjects[0].Namespace != "outbox-system" {
			t.Errorf("RoleBinding in %s: %+v", rb.Namespace, rb)
		}
		bound = append(bound, rb.Namespace)
	}
	if strings.Join(sortedCopy(bound), ",") != "billing,shop" {
		t.Errorf("manager rules bound in %v, want billing and shop", bound)
	}
	var dep appsv1.Deployment
	convert(t, objs["Deployment/outbox-outbox-operator"], &dep)
	if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--watch-namespaces=shop,billing") {
		t.Errorf("manager args %q", args)
	}
}

// TestRelayTracingEndpoint: relayTracing.otlpEndpoint reaches the manager as
// --relay-otlp-endpoint (the relays of OutboxRelays without spec.publish.tracing export there),
// and nothing is passed by default.
func TestRelayTracingEndpoint(t *testing.T) {
	for _, c := range []struct{ set, want string }{
		{"relayTracing.otlpEndpoint=http://otel-collector.observability:4317", "--relay-otlp-endpoint=http://otel-collector.observability:4317"},
		{"", ""},
	} {
		var sets []string
		if c.set != "" {
			sets = append(sets, c.set)
		}
		var dep appsv1.Deployment
		convert(t, render(t, sets...)["Deployment/outbox-outbox-operator"], &dep)
		args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ")
		if got := strings.Contains(args, "--relay-otlp-endpoint"); got != (c.want != "") || (c.want != "" && !strings.Contains(args, c.want)) {
			t.Errorf("--set %q: manager args %q", c.set, args)
		}
	}
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

func TestValuesSchemaRejectsBadValues(t *testing.T) {
	for _, bad := range []string{"replicaCount=-1", "image.pullPolicy=Sometimes", "logLevel=chatty", "metrics.port=70000", "unknownKey=1", "lagPollInterval=soon", "autoscaleInterval=often", "watchNamespaces={Bad_Name}", "relayTracing.otlpEndpoint=otel:4317"} {
		t.Run(bad, func(t *testing.T) {
			_, err := helm(t, "template", "outbox", chartDir, "--kube-version", "1.37.2", "--set", bad)
			if err == nil || !strings.Contains(err.Error(), "values don't meet the specifications of the schema") {
				t.Fatalf("helm template --set %s: %v", bad, err)
			}
		})
	}
}

func TestChartCopiesOfGeneratedFilesAreCurrent(t *testing.T) {
	for _, pair := range [][2]string{
		{"../../config/crd/bases/outbox.dev_outboxrelays.yaml", chartDir + "/files/crds/outbox.dev_outboxrelays.yaml"},
	} {
		src, err := os.ReadFile(pair[0])
		if err != nil {
			t.Fatal(err)
		}
		dst, err := os.ReadFile(pair[1])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasSuffix(dst, src) {
			t.Errorf("%s is not a copy of %s: run make manifests", filepath.Base(pair[1]), pair[0])
		}
	}
}

// TestRelayAutoscalingExamples renders the KEDA ScaledObject and the HPA that scale an
// OutboxRelay through its scale subresource on the lag more shards can fix, the operator's
// outbox_relay_scalable_lag_seconds, selected by the OutboxRelay's exact namespace and name.
func TestRelayAutoscalingExamples(t *testing.T) {
	if objs := render(t); objs["ScaledObject/orders-lag"] != nil || objs["HorizontalPodAutoscaler/orders-lag"] != nil {
		t.Fatal("autoscaling examples rendered by default")
	}
	objs := render(t, "relayAutoscaling.keda.enabled=true", "relayAutoscaling.hpa.enabled=true",
		"relayAutoscaling.relayName=orders", "relayAutoscaling.relayNamespace=shop", "relayAutoscaling.maxShards=6",
		"relayAutoscaling.targetLagSeconds=20")
	for _, kind := range []string{"ScaledObject", "HorizontalPodAutoscaler"} {
		o := objs[kind+"/orders-lag"]
		if o == nil {
			t.Fatalf("no %s/orders-lag among %d objects", kind, len(objs))
		}
		if o.GetNamespace() != "shop" {
			t.Errorf("%s in namespace %q", kind, o.GetNamespace())
		}
		ref, _, _ := unstructured.NestedStringMap(o.Object, "spec", "scaleTargetRef")
		if ref["apiVersion"] != "outbox.dev/v1alpha1" || ref["kind"] != "OutboxRelay" || ref["name"] != "orders" {
			t.Errorf("%s scaleTargetRef %v", kind, ref)
		}
	}
	so := objs["ScaledObject/orders-lag"]
	if max, _, _ := unstructured.NestedFieldNoCopy(so.Object, "spec", "maxReplicaCount"); fmt.Sprint(max) != "6" {
		t.Errorf("maxReplicaCount %v", max)
	}
	triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
	if len(triggers) != 1 {
		t.Fatalf("triggers %v", triggers)
	}
	trig := triggers[0].(map[string]any)
	md := trig["metadata"].(map[string]any)
	if trig["type"] != "prometheus" || trig["metricType"] != "Value" || md["threshold"] != "20" ||
		md["query"] != `max(outbox_relay_scalable_lag_seconds{namespace="shop", name="orders"})` {
		t.Errorf("trigger %v", trig)
	}
	hpa := objs["HorizontalPodAutoscaler/orders-lag"]
	metrics, _, _ := unstructured.NestedSlice(hpa.Object, "spec", "metrics")
	if len(metrics) != 1 {
		t.Fatalf("HPA metrics %v", metrics)
	}
	ext, _, _ := unstructured.NestedMap(metrics[0].(map[string]any), "external", "metric")
	sel, _, _ := unstructured.NestedStringMap(ext, "selector", "matchLabels")
	if ext["name"] != "outbox_relay_scalable_lag_seconds" || sel["namespace"] != "shop" || sel["name"] != "orders" || len(sel) != 2 {
		t.Errorf("HPA external metric %v: want outbox_relay_scalable_lag_seconds selected by the labels the operator's series carry", ext)
	}
	if _, err := helm(t, "template", "outbox", chartDir, "--kube-version", "1.37.2", "--set", "relayAutoscaling.keda.enabled=true"); err == nil ||
		!strings.Contains(err.Error(), "relayAutoscaling.relayName names the OutboxRelay to scale") {
		t.Errorf("KEDA example without a relay name: %v", err)
	}
}
