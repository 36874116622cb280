//go:build e2e

// Package e2e walks a user's path on a real single-node Kubernetes cluster (hack/e2e.sh starts it,
// with PostgreSQL and Apache Kafka on the host): install the Helm chart, create a Secret and an
// OutboxRelay with 2 shards, write 10,000 events through the writer library, read them back with
// an independent consumer in per-aggregate order, operate the relay with the kubectl outbox
// plugin (status, a poison event retried, another skipped, a replay), reshard, delete a relay pod
// mid-stream, and delete the OutboxRelay.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

const (
	operatorNS = "outbox-system"
	appNS      = "shop"
	relayName  = "orders"
	topic      = "orders.events"
	// smallTopic refuses messages over 600 bytes until the test raises its limit: a poison event.
	smallTopic = "orders.small"
)

type env struct {
	c       client.Client
	dbURL   string
	brokers []string
	image   string
	helm    string
	plugin  string // the kubectl-outbox binary
	// The version users upgrade from: its chart directory and image.
	previousChart, previousImage string
}

func setup(t *testing.T) *env {
	t.Helper()
	e := &env{
		dbURL:   os.Getenv("E2E_DATABASE_URL"),
		brokers: strings.Split(os.Getenv("E2E_KAFKA_BROKERS"), ","),
		image:   os.Getenv("E2E_IMAGE"),
		helm:    os.Getenv("HELM"),
		plugin:  os.Getenv("E2E_PLUGIN"),

		previousChart: os.Getenv("E2E_PREVIOUS_CHART"),
		previousImage: os.Getenv("E2E_PREVIOUS_IMAGE"),
	}
	if e.dbURL == "" || e.image == "" || e.helm == "" || e.plugin == "" || e.previousChart == "" || e.previousImage == "" || os.Getenv("KUBECONFIG") == "" {
		t.Fatal("run through hack/e2e.sh (make test-e2e): E2E_DATABASE_URL, E2E_KAFKA_BROKERS, E2E_IMAGE, E2E_PLUGIN, E2E_PREVIOUS_CHART, E2E_PREVIOUS_IMAGE, HELM and KUBECONFIG must be set")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	if e.c, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	return e
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	return run(t, "bash", append([]string{"../../hack/cluster.sh", "kubectl"}, args...)...)
}

// kubectlOutput runs kubectl and returns its combined output and error, for commands expected
// to fail.
func kubectlOutput(args ...string) (string, error) {
	out, err := exec.Command("bash", append([]string{"../../hack/cluster.sh", "kubectl"}, args...)...).CombinedOutput()
	return string(out), err
}

// dumpOnFailure prints what a person debugging the failure would look at first.
func dumpOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, args := range [][]string{
			{"get", "pods,deployments,outboxrelays", "-A", "-o", "wide"},
			{"get", "events", "-A", "--sort-by=.lastTimestamp"},
			{"logs", "-n", operatorNS, "-l", "app.kubernetes.io/name=outbox-operator", "--tail=200"},
			{"logs", "-n", appNS, "-l", "app.kubernetes.io/name=outbox-relay", "--tail=100", "--prefix"},
			{"get", "outboxrelay", "-n", appNS, relayName, "-o", "yaml"},
		} {
			cmd := exec.Command("bash", append([]string{"../../hack/cluster.sh", "kubectl"}, args...)...)
			out, _ := cmd.CombinedOutput()
			t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
		}
	})
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(time.Second)
	}
	t.Fatalf("timed out after %s waiting for %s; last state: %s", timeout, what, last)
}

// consumer reads the topic from the beginning with franz-go, independently of the relay.
type consumer struct {
	mu     sync.Mutex
	cl     *kgo.Client
	seen   map[string]bool   // event_id
	replay map[string]string // event_id -> the outbox_replay header of its replayed copy
	byAgg  map[string][]int  // aggregate -> sequence numbers in arrival order (deduped)
	parts  map[string]int32  // aggregate -> partition
	dups   int
	errors []string
}

