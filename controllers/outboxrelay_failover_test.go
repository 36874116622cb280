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
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/relay"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// TestOperatorFollowsFailover: an OutboxRelay whose Secret holds a multi-host URL
// (target_session_attrs=read-write) over a primary and its synchronous standby. After the
// primary is killed and the standby promoted, the operator's status must come from the new
// primary: with the relays stopped, the events written there show in status.pendingEvents; with
// them back, the backlog drains and every event reaches the consumer in order.
func TestOperatorFollowsFailover(t *testing.T) {
	s := sharedSuite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	a, b := pgtest.StartWithStandby(ctx, t, true)
	const db = "failover"
	if _, err := a.CreateDatabase(ctx, db); err != nil {
		t.Fatal(err)
	}
	url := pgtest.MultiHostURL(db, a, b)

	ns := s.env.CreateNamespace(t, "failover")
	k := kafkatest.SharedApache(t)
	topic := kafkatest.UniqueTopic("failover")
	k.CreateTopic(t, topic, 4)
	s.createSecret(t, ns, "shop-db", map[string]string{"url": url})
	s.createRelay(t, newRelay(ns, "orders", "shop-db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Topics = nil
		r.Spec.DefaultTopic = v1alpha1.TopicName(topic)
	}))
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionShardsSettled, metav1.ConditionTrue, v1alpha1.ReasonShardsSettled)
	tune := func(c *relay.Config) { c.DefaultTopic = topic }
	pods := startFollowers(t, url, k.Brokers, 1, tune)

	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	appendSome := func(n int) {
		t.Helper()
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		for i := 0; i < n; i += 10 {
			evs := make([]seqtest.Event, 10)
			for j := range evs {
				agg := fmt.Sprintf("agg-%02d", (i+j)%20)
				want[agg]++
				evs[j] = seqtest.Event{Agg: agg, Seq: want[agg]}
			}
			if err := seqtest.Append(ctx, pool, w, "order", evs); err != nil {
				t.Fatal(err)
			}
		}
	}
	pending := func(n int64) func() error {
		return func() error {
			r := s.getRelay(t, ns, "orders")
			if got := ptr.Deref(r.Status.PendingEvents, -1); got != n {
				return errorf("status.pendingEvents %d, want %d", got, n)
			}
			return nil
		}
	}
	appendSome(1000)
	eventually(t, time.Minute, pending(0))

	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := b.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	pods[0].stop() // the new primary's backlog stays for the operator to see
	appendSome(500)
	// The database says what is pending: the 500 and whatever marks or cursor writes of the old
	// primary's last batches the standby did not get (the relays commit them asynchronously, so
	// those events are published again).
	pool, err := pgxpool.New(ctx, b.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var onB int64
	if err := pool.QueryRow(ctx, `SELECT public.outbox_pending()`).Scan(&onB); err != nil {
		t.Fatal(err)
	}
	if onB < 500 {
		t.Fatalf("%d events pending on the new primary, want at least the 500 written there", onB)
	}
	eventually(t, time.Minute, pending(onB))
	t.Logf("status.pendingEvents %d from the new primary (500 written there, %d again after the failover) %s after the promotion",
		onB, onB-500, time.Since(promoted).Round(time.Millisecond))

	startFollowers(t, url, k.Brokers, 1, tune)
	eventually(t, time.Minute, pending(0))
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionPartitionsReady, metav1.ConditionTrue, v1alpha1.ReasonPartitionsReady)
	c := k.NewConsumer(t, topic)
	recs := c.ReadN(t, 1500, time.Minute)
	more, _ := c.Poll(ctx, time.Second)
	dups := seqtest.CheckOrder(t, append(recs, more...), want, nil)
	t.Logf("1,500 events across the failover, in order, %d duplicates", dups)
}
