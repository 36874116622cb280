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
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/test/envtestutil"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// countingTracer counts the statements a pgx connection sends.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// countingReader counts the reads that reach the API server through the uncached reader.
type countingReader struct {
	client.Reader
	gets atomic.Int64
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets.Add(1)
	return c.Reader.Get(ctx, key, obj, opts...)
}

// TestReconcileCost measures what the operator's passes cost at steady state with many
// OutboxRelays on one database (50 by default, OUTBOX_RECONCILE_COST_RELAYS): its CPU, the
// statements it sends PostgreSQL and its uncached Secret reads, per minute, with the reconciler's
// production intervals. A measurement for the record, not a target (performance targets live in
// make bench): it runs only with OUTBOX_RECONCILE_COST=1, for about four minutes.
//
//	OUTBOX_RECONCILE_COST=1 hack/test.sh ./controllers -run TestReconcileCost -v
func TestReconcileCost(t *testing.T) {
	if os.Getenv("OUTBOX_RECONCILE_COST") == "" {
		t.Skip("a measurement: set OUTBOX_RECONCILE_COST=1 to run it")
	}
	relays := 50
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_RECONCILE_COST_RELAYS")); err == nil && v > 0 {
		relays = v
	}
	window := 2 * time.Minute
	env := envtestutil.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ns := env.CreateNamespace(t, "cost")

	statements := &countingTracer{}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	reader := &countingReader{Reader: mgr.GetAPIReader()}
	r := &OutboxRelayReconciler{RelayImage: testImage, APIReader: reader,
		OpenDB: func(ctx context.Context, url string) (*sql.DB, error) {
			cfg, err := pgx.ParseConfig(url)
			if err != nil {
				return nil, err
			}
			cfg.Tracer = statements
			return stdlib.OpenDB(*cfg), nil
		}}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(mctx) }()
	t.Cleanup(func() { stop(); <-done })

	url := pgtest.NewDatabase(t)
	c := env.Client
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shop-db"}, StringData: map[string]string{"url": url}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kafka-user"}, StringData: map[string]string{"username": "relay", "password": "s3cret"}},
	} {
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for i := range relays {
		relay := newRelay(ns, fmt.Sprintf("r%02d", i), "shop-db", func(r *v1alpha1.OutboxRelay) {
			r.Spec.Database.Table = fmt.Sprintf("events_%02d", i)
			r.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: v1alpha1.SASLScramSHA256,
				SecretRef: v1alpha1.SASLSecretRef{Name: "kafka-user"}, Plaintext: v1alpha1.SASLPlaintextAllowed}
		})
		if err := c.Create(ctx, relay); err != nil {
			t.Fatal(err)
		}
	}
	// Steady state: every OutboxRelay Ready, its Deployment marked available as a kubelet would.
	available := map[string]bool{}
	for deadline := time.Now().Add(5 * time.Minute); len(available) < relays; time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d OutboxRelays ready after 5 minutes", len(available), relays)
		}
		var list appsv1.DeploymentList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for i := range list.Items {
			d := &list.Items[i]
			if d.Status.AvailableReplicas == 1 {
				continue
			}
			d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1,
				Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue,
					Reason: "MinimumReplicasAvailable", LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}}}
			_ = c.Status().Update(ctx, d)
		}
		var rl v1alpha1.OutboxRelayList
		if err := c.List(ctx, &rl, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for _, o := range rl.Items {
			if meta.IsStatusConditionTrue(o.Status.Conditions, v1alpha1.ConditionReady) {
				available[o.Name] = true
			}
		}
	}
	time.Sleep(30 * time.Second) // let the passes of the start settle into their cadence

	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	cpu0, st0, get0 := cpu(), statements.n.Load(), reader.gets.Load()
	time.Sleep(window)
	perMin := func(n int64) float64 { return float64(n) / window.Minutes() }
	cpuUsed := cpu() - cpu0
	t.Logf("%d OutboxRelays at steady state, over %s: operator CPU %.2f s/min (%.2f%% of a core), %.0f statements/min to PostgreSQL, %.0f uncached reads (Secrets)/min",
		relays, window, cpuUsed.Seconds()/window.Minutes(), 100*cpuUsed.Seconds()/window.Seconds(),
		perMin(statements.n.Load()-st0), perMin(reader.gets.Load()-get0))
}
