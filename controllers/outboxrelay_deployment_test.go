package controllers

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	relaypkg "github.com/outbox-operator/outbox-operator/relay"
	"github.com/outbox-operator/outbox-operator/test/envtestutil"
)

// testRelay returns an OutboxRelay as the API server would store it, with defaults filled in.
func testRelay(mutate ...func(*v1alpha1.OutboxRelay)) *v1alpha1.OutboxRelay {
	r := &v1alpha1.OutboxRelay{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: "shop", UID: types.UID("uid-1"), Generation: 3},
		Spec: v1alpha1.OutboxRelaySpec{
			Database: v1alpha1.DatabaseSpec{SecretRef: v1alpha1.DatabaseSecretRef{Name: "shop-db", Key: "url"}, Table: "outbox"},
			Kafka:    v1alpha1.KafkaSpec{Brokers: []v1alpha1.Broker{"kafka-0:9092", "kafka-1:9092"}},
			Topics:   map[string]v1alpha1.TopicName{"user": "users.events", "order": "orders.events"},
			Shards:   4,
			Publish: v1alpha1.PublishSpec{BatchSize: 500, PollInterval: &metav1.Duration{Duration: 5 * time.Second},
				Notify: ptr.To(true), MaxAttempts: 10},
			PoisonEvents: v1alpha1.PoisonEventsSpec{Policy: v1alpha1.PoisonBlock},
			Partitions:   v1alpha1.PartitionsSpec{PremakeDays: ptr.To[int32](3), Retention: &metav1.Duration{Duration: 168 * time.Hour}},
			LagTarget:    60,
		},
		// spec.publish.tracking unset, resolved for a new table (resolveTracking).
		Status: v1alpha1.OutboxRelayStatus{Tracking: v1alpha1.TrackSnapshot},
	}
	for _, m := range mutate {
		m(r)
	}
	return r
}