func newConsumer(t *testing.T, brokers []string, topic string) *consumer {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &consumer{cl: cl, seen: map[string]bool{}, replay: map[string]string{}, byAgg: map[string][]int{}, parts: map[string]int32{}}
}

func (c *consumer) poll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	fetches := c.cl.PollFetches(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	fetches.EachRecord(func(r *kgo.Record) {
		h := map[string]string{}
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		id := h["event_id"]
		if id == "" {
			c.errors = append(c.errors, fmt.Sprintf("record at %d/%d without event_id", r.Partition, r.Offset))
			return
		}
		if r, ok := h["outbox_replay"]; ok {
			c.replay[id] = r // a copy a replay asked for: no duplicate
			if c.seen[id] {
				return
			}
		}
		if c.seen[id] {
			c.dups++
			return
		}
		c.seen[id] = true
		agg := string(r.Key)
		if p, ok := c.parts[agg]; ok && p != r.Partition {
			c.errors = append(c.errors, fmt.Sprintf("aggregate %s on partitions %d and %d", agg, p, r.Partition))
		}
		c.parts[agg] = r.Partition
		var body struct {
			Seq int `json:"seq"`
		}
		if err := json.Unmarshal(r.Value, &body); err != nil {
			c.errors = append(c.errors, fmt.Sprintf("payload %q: %v", r.Value, err))
			return
		}
		c.byAgg[agg] = append(c.byAgg[agg], body.Seq)
	})
}

