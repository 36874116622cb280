package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/test/envtestutil"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(envtestutil.Run(m)) }

func TestParseFlags(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := map[string]struct {
		args    []string
		env     map[string]string
		wantErr string
		check   func(options) bool
	}{
		"defaults with the image from the environment": {
			env: map[string]string{"OUTBOX_RELAY_IMAGE": "example/outbox-operator:1"},
			check: func(o options) bool {
				return o.leaderElect && o.metricsAddr == ":8080" && o.probeAddr == ":8081" &&
					o.relayImage == "example/outbox-operator:1" && o.lagPollInterval == 30*time.Second && o.logLevel == "info"
			},
		},
		"watched namespaces": {
			args:  []string{"--relay-image=r", "--watch-namespaces= shop,billing ,"},
			check: func(o options) bool { return strings.Join(o.watchNamespaces, "/") == "shop/billing" },
		},
		"bad namespace": {args: []string{"--relay-image=r", "--watch-namespaces=Shop_1"}, wantErr: `namespace "Shop_1"`},
		"flags": {
			args: []string{"--relay-image=r:2", "--leader-elect=false", "--metrics-bind-address=0",
				"--health-probe-bind-address=:9000", "--lag-poll-interval=5s", "--zap-log-level=debug", "--log-format=text"},
			check: func(o options) bool {
				return !o.leaderElect && o.metricsAddr == "0" && o.probeAddr == ":9000" && o.relayImage == "r:2" &&
					o.lagPollInterval == 5*time.Second && o.logLevel == "debug" && o.logFormat == "text"
			},
		},
		"relays' OTLP endpoint": {
			args:  []string{"--relay-image=r", "--relay-otlp-endpoint=http://otel-collector:4317"},
			check: func(o options) bool { return o.relayOTLPEndpoint == "http://otel-collector:4317" },
		},
		"relays' OTLP endpoint without a scheme": {args: []string{"--relay-image=r", "--relay-otlp-endpoint=otel:4317"}, wantErr: `--relay-otlp-endpoint "otel:4317"`},
		"no relay image":                         {wantErr: "--relay-image"},
		"poll interval too low":                  {args: []string{"--relay-image=r", "--lag-poll-interval=10ms"}, wantErr: "below 1s"},
		"autoscale interval too low":             {args: []string{"--relay-image=r", "--autoscale-interval=100ms"}, wantErr: "--autoscale-interval 100ms is below 1s"},
		"bad log level":                          {args: []string{"--relay-image=r", "--log-level=loud"}, wantErr: "log level"},
		"stray argument":                         {args: []string{"--relay-image=r", "extra"}, wantErr: "unexpected argument"},
		"unknown flag":                           {args: []string{"--relay-image=r", "--nope"}, wantErr: "not defined"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, err := parseFlags(tc.args, env(tc.env), io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(o) {
				t.Fatalf("options %+v, err %v", o, err)
			}
		})
	}
}

// startManager runs the manager with o until the test ends, and checks that it stops cleanly.
func startManager(t *testing.T, o options) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("manager did not stop")
		}
	})
}

