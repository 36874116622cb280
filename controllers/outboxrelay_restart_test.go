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
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/relay"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// TestReshardSurvivesOperatorRestart stops the manager in the middle of a change of layout, at
// its most delicate moment: the change is requested, the old layout's relays have stood down, and
// the switch cannot go through yet (a session took a bucket they released, as a slow relay holds
// one). A new manager, which remembers nothing of the change, must finish it from what the API
// server and the database keep. Real relays publish to the real broker while writers append; an
// independent consumer must see every event, each aggregate's in order, none twice.
func TestReshardSurvivesOperatorRestart(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	ns := s.env.CreateNamespace(t, "restart")
	url := pgtest.NewDatabase(t)
	k := kafkatest.SharedApache(t)
	topic := kafkatest.UniqueTopic("restart")
	k.CreateTopic(t, topic, 4)
	s.createSecret(t, ns, "shop-db", map[string]string{"url": url})
	s.createRelay(t, newRelay(ns, "orders", "shop-db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Shards = 2
		r.Spec.Topics = nil
		r.Spec.DefaultTopic = v1alpha1.TopicName(topic)
	}))
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionShardsSettled, metav1.ConditionTrue, v1alpha1.ReasonShardsSettled)

	pods := startFollowers(t, url, k.Brokers, 4, func(c *relay.Config) { c.DefaultTopic = topic })
	eventually(t, 30*time.Second, func() error {
		if !pods[0].Ready() || !pods[1].Ready() {
			return errorf("relays ready: %s; want shards 0 and 1 of 2", readyFollowers(pods))
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
	waitWritten := func(n int) {
		t.Helper()
		before := load.Written()
		eventually(t, 30*time.Second, func() error {
			if load.Written() < before+n {
				return errorf("%d of %d more events written", load.Written()-before, n)
			}
			return nil
		})
	}
	waitWritten(2000)

	// A session queues for bucket 6, which shard 0 of the old layout holds: it gets it the moment
	// that relay stands down, and keeps the switch from going through.
	tb := outboxdb.MustParseTable("public.outbox")
	grabbed, release := queueBucketLock(t, url, tb, 6)
	relayObj := s.getRelay(t, ns, "orders")
	patch := client.MergeFrom(relayObj.DeepCopy())
	relayObj.Spec.Shards = 4
	if err := s.c.Patch(ctx, relayObj, patch); err != nil {
		t.Fatal(err)
	}
	select {
	case <-grabbed:
	case <-time.After(time.Minute):
		t.Fatal("the old layout's relay never released bucket 6: the change was not requested")
	}
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionShardsSettled, metav1.ConditionFalse, v1alpha1.ReasonDraining)
	if l, err := outboxdb.ReadLayout(ctx, openTestDB(t, url), tb); err != nil || l.ShardCount != 2 || l.Requested != 4 {
		t.Fatalf("before the restart: layout %+v, %v; want 2 shards with 4 requested", l, err)
	}

	// The operator restarts (a new pod, a new leader), and only then does the bucket come free.
	s.restartManager(t)
	release()
	got := s.waitResharded(t, ns, "orders", 2, 4)
	t.Logf("2 -> 4 shards finished by the restarted manager; publishing paused %d ms (the lock was held across the restart)",
		ptr.Deref(got.Status.LastReshard.PauseMilliseconds, -1))
	eventually(t, 30*time.Second, func() error {
		for i, p := range pods {
			if !p.Ready() {
				return errorf("relays ready: %s; want shards 0..3 (shard %d is not)", readyFollowers(pods), i)
			}
		}
		return nil
	})
	waitWritten(2000)

	want := load.Stop(t)
	total := load.Written()
	c := k.NewConsumer(t, topic)
	recs := c.ReadN(t, total, 2*time.Minute)
	more, _ := c.Poll(ctx, time.Second)
	recs = append(recs, more...)
	if dups := seqtest.CheckOrder(t, recs, want, nil); dups != 0 {
		t.Errorf("%d duplicates: a relay stood down without recording what it had published", dups)
	}
	t.Logf("%d events of %d aggregates arrived in order through 2 -> 4 shards across an operator restart", total, len(want))
}

// queueBucketLock asks for bucket's lock on a session of its own, in the background: grabbed is
// closed once it holds it; release ends the session.
func queueBucketLock(t *testing.T, url string, tb outboxdb.Table, bucket int) (grabbed <-chan struct{}, release func()) {
	t.Helper()
	conn, release := lockSession(t, url)
	got := make(chan struct{})
	go func() {
		if _, err := conn.ExecContext(context.Background(), `SELECT pg_advisory_lock($1::int4, $2::int4)`, tb.LockKey(), bucket); err == nil {
			close(got)
		}
	}()
	return got, release
}
