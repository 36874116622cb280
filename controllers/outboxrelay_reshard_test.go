package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// TestReshardUnderLoad reshards the way users do, through the API: the scale subresource (what
// kubectl scale, an HPA and KEDA write) moves an OutboxRelay from 1 to 4 to 2 shards while
// writers append continuously to 1,000 aggregates. Real relays stand in for the pods. An
// independent consumer must see every event, each aggregate's in order, without duplicates, and
// status must report each change's publishing pause.
func TestReshardUnderLoad(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	ns := s.env.CreateNamespace(t, "reshard")
	url := pgtest.NewDatabase(t)
	s.createSecret(t, ns, "shop-db", map[string]string{"url": url})
	s.createRelay(t, newRelay(ns, "orders", "shop-db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Shards = 1
		r.Spec.Topics = nil
		r.Spec.DefaultTopic = "test.events"
	}))
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionShardsSettled, metav1.ConditionTrue, v1alpha1.ReasonShardsSettled)

	k := kafkatest.NewKfake(t)
	pods := startFollowers(t, url, k.Brokers, 4)
	eventually(t, 30*time.Second, func() error {
		if !pods[0].Ready() {
			return errorf("relays ready: %s; want shard 0 of 1", readyFollowers(pods))
		}
		return nil
	})
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	load := seqtest.StartLoad(context.Background(), pool, w, "order", 1000, 4, 10, 2*time.Millisecond)

	from := int32(1)
	for _, to := range []int32{4, 2} {
		before := load.Written()
		eventually(t, 30*time.Second, func() error {
			if load.Written() < before+2000 {
				return errorf("%d events written under %d shards", load.Written()-before, from)
			}
			return nil
		})
		relay := s.getRelay(t, ns, "orders")
		scale := &autoscalingv1.Scale{}
		if err := s.c.SubResource("scale").Get(ctx, relay, scale); err != nil {
			t.Fatal(err)
		}
		scale.Spec.Replicas = to
		if err := s.c.SubResource("scale").Update(ctx, relay, client.WithSubResourceBody(scale)); err != nil {
			t.Fatal(err)
		}
		relay = s.waitResharded(t, ns, "orders", from, to)
		t.Logf("%d -> %d shards under load: publishing paused %d ms", from, to, ptr.Deref(relay.Status.LastReshard.PauseMilliseconds, -1))
		eventually(t, 30*time.Second, func() error {
			for i, p := range pods {
				if p.Ready() != (int32(i) < to) {
					return errorf("relays ready: %s; want shards 0..%d", readyFollowers(pods), to-1)
				}
			}
			return nil
		})
		from = to
	}
	before := load.Written()
	eventually(t, 30*time.Second, func() error {
		if load.Written() < before+2000 {
			return errorf("%d events written under 2 shards", load.Written()-before)
		}
		return nil
	})
	want := load.Stop(t)
	total := load.Written()

	c := k.NewConsumer(t, "test.events")
	recs := c.ReadN(t, total, 2*time.Minute)
	more, _ := c.Poll(ctx, time.Second)
	recs = append(recs, more...)
	if dups := seqtest.CheckOrder(t, recs, want, nil); dups != 0 {
		t.Errorf("%d duplicates: a relay stood down without recording what it had published", dups)
	}
	t.Logf("%d events of %d aggregates arrived in order through 1 -> 4 -> 2 shards", total, len(want))
}
