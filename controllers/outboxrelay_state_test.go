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
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/outbox-operator/outbox-operator/test/envtestutil"
)

// A pass reuses the OutboxRelay's handle while its URL stays the same; a new URL or a deleted
// OutboxRelay closes it.
func TestRelayStateDatabase(t *testing.T) {
	ctx := context.Background()
	var states relayStates
	t.Cleanup(states.closeAll)
	opened := 0
	open := func(ctx context.Context, url string) (*sql.DB, error) {
		opened++
		return OpenDB(ctx, url)
	}
	closed := func(db *sql.DB) bool {
		err := db.PingContext(ctx)
		return err != nil && strings.Contains(err.Error(), "database is closed")
	}
	a := types.NamespacedName{Namespace: "shop", Name: "orders"}
	b := types.NamespacedName{Namespace: "shop", Name: "billing"}
	const url1, url2 = "postgres://u:p@127.0.0.1:1/one", "postgres://u:p@127.0.0.1:1/two"

	db1, err := states.of(a).database(ctx, url1, open)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := states.of(a).database(ctx, url1, open); again != db1 || opened != 1 {
		t.Fatalf("same URL: a new handle (opened %d times)", opened)
	}
	other, _ := states.of(b).database(ctx, url1, open)
	if other == db1 || opened != 2 {
		t.Fatalf("another OutboxRelay shares a handle (opened %d times)", opened)
	}
	db2, _ := states.of(a).database(ctx, url2, open)
	if db2 == db1 || opened != 3 || !closed(db1) || closed(db2) {
		t.Fatalf("new URL: handle reused or the old one left open (opened %d times)", opened)
	}
	states.forget(a)
	if !closed(db2) || closed(other) {
		t.Fatal("forget closed the wrong handle")
	}
	if _, ok := states.m[a]; ok {
		t.Fatal("forget kept the state")
	}
	if _, err := states.of(a).database(ctx, url1, func(context.Context, string) (*sql.DB, error) { return nil, errors.New("refused") }); err == nil {
		t.Fatal("a failing open returned no error")
	}
	if st := states.of(a); st.db != nil || st.dbSum != [32]byte{} {
		t.Fatal("a failed open kept a handle")
	}
}

// TestReconcileForgetsOnlyWhenGone: what the reconciler remembers of an OutboxRelay (its database
// handle, the autoscaler's history, the apply cache) survives a pass that cannot read the object,
// and goes when the API server says it is gone.
func TestReconcileForgetsOnlyWhenGone(t *testing.T) {
	env := envtestutil.Shared(t)
	ctx := testCtx(t)
	ns := env.CreateNamespace(t, "forget")
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var failing atomic.Bool
	failing.Store(true)
	c := interceptor.NewClient(wc, interceptor.Funcs{
		Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if failing.Load() {
				return apierrors.NewServiceUnavailable("the API server is restarting")
			}
			return cl.Get(ctx, key, obj, opts...)
		},
	})
	r := &OutboxRelayReconciler{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(100)}
	key := types.NamespacedName{Namespace: ns, Name: "orders"}
	r.relays.of(key).lagWritten(time.Unix(1, 0))
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err == nil {
		t.Fatal("a pass that could not read its OutboxRelay succeeded")
	}
	if _, ok := r.relays.m[key]; !ok {
		t.Fatal("a failed read forgot the OutboxRelay's state")
	}
	failing.Store(false)
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatalf("a pass for an OutboxRelay that does not exist: %v", err)
	}
	if _, ok := r.relays.m[key]; ok {
		t.Fatal("the state of an OutboxRelay that is gone was kept")
	}
}

// TestPartitionsDue: upkeep runs on the first pass, on a new UTC day, a new generation, and when
// its recheck (or retry) time has come; not in between.
func TestPartitionsDue(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 23, 55, 0, 0, time.UTC)
	var st relayState
	if _, due := st.partitionsDue(t0, 3); !due {
		t.Fatal("not due on the first pass")
	}
	st.partitionsDone(t0, 3, partitionRecheck)
	for _, c := range []struct {
		at   time.Time
		gen  int64
		due  bool
		wait time.Duration
	}{
		{t0.Add(time.Minute), 3, false, partitionRecheck - time.Minute},
		{t0.Add(time.Minute), 4, true, 0},                    // a new generation
		{t0.Add(partitionRecheck - time.Second), 3, true, 0}, // past midnight: a new day
		{t0.Add(-time.Hour), 3, false, partitionRecheck + time.Hour},
	} {
		wait, due := st.partitionsDue(c.at, c.gen)
		if due != c.due || wait != c.wait {
			t.Errorf("at %s, generation %d: due %v in %s, want %v in %s", c.at.Format(time.TimeOnly), c.gen, due, wait, c.due, c.wait)
		}
	}
	noon := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	st.partitionsDone(noon, 3, partitionRetry) // a failed upkeep, or a deferred drop
	if _, due := st.partitionsDue(noon.Add(partitionRetry-time.Second), 3); due {
		t.Error("due before the retry")
	}
	if _, due := st.partitionsDue(noon.Add(partitionRetry), 3); !due {
		t.Error("not due at the retry")
	}
}