func (c *consumer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// waitAll waits until every event written (perAgg: each aggregate's count) arrived, checks their
// order and returns how many there are.
func (c *consumer) waitAll(t *testing.T, ctx context.Context, perAgg map[string]int) int {
	t.Helper()
	total := 0
	for _, n := range perAgg {
		total += n
	}
	eventually(t, 4*time.Minute, fmt.Sprintf("all %d events at the consumer", total), func() (bool, string) {
		c.poll(ctx)
		return c.count() >= total, fmt.Sprintf("%d received", c.count())
	})
	c.check(t, perAgg)
	return total
}

// check verifies per-aggregate order: every aggregate's sequence numbers arrive as 0, 1, 2, ...
func (c *consumer) check(t *testing.T, perAgg map[string]int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.errors {
		t.Error(e)
	}
	aggs := make([]string, 0, len(perAgg))
	for a := range perAgg {
		aggs = append(aggs, a)
	}
	sort.Strings(aggs)
	for _, a := range aggs {
		got := c.byAgg[a]
		if len(got) != perAgg[a] {
			t.Errorf("aggregate %s: %d events arrived, %d written", a, len(got), perAgg[a])
			continue
		}
		for i, s := range got {
			if s != i {
				t.Errorf("aggregate %s: event %d arrived at position %d (order broken: %v)", a, s, i, got)
				break
			}
		}
	}
}

// writer appends events through the writer library, one transaction per batch.
type writer struct {
	pool *pgxpool.Pool
	w    *outbox.Writer
	next map[string]int
}

func (w *writer) write(t *testing.T, ctx context.Context, n, aggregates int) {
	t.Helper()
	const perTx = 50
	for done := 0; done < n; done += perTx {
		tx, err := w.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		evs := make([]outbox.Event, 0, perTx)
		for i := done; i < done+perTx && i < n; i++ {
			agg := "order-" + strconv.Itoa(i%aggregates)
			seq := w.next[agg]
			w.next[agg]++
			evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: agg, EventType: "OrderUpdated",
				Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, seq)), Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}})
		}
		if _, err := w.w.AppendBatch(ctx, tx, evs); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func relayPods(t *testing.T, e *env, ctx context.Context) []corev1.Pod {
	var pods corev1.PodList
	if err := e.c.List(ctx, &pods, client.InNamespace(appNS), client.MatchingLabels{"app.kubernetes.io/name": "outbox-relay"}); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

func readyRelayPods(pods []corev1.Pod) int {
	n := 0
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n
}

func TestUserPath(t *testing.T) {
	e := setup(t)
	dumpOnFailure(t)
	ctx := context.Background()
	repo, tag, _ := strings.Cut(e.image, ":")
	prevRepo, prevTag, _ := strings.Cut(e.previousImage, ":")

	// 1. helm install of the previous version: the user path starts from it and upgrades to
	// this one (step 3b).
	start := time.Now()
	run(t, e.helm, "install", "outbox", e.previousChart, "--namespace", operatorNS, "--create-namespace",
		"--set", "image.repository="+prevRepo, "--set", "image.tag="+prevTag, "--set", "image.pullPolicy=Never",
		"--set", "lagPollInterval=2s", "--wait", "--timeout", "3m")
	t.Cleanup(func() { _ = exec.Command(e.helm, "uninstall", "outbox", "--namespace", operatorNS).Run() })
	t.Logf("helm install of the previous version: operator ready in %s", time.Since(start).Round(time.Second))

	// 2. The user's Secret and OutboxRelay, as YAML through kubectl.
	kubectl(t, "create", "namespace", appNS)
	kubectl(t, "create", "secret", "generic", "shop-db", "-n", appNS, "--from-literal=url="+e.dbURL)
	manifest := fmt.Sprintf(`apiVersion: outbox.dev/v1alpha1
kind: OutboxRelay
metadata:
  name: %s
  namespace: %s
spec:
  database:
    secretRef: {name: shop-db, key: url}
  kafka:
    brokers: [%q]
  topics:
    order: %s
    small: %s
  shards: 2
  publish: {pollInterval: 1s}
  relay:
    imagePullPolicy: Never
`, relayName, appNS, e.brokers[0], topic, smallTopic)
	f := t.TempDir() + "/relay.yaml"
	if err := os.WriteFile(f, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "apply", "-f", f)

	eventually(t, 4*time.Minute, "2 relay pods Running and Ready", func() (bool, string) {
		pods := relayPods(t, e, ctx)
		return readyRelayPods(pods) == 2, fmt.Sprintf("%d pods, %d ready", len(pods), readyRelayPods(pods))
	})
	kubectl(t, "wait", "--for=condition=Ready", "outboxrelay/"+relayName, "-n", appNS, "--timeout=3m")

	// 3. An application writes 10,000 events through the writer library.
	pool, err := pgxpool.New(ctx, e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ow, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	w := &writer{pool: pool, w: ow, next: map[string]int{}}
	cons := newConsumer(t, e.brokers, topic)
	start = time.Now()
	w.write(t, ctx, 5000, 500)
	eventually(t, 3*time.Minute, "5,000 events at the consumer", func() (bool, string) {
		cons.poll(ctx)
		return cons.count() >= 5000, fmt.Sprintf("%d received", cons.count())
	})
	t.Logf("5,000 events written and consumed by the previous version in %s", time.Since(start).Round(time.Millisecond))

	// 3b. helm upgrade to this version while the application writes: the CRD, the operator and
	// then every relay Deployment move to the new version, the schema migrates to the latest
	// version, and nothing written meanwhile is lost or reordered.
	upgraded := make(chan error, 1)
	start = time.Now()
	go func() {
		out, err := exec.Command(e.helm, "upgrade", "outbox", "../../charts/outbox-operator", "--namespace", operatorNS,
			"--set", "image.repository="+repo, "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never",
			"--set", "lagPollInterval=2s", "--wait", "--timeout", "3m").CombinedOutput()
		if err != nil {
			err = fmt.Errorf("helm upgrade: %w\n%s", err, out)
		}
		upgraded <- err
	}()
	var upgradeErr error
	writing := true
	for writing {
		w.write(t, ctx, 500, 500) // about 10,000 events a second
		select {
		case upgradeErr = <-upgraded:
			writing = false
		case <-time.After(50 * time.Millisecond):
		}
	}
	if upgradeErr != nil {
		t.Fatal(upgradeErr)
	}
	t.Logf("helm upgrade: the new operator ready in %s, the application writing throughout", time.Since(start).Round(time.Second))
	eventually(t, 4*time.Minute, "the relay Deployments on the new image, 2 pods ready, the schema at the latest version", func() (bool, string) {
		var deps appsv1.DeploymentList
		if err := e.c.List(ctx, &deps, client.InNamespace(appNS)); err != nil {
			return false, err.Error()
		}
		var images []string
		for _, d := range deps.Items {
			images = append(images, d.Spec.Template.Spec.Containers[0].Image)
			if d.Spec.Template.Spec.Containers[0].Image != e.image || d.Status.UpdatedReplicas != 1 || d.Status.ReadyReplicas != 1 {
				return false, fmt.Sprintf("Deployment %s: image %s, %d updated, %d ready", d.Name, d.Spec.Template.Spec.Containers[0].Image, d.Status.UpdatedReplicas, d.Status.ReadyReplicas)
			}
		}
		var r v1alpha1.OutboxRelay
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: appNS, Name: relayName}, &r); err != nil {
			return false, err.Error()
		}
		if r.Status.SchemaVersion != outboxdb.LatestVersion() {
			return false, fmt.Sprintf("schema version %d, want %d", r.Status.SchemaVersion, outboxdb.LatestVersion())
		}
		return len(deps.Items) == 2 && readyRelayPods(relayPods(t, e, ctx)) == 2, fmt.Sprintf("images %v", images)
	})
	w.write(t, ctx, 2000, 500)
	total := cons.waitAll(t, ctx, w.next)
	t.Logf("upgraded under load: %d events in order per aggregate, %d duplicates (relays restarted by the rollout)", total, cons.dups)

	// 3c. Snapshot tracking is this version's default, Row the previous one's. The OutboxRelay
	// created under the previous version keeps Row: status says so, and the database (not the
	// relays) shows it, every event published marked sent and no cursor row. A new OutboxRelay,
	// created now on another table, gets Snapshot: a cursor row per its buckets, no event marked
	// sent, and its events at an independent consumer in order.
	eventually(t, 2*time.Minute, "the upgraded relay on Row tracking, every event marked sent, no cursor row", func() (bool, string) {
		var r v1alpha1.OutboxRelay
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: appNS, Name: relayName}, &r); err != nil {
			return false, err.Error()
		}
		var unsent, cursor int64
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM public.outbox WHERE sent_at IS NULL), (SELECT count(*) FROM public.outbox_relay_cursor)`).Scan(&unsent, &cursor); err != nil {
			return false, err.Error()
		}
		return r.Spec.Publish.Tracking == v1alpha1.TrackRow && r.Status.Tracking == v1alpha1.TrackRow && unsent == 0 && cursor == 0,
			fmt.Sprintf("spec %q, status %q, %d unsent, %d cursor rows", r.Spec.Publish.Tracking, r.Status.Tracking, unsent, cursor)
	})
	newTrackingDefault(t, e, ctx, pool)

	// 4. Ready, and the lag in status returns to 0.
	kubectl(t, "wait", "--for=condition=Ready", "outboxrelay/"+relayName, "-n", appNS, "--timeout=2m")
	eventually(t, 2*time.Minute, "status.pendingEvents == 0 and lagSeconds == 0", func() (bool, string) {
		var r v1alpha1.OutboxRelay
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: appNS, Name: relayName}, &r); err != nil {
			return false, err.Error()
		}
		p, l := r.Status.PendingEvents, r.Status.LagSeconds
		return p != nil && *p == 0 && l != nil && *l == 0, fmt.Sprintf("pending=%v lag=%v", ptrStr(p), ptrStr(l))
	})

	// 4b. Operate the relay with the built kubectl outbox plugin.
	start = time.Now()
	extra := operatePlugin(t, e, ctx, pool, ow, cons)
	t.Logf("kubectl outbox: status, retry, skip, events, published and replay in %s", time.Since(start).Round(time.Millisecond))

	// 5. Three shards through the scale subresource, as an HPA would: the new shard's pod starts
	// and stands by, the layout switches in PostgreSQL, and events written meanwhile arrive in order.
	kubectl(t, "scale", "outboxrelay/"+relayName, "-n", appNS, "--replicas=3")
	w.write(t, ctx, 3000, 500)
	waitResharded(t, e, ctx, 2, 3)
	eventually(t, 4*time.Minute, "3 relay Deployments with ready pods", func() (bool, string) {
		var deps appsv1.DeploymentList
		if err := e.c.List(ctx, &deps, client.InNamespace(appNS)); err != nil {
			return false, err.Error()
		}
		pods := relayPods(t, e, ctx)
		return len(deps.Items) == 3 && readyRelayPods(pods) == 3, fmt.Sprintf("%d deployments, %d ready pods", len(deps.Items), readyRelayPods(pods))
	})

	// 6. Delete a relay pod mid-stream: nothing is lost.
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(500 * time.Millisecond)
		pods := relayPods(t, e, ctx)
		if len(pods) > 0 {
			_ = e.c.Delete(ctx, &pods[0])
		}
	}()
	w.write(t, ctx, 5000, 500)
	<-done
	total = cons.waitAll(t, ctx, w.next)
	t.Logf("%d events in order per aggregate; %d duplicates (from the pod deletion window)", total, cons.dups)
	kubectl(t, "wait", "--for=condition=Ready", "outboxrelay/"+relayName, "-n", appNS, "--timeout=3m")

	// 6b. Back to two shards under load: the surplus Deployment goes after the switch.
	kubectl(t, "scale", "outboxrelay/"+relayName, "-n", appNS, "--replicas=2")
	w.write(t, ctx, 2000, 500)
	waitResharded(t, e, ctx, 3, 2)
	cons.waitAll(t, ctx, w.next)

	// 6c. A HorizontalPodAutoscaler drives the shards through the scale subresource (with no
	// metrics adapter here, its minReplicas is what moves it), and goes through the same safe path.
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: relayName, Namespace: appNS},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "OutboxRelay", Name: relayName},
			MinReplicas:    ptr.To[int32](3),
			MaxReplicas:    3,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ExternalMetricSourceType, External: &autoscalingv2.ExternalMetricSource{
				Metric: autoscalingv2.MetricIdentifier{Name: "outbox_lag_seconds"},
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.ValueMetricType, Value: resource.NewQuantity(30, resource.DecimalSI)},
			}}},
		},
	}
	if err := e.c.Create(ctx, hpa); err != nil {
		t.Fatal(err)
	}
	waitResharded(t, e, ctx, 2, 3)

	// 6d. The built-in autoscaler and the HPA must not fight: with spec.autoscaling set, the API
	// refuses the HPA's write, and the HPA reports why.
	kubectl(t, "patch", "outboxrelay", relayName, "-n", appNS, "--type=merge", "-p", `{"spec":{"autoscaling":{"minShards":1,"maxShards":3}}}`)
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(hpa), hpa); err != nil {
		t.Fatal(err)
	}
	hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas = ptr.To[int32](2), 2
	if err := e.c.Update(ctx, hpa); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the HPA's write refused by the API", func() (bool, string) {
		var evs corev1.EventList
		if err := e.c.List(ctx, &evs, client.InNamespace(appNS)); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Kind == "HorizontalPodAutoscaler" && ev.Reason == "FailedRescale" &&
				strings.Contains(ev.Message, "spec.shards cannot change while spec.autoscaling is set") {
				return true, ""
			}
			if ev.InvolvedObject.Kind == "HorizontalPodAutoscaler" {
				seen = append(seen, ev.Reason+": "+ev.Message)
			}
		}
		return false, fmt.Sprintf("HPA events: %q", seen)
	})
	var obr v1alpha1.OutboxRelay
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: appNS, Name: relayName}, &obr); err != nil || obr.Spec.Shards != 3 || obr.Status.Shards != 3 {
		t.Fatalf("after the refused HPA write: spec.shards %d, status.shards %d (%v)", obr.Spec.Shards, obr.Status.Shards, err)
	}
	if err := e.c.Delete(ctx, hpa); err != nil {
		t.Fatal(err)
	}

	// 6e. Switch to snapshot tracking while the application writes: the relays roll over, nothing
	// is lost or reordered (the consumer), the cursor is in the database, pending returns to 0 in
	// status (measured by snapshot), and the API refuses to go back.
	kubectl(t, "patch", "outboxrelay", relayName, "-n", appNS, "--type=merge", "-p", `{"spec":{"publish":{"tracking":"Snapshot"}}}`)
	w.write(t, ctx, 3000, 500)
	total = cons.waitAll(t, ctx, w.next)
	eventually(t, 2*time.Minute, "cursor rows for every bucket and nothing pending", func() (bool, string) {
		var buckets, pending int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(sum(cardinality(buckets)), 0), public.outbox_pending() FROM public.outbox_relay_cursor`).Scan(&buckets, &pending); err != nil {
			return false, err.Error()
		}
		return buckets == 256 && pending == 0, fmt.Sprintf("cursor covers %d buckets, %d pending", buckets, pending)
	})
	eventually(t, 2*time.Minute, "status.pendingEvents == 0 under snapshot tracking", func() (bool, string) {
		var r v1alpha1.OutboxRelay
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: appNS, Name: relayName}, &r); err != nil {
			return false, err.Error()
		}
		p := r.Status.PendingEvents
		return p != nil && *p == 0, fmt.Sprintf("pending=%v", ptrStr(p))
	})
	waitNoPendingIndex(t, ctx, pool, "public.outbox")
	if out, err := kubectlOutput("patch", "outboxrelay", relayName, "-n", appNS, "--type=merge", "-p", `{"spec":{"publish":{"tracking":"Row"}}}`); err == nil ||
		!strings.Contains(out, "cannot go back from Snapshot to Row") {
		t.Fatalf("switching back to Row: %v %s", err, out)
	}
	t.Logf("switched to snapshot tracking under load: %d events in order per aggregate", total)

	// 7. Delete the OutboxRelay: its Deployments go, the database rows stay.
	kubectl(t, "delete", "outboxrelay", relayName, "-n", appNS, "--wait=true", "--timeout=2m")
	eventually(t, 2*time.Minute, "relay Deployments garbage-collected", func() (bool, string) {
		var deps appsv1.DeploymentList
		if err := e.c.List(ctx, &deps, client.InNamespace(appNS)); err != nil {
			return false, err.Error()
		}
		return len(deps.Items) == 0, fmt.Sprintf("%d deployments left", len(deps.Items))
	})
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM public.outbox").Scan(&rows); err != nil || rows != total+extra {
		t.Fatalf("outbox rows after deleting the OutboxRelay: %d (err %v), want %d", rows, err, total+extra)
	}
}