// build renders the apply configuration into a typed Deployment, as the API server would read it.
func build(t *testing.T, relay *v1alpha1.OutboxRelay, shard int32, hash string) *appsv1.Deployment {
	t.Helper()
	ac := relayDeployment(relay, shard, hash, relayDefaults{image: "ghcr.io/outbox-operator/relay:v1"})
	data, err := json.Marshal(ac)
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

func envByName(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

func TestRelayDeploymentArgs(t *testing.T) {
	tests := map[string]struct {
		mutate  func(*v1alpha1.OutboxRelay)
		shard   int32
		want    []string
		without []string
	}{
		"defaults, shard 2 of 4": {
			shard: 2,
			want: []string{"run", "--table=public.outbox", "--shard-count=0", "--shard-index=2",
				"--brokers=kafka-0:9092,kafka-1:9092", "--topic-map=order=orders.events,user=users.events",
				"--batch-size=500", "--poll-interval=5s", "--notify=true", "--max-attempts=10",
				"--poison-policy=block", "--http-addr=:8080", "--tracking=snapshot"},
			without: []string{"--default-topic", "--dead-letter-topic", "--kafka-tls", "--kafka-sasl-mechanism", "--max-payload-bytes", "--tracking=row"},
		},
		"snapshot tracking": {
			mutate: func(r *v1alpha1.OutboxRelay) { r.Spec.Publish.Tracking, r.Status.Tracking = v1alpha1.TrackSnapshot, "" },
			want:   []string{"--batch-size=500", "--tracking=snapshot", "--poll-interval=5s"},
		},
		"row tracking": {
			mutate: func(r *v1alpha1.OutboxRelay) {
				r.Spec.Publish.Tracking, r.Status.Tracking = v1alpha1.TrackRow, v1alpha1.TrackRow
			},
			want: []string{"--batch-size=500", "--tracking=row", "--poll-interval=5s"},
		},
		"row asked, snapshot recorded: snapshot": {
			mutate: func(r *v1alpha1.OutboxRelay) { r.Spec.Publish.Tracking = v1alpha1.TrackRow },
			want:   []string{"--tracking=snapshot"},
		},
		"schema-qualified table, default topic, dead letter": {
			mutate: func(r *v1alpha1.OutboxRelay) {
				r.Spec.Database.Table = "shop.events"
				r.Spec.DefaultTopic = "all.events"
				r.Spec.PoisonEvents = v1alpha1.PoisonEventsSpec{Policy: v1alpha1.PoisonDeadLetter, DeadLetterTopic: "outbox.dlq"}
				r.Spec.Publish.Notify = ptr.To(false)
				r.Spec.Publish.MaxPayloadBytes = ptr.To[int32](2048)
				r.Spec.Publish.PollInterval = &metav1.Duration{Duration: 250 * time.Millisecond}
			},
			want: []string{"--table=shop.events", "--default-topic=all.events", "--poison-policy=dead-letter",
				"--dead-letter-topic=outbox.dlq", "--notify=false", "--max-payload-bytes=2048", "--poll-interval=250ms"},
		},
		"tls with client certificate and sasl": {
			mutate: func(r *v1alpha1.OutboxRelay) {
				r.Spec.Kafka.TLS = &v1alpha1.KafkaTLS{Enabled: true,
					CASecretRef:   &v1alpha1.SecretKeyRef{Name: "kafka-ca"},
					CertSecretRef: &v1alpha1.SecretKeyRef{Name: "client", Key: "cert.pem"},
					KeySecretRef:  &v1alpha1.SecretKeyRef{Name: "client", Key: "key.pem"}}
				r.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: v1alpha1.SASLScramSHA512,
					SecretRef: v1alpha1.SASLSecretRef{Name: "kafka-user", UsernameKey: "username", PasswordKey: "password"}}
			},
			want: []string{"--kafka-tls=true", "--kafka-tls-ca-file=/etc/outbox/kafka-tls/ca.crt",
				"--kafka-tls-cert-file=/etc/outbox/kafka-tls/tls.crt", "--kafka-tls-key-file=/etc/outbox/kafka-tls/tls.key",
				"--kafka-sasl-mechanism=scram-sha-512"},
		},
		"tls disabled": {
			mutate: func(r *v1alpha1.OutboxRelay) {
				r.Spec.Kafka.TLS = &v1alpha1.KafkaTLS{Enabled: false, CASecretRef: &v1alpha1.SecretKeyRef{Name: "kafka-ca"}}
			},
			without: []string{"--kafka-tls"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			relay := testRelay()
			if tc.mutate != nil {
				tc.mutate(relay)
			}
			d := build(t, relay, tc.shard, "h")
			args := d.Spec.Template.Spec.Containers[0].Args
			for _, w := range tc.want {
				if !slices.Contains(args, w) {
					t.Errorf("args %q lack %q", args, w)
				}
			}
			for _, w := range tc.without {
				for _, a := range args {
					if strings.HasPrefix(a, w) {
						t.Errorf("args have %q", a)
					}
				}
			}
			// The URL and the SASL credentials are never arguments.
			for _, a := range args {
				if strings.Contains(a, "postgres") || strings.Contains(strings.ToLower(a), "password") {
					t.Errorf("secret-looking argument %q", a)
				}
			}
		})
	}
}

func TestRelayDeploymentEnvComesFromSecrets(t *testing.T) {
	relay := testRelay(func(r *v1alpha1.OutboxRelay) {
		r.Spec.Database.SecretRef = v1alpha1.DatabaseSecretRef{Name: "shop-db", Key: "dsn"}
		r.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: v1alpha1.SASLPlain, SecretRef: v1alpha1.SASLSecretRef{Name: "kafka-user"}}
		r.Spec.Kafka.TLS = &v1alpha1.KafkaTLS{Enabled: true, InsecureSkipVerify: true}
		r.Spec.Relay.Env = []corev1.EnvVar{
			{Name: "OUTBOX_LOG_FORMAT", Value: "text"},
			{Name: "OUTBOX_DATABASE_URL", Value: "postgres://smuggled"}, // refused by the CRD; dropped here too
			{Name: "OUTBOX_SHARD_INDEX", Value: "9"},
		}
	})
	env := envByName(build(t, relay, 0, "h").Spec.Template.Spec.Containers[0])
	checks := map[string][2]string{ // name -> secret, key
		"OUTBOX_DATABASE_URL":        {"shop-db", "dsn"},
		"OUTBOX_KAFKA_SASL_USERNAME": {"kafka-user", "username"},
		"OUTBOX_KAFKA_SASL_PASSWORD": {"kafka-user", "password"},
	}
	for name, want := range checks {
		e, ok := env[name]
		if !ok {
			t.Fatalf("env lacks %s", name)
		}
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Fatalf("%s is not only a secretKeyRef: %+v", name, e)
		}
		if got := [2]string{e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key}; got != want {
			t.Errorf("%s from %v, want %v", name, got, want)
		}
	}
	if env["OUTBOX_LOG_FORMAT"].Value != "text" {
		t.Errorf("user env OUTBOX_LOG_FORMAT lost")
	}
	if _, ok := env["OUTBOX_SHARD_INDEX"]; ok {
		t.Errorf("user env OUTBOX_SHARD_INDEX kept")
	}
	if env["OUTBOX_KAFKA_TLS_INSECURE_SKIP_VERIFY"].Value != "true" {
		t.Errorf("insecureSkipVerify not passed")
	}
	if n := len(build(t, relay, 0, "h").Spec.Template.Spec.Containers[0].Env); n != len(env) {
		t.Errorf("duplicate env names: %d entries, %d names", n, len(env))
	}
}

