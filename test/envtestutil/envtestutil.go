// Package envtestutil starts a real kube-apiserver and etcd (controller-runtime's envtest) with the
// OutboxRelay CRD from config/crd/bases installed, for integration tests.
//
//	func TestMain(m *testing.M) { os.Exit(envtestutil.Run(m)) }
//
//	func TestSomething(t *testing.T) {
//		env := envtestutil.Shared(t) // one control plane per test binary
//		ns := env.CreateNamespace(t, "something")
//		_ = env.Client.Create(ctx, obj)
//	}
//
// The binaries (kube-apiserver, etcd, kubectl) come from $KUBEBUILDER_ASSETS, built by
// hack/envtest-assets.sh. A helper that cannot start the control plane fails the test with the
// reason; it never skips.
package envtestutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	outboxv1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
)

// AssetsEnv is the environment variable naming the directory of the envtest binaries.
const AssetsEnv = "KUBEBUILDER_ASSETS"

// Env is a running control plane.
type Env struct {
	Environment *envtest.Environment
	// Config connects as a cluster administrator (system:masters).
	Config *rest.Config
	// Client is a direct (uncached) client with Scheme.
	Client client.Client
	// Scheme holds the client-go types and outbox.dev/v1alpha1.
	Scheme *runtime.Scheme
	// AssetsDir is the directory the binaries came from.
	AssetsDir string

	nsCounter  sync.Mutex
	namespaces int
}

var (
	shared    *Env
	sharedErr error
	once      sync.Once
)

// Run runs the package's tests and stops the shared control plane afterwards. Use it from TestMain.
func Run(m *testing.M) int {
	code := m.Run()
	StopShared()
	return code
}

// StopShared stops the shared control plane if one was started. For a TestMain that combines helpers.
func StopShared() {
	if shared != nil {
		_ = shared.Stop()
		shared = nil
	}
}

// Shared returns the package's control plane, starting it on first use.
func Shared(t testing.TB) *Env {
	t.Helper()
	once.Do(func() { shared, sharedErr = Start() })
	if sharedErr != nil {
		t.Fatalf("envtestutil: %v", sharedErr)
	}
	return shared
}

// New starts a dedicated control plane for t and stops it when t ends.
func New(t testing.TB) *Env {
	t.Helper()
	env, err := Start()
	if err != nil {
		t.Fatalf("envtestutil: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return env
}

// NewScheme returns a scheme with the client-go types and outbox.dev/v1alpha1.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := outboxv1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// AssetsDir returns the directory of the envtest binaries, or an error that says how to get them.
func AssetsDir() (string, error) {
	dir := os.Getenv(AssetsEnv)
	if dir == "" {
		return "", fmt.Errorf("%s is not set: build the control-plane binaries with "+
			"hack/envtest-assets.sh and export %s=$HOME/.cache/outbox-operator/envtest-1.37.2", AssetsEnv, AssetsEnv)
	}
	var missing []string
	for _, b := range []string{"kube-apiserver", "etcd", "kubectl"} {
		fi, err := os.Stat(filepath.Join(dir, b))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("%s=%s lacks the executables %s: build them with hack/envtest-assets.sh %s",
			AssetsEnv, dir, strings.Join(missing, ", "), dir)
	}
	return dir, nil
}

// CRDDir returns config/crd/bases of the module that holds the working directory.
func CRDDir() (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "config", "crd", "bases")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("CRD directory: %w (run the controller-gen crd generator)", err)
	}
	return dir, nil
}

