package controllers

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/test/envtestutil"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	stopManager()
	envtestutil.StopShared()
	os.Exit(code)
}

const testImage = "example.invalid/outbox-relay:test"

// operatorUser is the identity the test manager runs as. It holds only config/rbac/role.yaml, so
// every test also proves that the generated RBAC is enough.
const operatorUser = "system:serviceaccount:outbox-system:outbox-operator-controller-manager"

// suite is a manager running the reconciler against the shared envtest API server.
type suite struct {
	env  *envtestutil.Env
	c    client.Client // direct client, cluster administrator
	mgr  ctrl.Manager
	r    *OutboxRelayReconciler
	logs *syncBuffer
}

var (
	suiteOnce   sync.Once
	theSuite    *suite
	suiteErr    error
	suiteCancel context.CancelFunc
	suiteDone   = make(chan struct{})
)

// syncBuffer collects the manager's logs so tests can check that no secret reaches them.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// sharedSuite starts envtest and the manager once per test binary.
func sharedSuite(t *testing.T) *suite {
	t.Helper()
	env := envtestutil.Shared(t)
	suiteOnce.Do(func() { theSuite, suiteErr = startSuite(env) })
	if suiteErr != nil {
		t.Fatalf("start manager: %v", suiteErr)
	}
	return theSuite
}

func stopManager() {
	if suiteCancel != nil {
		suiteCancel()
		select {
		case <-suiteDone:
		case <-time.After(30 * time.Second):
		}
		suiteCancel = nil
	}
}

// restartManager stops the shared manager and starts a new one with a new reconciler, as an
// operator restart (a new pod, a new leader) does: what is left is what the API server and the
// database keep.
func (s *suite) restartManager(t *testing.T) {
	t.Helper()
	stopManager()
	fresh, err := startSuite(s.env)
	if err != nil {
		t.Fatalf("restart the manager: %v", err)
	}
	s.mgr, s.r, s.logs = fresh.mgr, fresh.r, fresh.logs
}

// grantOperatorRBAC binds the generated ClusterRole to operatorUser.
func grantOperatorRBAC(ctx context.Context, c client.Client) error {
	root, err := envtestutil.ModuleRoot()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(root, "config", "rbac", "role.yaml"))
	if err != nil {
		return err
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(data, &role); err != nil {
		return err
	}
	role.Name = "outbox-operator-test-manager-role"
	if err := c.Create(ctx, &role); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "outbox-operator-test-manager"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: operatorUser}},
	}
	if err := c.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

func startSuite(env *envtestutil.Env) (*suite, error) {
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	var w io.Writer = logs
	if os.Getenv("OUTBOX_TEST_LOGS") != "" {
		w = io.MultiWriter(logs, os.Stderr)
	}
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})))

	if err := grantOperatorRBAC(ctx, env.Client); err != nil {
		cancel()
		return nil, fmt.Errorf("grant RBAC: %w", err)
	}
	user, err := env.Environment.AddUser(envtest.User{Name: operatorUser}, &rest.Config{QPS: 200, Burst: 400})
	if err != nil {
		cancel()
		return nil, err
	}
	mgr, err := ctrl.NewManager(user.Config(), ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		cancel()
		return nil, err
	}
	r := &OutboxRelayReconciler{
		RelayImage:        testImage,
		LagPollInterval:   time.Second,
		AutoscaleInterval: time.Second,
		RetryMaxDelay:     suiteRetryMaxDelay,
		LagStatusInterval: time.Second,
		// Long: a pass that waits for a Secret must be woken by the Secret watch, not by a timer.
		WaitInterval: time.Hour,
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		cancel()
		return nil, err
	}
	done := make(chan struct{})
	suiteDone = done
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager stopped:", err)
		}
	}()
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		cancel()
		return nil, fmt.Errorf("cache did not sync")
	}
	suiteCancel = cancel
	return &suite{env: env, c: env.Client, mgr: mgr, r: r, logs: logs}, nil
}

// --- fixtures ---

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (s *suite) createSecret(t *testing.T, ns, name string, data map[string]string) *corev1.Secret {
	t.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, StringData: data}
	if err := s.c.Create(testCtx(t), sec); err != nil {
		t.Fatal(err)
	}
	return sec
}

// newRelay returns a minimal OutboxRelay; the API server fills in the defaults.
func newRelay(ns, name, secret string, mutate ...func(*v1alpha1.OutboxRelay)) *v1alpha1.OutboxRelay {
	r := &v1alpha1.OutboxRelay{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.OutboxRelaySpec{
			Database: v1alpha1.DatabaseSpec{SecretRef: v1alpha1.DatabaseSecretRef{Name: v1alpha1.SecretName(secret)}},
			Kafka:    v1alpha1.KafkaSpec{Brokers: []v1alpha1.Broker{"kafka-0.kafka.svc:9092"}},
			Topics:   map[string]v1alpha1.TopicName{"order": "orders.events"},
		},
	}
	for _, m := range mutate {
		m(r)
	}
	return r
}

func (s *suite) createRelay(t *testing.T, relay *v1alpha1.OutboxRelay) {
	t.Helper()
	if err := s.c.Create(testCtx(t), relay); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.c.Delete(ctx, relay)
	})
}

// eventually polls f until it returns nil or the deadline passes, then fails with f's last error.
func eventually(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *suite) getRelay(t *testing.T, ns, name string) *v1alpha1.OutboxRelay {
	t.Helper()
	r := &v1alpha1.OutboxRelay{}
	if err := s.c.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: name}, r); err != nil {
		t.Fatal(err)
	}
	return r
}

// waitCondition waits until the relay's condition has the status and reason, and returns the relay.
func (s *suite) waitCondition(t *testing.T, ns, name, typ string, status metav1.ConditionStatus, reason string) *v1alpha1.OutboxRelay {
	t.Helper()
	var relay *v1alpha1.OutboxRelay
	eventually(t, 60*time.Second, func() error {
		relay = &v1alpha1.OutboxRelay{}
		if err := s.c.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: name}, relay); err != nil {
			return err
		}
		c := meta.FindStatusCondition(relay.Status.Conditions, typ)
		if c == nil {
			return fmt.Errorf("no %s condition yet; conditions %v", typ, relay.Status.Conditions)
		}
		if c.Status != status || c.Reason != reason {
			return fmt.Errorf("%s = %s/%s %q, want %s/%s", typ, c.Status, c.Reason, c.Message, status, reason)
		}
		return nil
	})
	return relay
}

func (s *suite) deployment(t *testing.T, ns, name string) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{}
	var err error
	eventually(t, 30*time.Second, func() error {
		err = s.c.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: name}, d)
		return err
	})
	return d
}

// markAvailable plays the Deployment controller, which envtest does not run: it reports one
// available pod of the current template.
func (s *suite) markAvailable(t *testing.T, ns, name string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		d := &appsv1.Deployment{}
		if err := s.c.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
			return err
		}
		d.Status = appsv1.DeploymentStatus{
			ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue,
				Reason: "MinimumReplicasAvailable", LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		}
		return s.c.Status().Update(testCtx(t), d)
	})
}

// eventsFor lists the events.k8s.io Events regarding an object.
func (s *suite) eventsFor(t *testing.T, ns, name string) []string {
	t.Helper()
	var list eventsv1.EventList
	if err := s.c.List(testCtx(t), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == name {
			out = append(out, e.Type+" "+e.Reason+" "+e.Note)
		}
	}
	return out
}