func TestRelayDeploymentShapeAndSecurity(t *testing.T) {
	relay := testRelay(func(r *v1alpha1.OutboxRelay) {
		r.Spec.Relay.PodLabels = map[string]string{"team": "shop", LabelShard: "99"}
		r.Spec.Relay.PodAnnotations = map[string]string{"a": "b", AnnotationSecretHash: "forged"}
		r.Spec.Relay.NodeSelector = map[string]string{"pool": "relays"}
		r.Spec.Relay.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
		r.Spec.Relay.ServiceAccountName = "relay-sa"
	})
	d := build(t, relay, 1, "abc123")

	if d.Name != "orders-shard-1" || d.Namespace != "shop" {
		t.Errorf("name %s/%s", d.Namespace, d.Name)
	}
	if *d.Spec.Replicas != 1 {
		t.Errorf("replicas %d", *d.Spec.Replicas)
	}
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("strategy %q, want Recreate", d.Spec.Strategy.Type)
	}
	// The pod's grace period covers the relay's own shutdown: the batch in flight and the round
	// trip that records it (relay.DefaultConfig's timeouts).
	relayCfg := relaypkg.DefaultConfig()
	budget := relayCfg.ShutdownTimeout + relayCfg.QueryTimeout
	if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= budget {
		t.Errorf("terminationGracePeriodSeconds %v, want more than the relay's shutdown budget %s", g, budget)
	}
	wantSel := map[string]string{LabelName: "outbox-relay", LabelInstance: "orders", LabelShard: "1"}
	if !mapsEqual(d.Spec.Selector.MatchLabels, wantSel) {
		t.Errorf("selector %v", d.Spec.Selector.MatchLabels)
	}
	for k, v := range wantSel {
		if d.Labels[k] != v || d.Spec.Template.Labels[k] != v {
			t.Errorf("label %s: deployment %q, pod %q, want %q", k, d.Labels[k], d.Spec.Template.Labels[k], v)
		}
	}
	if d.Spec.Template.Labels["team"] != "shop" {
		t.Errorf("pod label team lost")
	}
	if got := d.Spec.Template.Annotations[AnnotationSecretHash]; got != "abc123" {
		t.Errorf("secret hash annotation %q", got)
	}
	if d.Spec.Template.Annotations["a"] != "b" {
		t.Errorf("pod annotation lost")
	}

	if len(d.OwnerReferences) != 1 {
		t.Fatalf("owner references %v", d.OwnerReferences)
	}
	or := d.OwnerReferences[0]
	if or.APIVersion != "outbox.dev/v1alpha1" || or.Kind != "OutboxRelay" || or.Name != "orders" || or.UID != "uid-1" ||
		!ptr.Deref(or.Controller, false) || !ptr.Deref(or.BlockOwnerDeletion, false) {
		t.Errorf("owner reference %+v", or)
	}

	pod := d.Spec.Template.Spec
	if ptr.Deref(pod.AutomountServiceAccountToken, true) {
		t.Error("service account token mounted")
	}
	if pod.ServiceAccountName != "relay-sa" || pod.NodeSelector["pool"] != "relays" || len(pod.Tolerations) != 1 {
		t.Errorf("pod placement lost: %q %v %v", pod.ServiceAccountName, pod.NodeSelector, pod.Tolerations)
	}
	psc := pod.SecurityContext
	if psc == nil || !ptr.Deref(psc.RunAsNonRoot, false) || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v", psc)
	}
	c := pod.Containers[0]
	if c.Image != "ghcr.io/outbox-operator/relay:v1" || !slices.Equal(c.Command, []string{"/relay"}) {
		t.Errorf("image %q command %q", c.Image, c.Command)
	}
	sc := c.SecurityContext
	if sc == nil || !ptr.Deref(sc.RunAsNonRoot, false) || !ptr.Deref(sc.ReadOnlyRootFilesystem, false) ||
		ptr.Deref(sc.AllowPrivilegeEscalation, true) || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container security context %+v", sc)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != 8080 {
		t.Errorf("ports %+v", c.Ports)
	}
	for name, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name || p.HTTPGet.Port.StrVal != "http" {
			t.Errorf("probe %s: %+v", name, p)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("no default resource requests: %+v", c.Resources)
	}
}