// newTrackingDefault creates an OutboxRelay that leaves spec.publish.tracking unset, on a table
// of its own (public.payments) in its own namespace, and checks that it runs Snapshot tracking:
// status.tracking, the table's cursor rows and no event marked sent (the database), and every
// event at an independent consumer in order per aggregate. It deletes the OutboxRelay after.
func newTrackingDefault(t *testing.T, e *env, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	const ns, name, table, payTopic = "payments", "payments", "payments", "payments.events"
	kubectl(t, "create", "namespace", ns)
	kubectl(t, "create", "secret", "generic", "shop-db", "-n", ns, "--from-literal=url="+e.dbURL)
	manifest := fmt.Sprintf(`apiVersion: outbox.dev/v1alpha1
kind: OutboxRelay
metadata:
  name: %s
  namespace: %s
spec:
  database:
    secretRef: {name: shop-db, key: url}
    table: %s
  kafka:
    brokers: [%q]
  topics:
    order: %s
  publish: {pollInterval: 1s}
  relay:
    imagePullPolicy: Never
`, name, ns, table, e.brokers[0], payTopic)
	f := t.TempDir() + "/payments.yaml"
	if err := os.WriteFile(f, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "apply", "-f", f)
	kubectl(t, "wait", "--for=condition=Ready", "outboxrelay/"+name, "-n", ns, "--timeout=3m")
	ow, err := outbox.New("public." + table)
	if err != nil {
		t.Fatal(err)
	}
	w := &writer{pool: pool, w: ow, next: map[string]int{}}
	cons := newConsumer(t, e.brokers, payTopic)
	w.write(t, ctx, 2000, 100)
	total := cons.waitAll(t, ctx, w.next)
	var r v1alpha1.OutboxRelay
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &r); err != nil {
		t.Fatal(err)
	}
	var buckets, sent int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT coalesce(sum(cardinality(buckets)), 0) FROM public.payments_relay_cursor),
  (SELECT count(*) FROM public.payments WHERE sent_at IS NOT NULL)`).Scan(&buckets, &sent); err != nil {
		t.Fatal(err)
	}
	if r.Spec.Publish.Tracking != "" || r.Status.Tracking != v1alpha1.TrackSnapshot || buckets != 256 || sent != 0 {
		t.Fatalf("a new OutboxRelay without spec.publish.tracking: spec %q, status %q, cursor covers %d buckets, %d events marked sent; want Snapshot",
			r.Spec.Publish.Tracking, r.Status.Tracking, buckets, sent)
	}
	// The operator drops row tracking's pending index; the relays go on without it.
	waitNoPendingIndex(t, ctx, pool, "public."+table)
	w.write(t, ctx, 500, 100)
	total = cons.waitAll(t, ctx, w.next)
	kubectl(t, "delete", "namespace", ns, "--wait=true", "--timeout=2m")
	t.Logf("a new OutboxRelay without spec.publish.tracking runs Snapshot: %d events in order per aggregate, a cursor over 256 buckets, none marked sent, no pending index", total)
}

// waitNoPendingIndex waits until the catalog has no pending index for table (the operator drops it
// under snapshot tracking, outboxdb/indexes.go).
func waitNoPendingIndex(t *testing.T, ctx context.Context, pool *pgxpool.Pool, table string) {
	t.Helper()
	eventually(t, 3*time.Minute, table+" without its pending index", func() (bool, string) {
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table+"_pending_idx").Scan(&exists); err != nil {
			return false, err.Error()
		}
		return !exists, "the pending index is still there"
	})
}

// waitResharded waits until the OutboxRelay reports the change of layout from one shard count to
// another with its publishing pause.
func waitResharded(t *testing.T, e *env, ctx context.Context, from, to int32) {
	t.Helper()
	var pause int64
	eventually(t, 4*time.Minute, fmt.Sprintf("resharded %d -> %d", from, to), func() (bool, string) {
		var r v1alpha1.OutboxRelay
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: appNS, Name: relayName}, &r); err != nil {
			return false, err.Error()
		}
		lr := r.Status.LastReshard
		if r.Status.Shards != to || lr == nil || lr.FromShards != from || lr.ToShards != to || lr.PauseMilliseconds == nil {
			return false, fmt.Sprintf("shards %d, last reshard %+v", r.Status.Shards, lr)
		}
		pause = *lr.PauseMilliseconds
		return true, ""
	})
	t.Logf("resharded %d -> %d: publishing paused %d ms", from, to, pause)
}

func ptrStr(p *int64) string {
	if p == nil {
		return "nil"
	}
	return strconv.FormatInt(*p, 10)
}
