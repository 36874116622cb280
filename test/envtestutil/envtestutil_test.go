package envtestutil_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-operator/outbox-operator/test/envtestutil"
)

func TestMain(m *testing.M) { os.Exit(envtestutil.Run(m)) }

// TestSmoke starts the control plane, creates and reads back a Namespace and a Deployment, and
// checks that the OutboxRelay CRD is served.
func TestSmoke(t *testing.T) {
	env := envtestutil.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	v, err := dc.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver %s (%s), assets %s", v.GitVersion, v.Platform, env.AssetsDir)

	ns := env.CreateNamespace(t, "smoke")
	var gotNS corev1.Namespace
	if err := env.Client.Get(ctx, client.ObjectKey{Name: ns}, &gotNS); err != nil {
		t.Fatalf("read back namespace: %v", err)
	}
	if gotNS.UID == "" {
		t.Fatal("namespace has no UID")
	}

	labels := map[string]string{"app": "smoke"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/smoke:1"}}},
			},
		},
	}
	if err := env.Client.Create(ctx, dep); err != nil {
		t.Fatalf("create deployment: %v", err)
	}
	var got appsv1.Deployment
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(dep), &got); err != nil {
		t.Fatalf("read back deployment: %v", err)
	}
	if *got.Spec.Replicas != 2 || got.Spec.Template.Spec.Containers[0].Image != "example.invalid/smoke:1" {
		t.Fatalf("deployment read back differs: replicas %d image %s", *got.Spec.Replicas, got.Spec.Template.Spec.Containers[0].Image)
	}
	// The API server defaulted the strategy: proof that it is a real API server, not a fake.
	if got.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType {
		t.Fatalf("strategy not defaulted: %q", got.Spec.Strategy.Type)
	}

	res, err := dc.ServerResourcesForGroupVersion("outbox.dev/v1alpha1")
	if err != nil {
		t.Fatalf("OutboxRelay CRD not served: %v", err)
	}
	var kinds []string
	for _, r := range res.APIResources {
		kinds = append(kinds, r.Name)
	}
	want := []string{"outboxrelays", "outboxrelays/scale", "outboxrelays/status"}
	for _, w := range want {
		if !strings.Contains(" "+strings.Join(kinds, " ")+" ", " "+w+" ") {
			t.Fatalf("resources %v lack %s", kinds, w)
		}
	}
}

// TestAssetsDirExplainsWhatIsMissing checks that a missing KUBEBUILDER_ASSETS or missing binaries
// give an error with the reason instead of a skip.
func TestAssetsDirExplainsWhatIsMissing(t *testing.T) {
	empty := t.TempDir()
	partial := t.TempDir()
	if err := os.WriteFile(filepath.Join(partial, "kube-apiserver"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		value string
		want  []string
	}{
		"unset":          {value: "", want: []string{"KUBEBUILDER_ASSETS is not set", "hack/envtest-assets.sh"}},
		"empty dir":      {value: empty, want: []string{"lacks the executables kube-apiserver, etcd, kubectl"}},
		"only apiserver": {value: partial, want: []string{"lacks the executables etcd, kubectl"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv(envtestutil.AssetsEnv, tc.value)
			_, err := envtestutil.AssetsDir()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if _, err := envtestutil.Start(); err == nil {
				t.Fatal("Start succeeded without binaries")
			}
		})
	}
}

// TestControlPlaneDiesWithKilledTestBinary: a test binary killed while its control plane runs
// (as a panic or go test's timeout would end it) leaves no kube-apiserver, etcd or directory.
func TestControlPlaneDiesWithKilledTestBinary(t *testing.T) {
	if os.Getenv("ENVTESTUTIL_CHILD") == "1" {
		env, err := envtestutil.Start()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("dirs %s %s\n", env.Environment.ControlPlane.APIServer.CertDir, env.Environment.ControlPlane.Etcd.DataDir)
		time.Sleep(2 * time.Minute) // killed by the parent long before
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestControlPlaneDiesWithKilledTestBinary$")
	cmd.Env = append(os.Environ(), "ENVTESTUTIL_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var certDir, dataDir string
	if _, err := fmt.Fscanf(bufio.NewReader(out), "dirs %s %s\n", &certDir, &dataDir); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child did not report its control plane: %v", err)
	}
	running := func() []string {
		var pids []string
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err == nil && !strings.Contains(string(b), "envtest-watchdog") &&
				(strings.Contains(string(b), certDir) || strings.Contains(string(b), dataDir)) {
				pids = append(pids, e.Name())
			}
		}
		return pids
	}
	if len(running()) < 2 {
		t.Fatalf("the child's kube-apiserver and etcd are not running: %v", running())
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	start := time.Now()
	for {
		_, errCert := os.Stat(certDir)
		_, errData := os.Stat(dataDir)
		left := running()
		if len(left) == 0 && os.IsNotExist(errCert) && os.IsNotExist(errData) {
			t.Logf("control plane gone %s after its test binary was killed", time.Since(start).Round(100*time.Millisecond))
			return
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("a minute after the test binary was killed: processes %v, directories %v %v", left, errCert, errData)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