func TestRelayDeploymentPausedAndImage(t *testing.T) {
	relay := testRelay(func(r *v1alpha1.OutboxRelay) {
		r.Spec.Paused = true
		r.Spec.Relay.Image = "registry.example/relay:pinned"
		r.Spec.Relay.ImagePullPolicy = corev1.PullAlways
	})
	d := build(t, relay, 0, "h")
	if *d.Spec.Replicas != 0 {
		t.Errorf("paused relay has %d replicas", *d.Spec.Replicas)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "registry.example/relay:pinned" || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image %q policy %q", c.Image, c.ImagePullPolicy)
	}
}

func TestRelayDeploymentTLSVolume(t *testing.T) {
	relay := testRelay(func(r *v1alpha1.OutboxRelay) {
		r.Spec.Kafka.TLS = &v1alpha1.KafkaTLS{Enabled: true,
			CASecretRef:   &v1alpha1.SecretKeyRef{Name: "kafka-ca"},
			CertSecretRef: &v1alpha1.SecretKeyRef{Name: "client"},
			KeySecretRef:  &v1alpha1.SecretKeyRef{Name: "client"}}
	})
	pod := build(t, relay, 0, "h").Spec.Template.Spec
	var vol *corev1.Volume
	for i := range pod.Volumes {
		if pod.Volumes[i].Name == tlsVolumeName {
			vol = &pod.Volumes[i]
		}
	}
	if vol == nil || vol.Projected == nil || len(vol.Projected.Sources) != 3 {
		t.Fatalf("tls volume %+v", vol)
	}
	got := map[string]string{}
	for _, s := range vol.Projected.Sources {
		got[s.Secret.Items[0].Path] = s.Secret.Name + "/" + s.Secret.Items[0].Key
	}
	want := map[string]string{"ca.crt": "kafka-ca/ca.crt", "tls.crt": "client/tls.crt", "tls.key": "client/tls.key"}
	if !mapsEqual(got, want) {
		t.Errorf("tls files %v, want %v", got, want)
	}
	mounted := false
	for _, m := range pod.Containers[0].VolumeMounts {
		if m.Name == tlsVolumeName && m.MountPath == tlsMountPath && m.ReadOnly {
			mounted = true
		}
	}
	if !mounted {
		t.Error("tls volume not mounted read-only")
	}
}

