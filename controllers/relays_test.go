package controllers

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/relay"
)

// follower is a real relay run in the test process the way a relay pod runs it: following the
// table's shard layout (--shard-count=0). envtest runs no pods, so these stand in for them and
// hold the locks the operator checks in PostgreSQL.
type follower struct {
	*relay.Relay
	cancel context.CancelFunc
	done   chan struct{}
}

// startFollowers runs relays for shard indexes 0..n-1 of public.outbox until the test ends;
// tune, if given, changes their configuration.
func startFollowers(t *testing.T, url string, brokers []string, n int, tune ...func(*relay.Config)) []*follower {
	t.Helper()
	out := make([]*follower, n)
	for k := range n {
		cfg := relay.DefaultConfig()
		cfg.DatabaseURL = url
		cfg.Table = outboxdb.MustParseTable("public.outbox")
		cfg.ShardCount, cfg.ShardIndex = 0, k
		cfg.Kafka.Brokers = brokers
		cfg.DefaultTopic = "test.events"
		cfg.HTTPAddr = ""
		cfg.StatsInterval = time.Second
		for _, f := range tune {
			f(&cfg)
		}
		r, err := relay.New(cfg, relay.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		f := &follower{Relay: r, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(f.done)
			_ = r.Run(ctx)
		}()
		t.Cleanup(f.stop)
		out[k] = f
	}
	return out
}

func (f *follower) stop() {
	f.cancel()
	<-f.done
}

// readyFollowers returns "k:ready" for each follower, for messages.
func readyFollowers(fs []*follower) string {
	s := ""
	for k, f := range fs {
		s += fmt.Sprintf("%d:%v ", k, f.Ready())
	}
	return s
}

// podsFollow plays the kubelet and the Deployment controller, which envtest does not run, for
// relays that stand in for the pods of OutboxRelay name: until the test ends, the Deployment of
// shard k reports one available replica while relay k is ready (what the pod's readiness probe,
// /readyz, would report) and none otherwise.
func (s *suite) podsFollow(t *testing.T, ns, name string, fs []*follower) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for k, f := range fs {
				d := &appsv1.Deployment{}
				if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: DeploymentName(name, int32(k))}, d); err != nil {
					continue
				}
				avail, status := int32(0), corev1.ConditionFalse
				if f.Ready() {
					avail, status = 1, corev1.ConditionTrue
				}
				if d.Status.ObservedGeneration == d.Generation && d.Status.AvailableReplicas == avail && d.Status.Replicas == 1 {
					continue
				}
				d.Status = appsv1.DeploymentStatus{
					ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: avail, AvailableReplicas: avail,
					UnavailableReplicas: 1 - avail,
					Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: status,
						Reason: "MinimumReplicasAvailable", LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
				}
				_ = s.c.Status().Update(ctx, d)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