// ModuleRoot walks up from the working directory to the directory holding go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Start starts a control plane with the CRDs installed. The caller must Stop it.
func Start() (*Env, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	crds, err := CRDDir()
	if err != nil {
		return nil, err
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{crds},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
		// The defaults (20s) are tight on a busy two-core machine.
		ControlPlaneStartTimeout: 90 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	cfg, err := te.Start()
	if err != nil {
		_ = te.Stop()
		return nil, fmt.Errorf("start control plane from %s: %w", assets, err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	watchControlPlane(te.ControlPlane.APIServer.CertDir, te.ControlPlane.Etcd.DataDir)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = te.Stop()
		return nil, err
	}
	return &Env{Environment: te, Config: cfg, Client: c, Scheme: scheme, AssetsDir: assets}, nil
}

// watchdogScript waits until the test binary ($1) is gone, then stops the processes ($3...) whose
// command line still names the control plane's directories ($2, space separated; a pid reused by
// another process is left alone) and removes those directories.
const watchdogScript = `owner=$1; dirs=$2; shift 2
while kill -0 "$owner" 2>/dev/null; do sleep 1; done
ours() { for d in $dirs; do grep -qF -- "$d" "/proc/$1/cmdline" 2>/dev/null && return 0; done; return 1; }
for sig in TERM KILL; do
	for p in "$@"; do ours "$p" && kill -s "$sig" "$p" 2>/dev/null; done
	[ "$sig" = TERM ] && sleep 3
done
rm -rf $dirs`

// watchControlPlane starts a watchdog for a started control plane: a test binary that dies
// without stopping it (a panic, a kill, go test's timeout) must not leave kube-apiserver and etcd
// running and their directories behind. After a normal Stop it finds nothing to do.
func watchControlPlane(dirs ...string) {
	var live []string
	for _, d := range dirs {
		if d != "" {
			live = append(live, d)
		}
	}
	pids := pidsNaming(live)
	if len(pids) == 0 {
		return
	}
	args := append([]string{"-c", watchdogScript, "envtest-watchdog", strconv.Itoa(os.Getpid()), strings.Join(live, " ")}, pids...)
	cmd := exec.Command("bash", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // outlives the test binary's process group
	if err := cmd.Start(); err == nil {
		_ = cmd.Process.Release()
	}
}

// pidsNaming returns the pids of the processes whose command line contains one of dirs.
func pidsNaming(dirs []string) []string {
	entries, err := os.ReadDir("/proc")
	if err != nil || len(dirs) == 0 {
		return nil
	}
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, d := range dirs {
			if strings.Contains(string(cmdline), d) {
				out = append(out, e.Name())
				break
			}
		}
	}
	return out
}

// Stop stops the control plane.
func (e *Env) Stop() error { return e.Environment.Stop() }

// CreateNamespace creates a namespace named after prefix and a counter. Namespaces are not deleted
// (envtest runs no namespace controller), which keeps tests independent anyway.
func (e *Env) CreateNamespace(t testing.TB, prefix string) string {
	t.Helper()
	e.nsCounter.Lock()
	e.namespaces++
	name := fmt.Sprintf("%s-%d", prefix, e.namespaces)
	e.nsCounter.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := e.Client.Create(ctx, ns); err != nil {
		t.Fatalf("envtestutil: create namespace %s: %v", name, err)
	}
	return name
}

// UserConfig returns a rest.Config for a user authenticated by client certificate, with the
// given groups; without groups the user has only the permissions RBAC grants it.
func (e *Env) UserConfig(t testing.TB, name string, groups ...string) *rest.Config {
	t.Helper()
	u, err := e.Environment.AddUser(envtest.User{Name: name, Groups: groups}, &rest.Config{QPS: 200, Burst: 400})
	if err != nil {
		t.Fatalf("envtestutil: add user %s: %v", name, err)
	}
	return u.Config()
}

// Kubeconfig writes a kubeconfig for a cluster administrator into a temporary file and returns
// its path.
func (e *Env) Kubeconfig(t testing.TB) string {
	t.Helper()
	return e.KubeconfigFor(t, "envtest-admin", "system:masters")
}

// KubeconfigFor writes a kubeconfig file for the user name in groups and returns its path.
func (e *Env) KubeconfigFor(t testing.TB, name string, groups ...string) string {
	t.Helper()
	u, err := e.Environment.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		t.Fatalf("envtestutil: add user: %v", err)
	}
	data, err := u.KubeConfig()
	if err != nil {
		t.Fatalf("envtestutil: kubeconfig: %v", err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("envtestutil: write kubeconfig: %v", err)
	}
	return path
}

// Kubectl returns a command running the envtest kubectl with a kubeconfig for a cluster administrator.
func (e *Env) Kubectl(t testing.TB, ctx context.Context, args ...string) *exec.Cmd {
	t.Helper()
	kubeconfig := e.Kubeconfig(t)
	return exec.CommandContext(ctx, filepath.Join(e.AssetsDir, "kubectl"),
		append([]string{"--kubeconfig", kubeconfig}, args...)...)
}