func TestSecretHash(t *testing.T) {
	a := map[string][]byte{"db/url": []byte("postgres://a"), "kafka/password": []byte("p")}
	same := map[string][]byte{"kafka/password": []byte("p"), "db/url": []byte("postgres://a")}
	changed := map[string][]byte{"db/url": []byte("postgres://b"), "kafka/password": []byte("p")}
	// Moving bytes between key and value must change the hash.
	shifted := map[string][]byte{"db/urlp": []byte("ostgres://a"), "kafka/password": []byte("p")}
	h := secretHash(a)
	if len(h) != 32 {
		t.Fatalf("hash %q", h)
	}
	if secretHash(same) != h {
		t.Error("hash depends on map order")
	}
	if secretHash(changed) == h || secretHash(shifted) == h || secretHash(nil) == h {
		t.Error("different secrets, same hash")
	}
	if strings.Contains(h, "postgres") {
		t.Error("hash leaks the value")
	}
}

func TestShardMaths(t *testing.T) {
	dep := func(name, shard string, owner string) appsv1.Deployment {
		d := appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
		if shard != "" {
			d.Labels[LabelShard] = shard
		}
		return d
	}
	deps := []appsv1.Deployment{
		dep("r-shard-3", "3", ""), dep("r-shard-0", "0", ""), dep("r-shard-1", "1", ""),
		dep("r-shard-2", "2", ""), dep("odd", "x", ""), dep("nolabel", "", ""), dep("r-shard-300", "300", ""),
	}
	tests := []struct {
		shards int32
		want   []string
	}{
		{4, nil},
		{3, []string{"r-shard-3"}},
		{1, []string{"r-shard-1", "r-shard-2", "r-shard-3"}},
		{256, nil},
	}
	for _, tc := range tests {
		var got []string
		for _, d := range surplusShards(deps, tc.shards) {
			got = append(got, d.Name)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("surplus at %d shards = %v, want %v", tc.shards, got, tc.want)
		}
	}
	if DeploymentName("orders", 255) != "orders-shard-255" {
		t.Error(DeploymentName("orders", 255))
	}
	// The longest allowed relay name gives a Deployment name that is a DNS label.
	if n := len(DeploymentName(strings.Repeat("r", 53), 255)); n > 63 {
		t.Errorf("deployment name of %d characters", n)
	}
	if Selector("orders") != "app.kubernetes.io/name=outbox-relay,app.kubernetes.io/instance=orders" {
		t.Error(Selector("orders"))
	}
}

func TestDeploymentAvailable(t *testing.T) {
	tests := map[string]struct {
		gen, observed                int64
		replicas, updated, available int32
		want                         bool
	}{
		"available":                     {2, 2, 1, 1, 1, true},
		"old generation observed":       {3, 2, 1, 1, 1, false},
		"no available pod":              {2, 2, 1, 1, 0, false},
		"available pod of old template": {2, 2, 1, 0, 1, false},
		"scaled to zero":                {2, 2, 0, 0, 0, false},
	}
	for name, tc := range tests {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: tc.gen},
			Spec:   appsv1.DeploymentSpec{Replicas: ptr.To(tc.replicas)},
			Status: appsv1.DeploymentStatus{ObservedGeneration: tc.observed, UpdatedReplicas: tc.updated, AvailableReplicas: tc.available}}
		if got := deploymentAvailable(d); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
}