// TestRun starts the manager against envtest with leader election and checks the Lease, the
// probes and the metrics endpoint with the per-relay gauges.
func TestRun(t *testing.T) {
	env := envtestutil.Shared(t)
	ctrl.SetLogger(logr.Discard())
	t.Setenv("KUBECONFIG", env.Kubeconfig(t))
	metricsPort, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	probePort, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"--relay-image=example/relay:1", "--leader-election-namespace=default",
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probePort)}, os.Getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	startManager(t, o)

	ns := env.CreateNamespace(t, "run")
	relay := &v1alpha1.OutboxRelay{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "waiting"},
		Spec: v1alpha1.OutboxRelaySpec{
			Database:     v1alpha1.DatabaseSpec{SecretRef: v1alpha1.DatabaseSecretRef{Name: "missing"}},
			Kafka:        v1alpha1.KafkaSpec{Brokers: []v1alpha1.Broker{"kafka:9092"}},
			DefaultTopic: "events",
		},
	}
	if err := env.Client.Create(context.Background(), relay); err != nil {
		t.Fatal(err)
	}

	get := func(port int, path string) (int, string, error) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for {
		ok := true
		for _, path := range []string{"/healthz", "/readyz"} {
			code, body, err := get(probePort, path)
			if err != nil || code != http.StatusOK {
				ok, last = false, fmt.Sprintf("%s: %d %q %v", path, code, body, err)
			}
		}
		if ok {
			code, body, err := get(metricsPort, "/metrics")
			want := fmt.Sprintf(`outbox_relay_ready{name="waiting",namespace="%s"} 0`, ns)
			if err != nil || code != http.StatusOK || !strings.Contains(body, want) ||
				!strings.Contains(body, "controller_runtime_reconcile_total") {
				ok, last = false, fmt.Sprintf("/metrics: %d %v, want %q", code, err, want)
			}
		}
		if ok {
			var lease coordinationv1.Lease
			err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: leaderElectionID}, &lease)
			if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
				ok, last = false, fmt.Sprintf("lease: %+v %v", lease.Spec, err)
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestKustomizeDefault renders config/default with kustomize (kubectl kustomize) and has the API
// server validate every object (server-side dry run): the operator's install manifests are valid,
// run the manager with leader election, and default the relay image to the operator image.
func TestKustomizeDefault(t *testing.T) {
	env := envtestutil.Shared(t)
	root, err := envtestutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	render := env.Kubectl(t, ctx, "kustomize", filepath.Join(root, "config", "default"))
	rendered, err := render.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize config/default: %v", err)
	}
	text := string(rendered)
	for _, want := range []string{
		"name: outbox-system", "name: outbox-operator-controller-manager", "--leader-elect=true",
		"name: OUTBOX_RELAY_IMAGE\n          value: controller:latest", "kind: CustomResourceDefinition",
		"name: outbox-operator-manager-role", "name: outbox-operator-leader-election-role", "readOnlyRootFilesystem: true",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("rendered config/default lacks %q", want)
		}
	}
	// A dry run creates nothing, so the namespaced objects need their namespace for real.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "outbox-system"}}
	if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	apply := env.Kubectl(t, ctx, "apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f", "-")
	apply.Stdin = strings.NewReader(text)
	out, err := apply.CombinedOutput()
	if err != nil {
		t.Fatalf("server-side dry run of config/default: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// TestRunWatchNamespaces runs the manager as a user that may act in one namespace only (the
// manager's rules, config/rbac/role.yaml, bound by a RoleBinding there, as the chart does with
// watchNamespaces), with --watch-namespaces naming it: it starts, reconciles the OutboxRelays of
// that namespace and leaves those of another alone. Without the flag its caches would list every
// namespace, which that user may not.
func TestRunWatchNamespaces(t *testing.T) {
	env := envtestutil.Shared(t)
	ctrl.SetLogger(logr.Discard())
	ctx := context.Background()
	watched, other := env.CreateNamespace(t, "watched"), env.CreateNamespace(t, "unwatched")

	root, err := envtestutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "config/rbac/role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		t.Fatal(err)
	}
	role.ObjectMeta = metav1.ObjectMeta{Name: "outbox-manager-" + watched}
	if err := env.Client.Create(ctx, &role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), &role) })
	user := "outbox-operator-" + watched
	if err := env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: watched, Name: "outbox-manager"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", env.KubeconfigFor(t, user))
	probePort, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"--relay-image=example/relay:1", "--leader-elect=false", "--metrics-bind-address=0",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probePort), "--watch-namespaces=" + watched}, os.Getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	startManager(t, o)

	relay := func(ns string) *v1alpha1.OutboxRelay {
		return &v1alpha1.OutboxRelay{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orders"},
			Spec: v1alpha1.OutboxRelaySpec{
				Database:     v1alpha1.DatabaseSpec{SecretRef: v1alpha1.DatabaseSecretRef{Name: "missing"}},
				Kafka:        v1alpha1.KafkaSpec{Brokers: []v1alpha1.Broker{"kafka:9092"}},
				DefaultTopic: "events",
			},
		}
	}
	for _, ns := range []string{watched, other} {
		if err := env.Client.Create(ctx, relay(ns)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var got v1alpha1.OutboxRelay
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: watched, Name: "orders"}, &got); err != nil {
			t.Fatal(err)
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady); c != nil {
			if c.Reason != v1alpha1.ReasonSecretNotFound {
				t.Errorf("the watched relay: Ready %+v", c)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the OutboxRelay of the watched namespace was not reconciled")
		}
		time.Sleep(200 * time.Millisecond)
	}
	var unwatched v1alpha1.OutboxRelay
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: other, Name: "orders"}, &unwatched); err != nil {
		t.Fatal(err)
	}
	if len(unwatched.Status.Conditions) != 0 {
		t.Errorf("the OutboxRelay of an unwatched namespace was reconciled: %+v", unwatched.Status.Conditions)
	}
}