func TestSecretRefsOf(t *testing.T) {
	relay := testRelay(func(r *v1alpha1.OutboxRelay) {
		r.Spec.Kafka.TLS = &v1alpha1.KafkaTLS{Enabled: true, CASecretRef: &v1alpha1.SecretKeyRef{Name: "kafka-ca"},
			CertSecretRef: &v1alpha1.SecretKeyRef{Name: "client"}, KeySecretRef: &v1alpha1.SecretKeyRef{Name: "client"}}
		r.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: v1alpha1.SASLPlain, SecretRef: v1alpha1.SASLSecretRef{Name: "kafka-user"}}
	})
	if got, want := secretRefsOf(relay), []string{"client", "kafka-ca", "kafka-user", "shop-db"}; !slices.Equal(got, want) {
		t.Errorf("secretRefsOf = %v, want %v", got, want)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestEnsureDeploymentsAppliesOnlyChanges runs the Deployment step against the API server with a
// client that counts apply requests: an unchanged pass sends none, a Deployment changed by someone
// else is applied again (and put back), a spec change is applied to every shard.
func TestEnsureDeploymentsAppliesOnlyChanges(t *testing.T) {
	env := envtestutil.Shared(t)
	ctx := testCtx(t)
	ns := env.CreateNamespace(t, "apply")
	var applies atomic.Int32
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	c := interceptor.NewClient(wc, interceptor.Funcs{
		Apply: func(ctx context.Context, cl client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			applies.Add(1)
			return cl.Apply(ctx, obj, opts...)
		},
	})
	r := &OutboxRelayReconciler{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(100), RelayImage: "example.invalid/relay:1"}
	relay := testRelay(func(r *v1alpha1.OutboxRelay) { r.Namespace = ns; r.Spec.Shards = 2 })
	s := &scope{relay: relay, secretValues: map[string][]byte{"shop-db/url": []byte("postgres://x")}}
	pass := func(wantApplies int32) {
		t.Helper()
		s.before = relay.DeepCopy()
		if _, err := r.ensureDeployments(ctx, s); err != nil {
			t.Fatal(err)
		}
		if got := applies.Load(); got != wantApplies {
			t.Fatalf("%d apply requests so far, want %d", got, wantApplies)
		}
	}
	pass(2)
	pass(2) // nothing changed: no request
	pass(2)

	// Someone scales shard 0 by hand: the next pass applies it again and owns replicas back.
	d := &appsv1.Deployment{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "orders-shard-0"}, d); err != nil {
		t.Fatal(err)
	}
	before := d.DeepCopy()
	d.Spec.Replicas = ptr.To[int32](5)
	if err := env.Client.Patch(ctx, d, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	pass(3)
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "orders-shard-0"}, d); err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 1 {
		t.Errorf("replicas %d after the drift was corrected", *d.Spec.Replicas)
	}

	// A spec change reaches both shards.
	relay.Spec.Publish.BatchSize = 1000
	pass(5)
	pass(5)
}

// The operator's --relay-otlp-endpoint reaches the relays of an OutboxRelay without
// spec.publish.tracing; the spec's own endpoint wins over it.
func TestRelayOTLPEndpointDefault(t *testing.T) {
	args := func(r *v1alpha1.OutboxRelay) string {
		return strings.Join(relayArgs(r, 0, "http://default-collector:4317"), " ")
	}
	if a := args(testRelay()); !strings.Contains(a, "--otlp-endpoint=http://default-collector:4317") {
		t.Errorf("without spec.publish.tracing: %s", a)
	}
	own := testRelay(func(r *v1alpha1.OutboxRelay) {
		r.Spec.Publish.Tracing = &v1alpha1.TracingSpec{OTLPEndpoint: "https://own:4317"}
	})
	if a := args(own); !strings.Contains(a, "--otlp-endpoint=https://own:4317") || strings.Contains(a, "default-collector") {
		t.Errorf("with spec.publish.tracing: %s", a)
	}
	if a := strings.Join(relayArgs(testRelay(), 0, ""), " "); strings.Contains(a, "--otlp-endpoint") {
		t.Errorf("no default, no spec: %s", a)
	}
}
