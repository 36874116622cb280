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

// The switch of a requested shard layout, waited for in the background: no pass holds a worker
// while the old layout's relays finish their batch in flight and release their buckets.

package controllers

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

const (
	// switchWaitBackground bounds one background wait for a switch; past it the next pass
	// starts another.
	switchWaitBackground = 30 * time.Second
	// switchFallback is how soon a pass looks again while a background wait runs, should its
	// word never come (the operator restarted).
	switchFallback = 2 * time.Second
)

// switchWaiter retries the switch of a requested layout every switchRetry in the background, as
// outboxdb.RetrySwitch does, and enqueues the OutboxRelay as soon as the switch went through
// (or the wait ended), so that its next pass reports it. The publishing pause of a change (from
// the last bucket released to the switch) is the same as when a pass waited for it itself.
type switchWaiter struct {
	ctx    context.Context // the manager's: waits end with it
	clock  outboxdb.Clock
	events chan event.TypedGenericEvent[*v1alpha1.OutboxRelay]

	mu      sync.Mutex
	running map[types.NamespacedName]int32 // the shard count each wait switches to
}

func newSwitchWaiter(ctx context.Context, clk outboxdb.Clock) *switchWaiter {
	return &switchWaiter{ctx: ctx, clock: clk, events: make(chan event.TypedGenericEvent[*v1alpha1.OutboxRelay], 64),
		running: map[types.NamespacedName]int32{}}
}

// start begins waiting for relay's table to switch to want shards, unless a wait for that count
// runs already. It reports whether a wait runs when it returns.
func (w *switchWaiter) start(relay *v1alpha1.OutboxRelay, db *sql.DB, t outboxdb.Table, want int32) bool {
	if w == nil {
		return false
	}
	key := client.ObjectKeyFromObject(relay)
	w.mu.Lock()
	defer w.mu.Unlock()
	if n, ok := w.running[key]; ok {
		return n == want // a wait for another count ends soon: it fails to switch, as requested
	}
	w.running[key] = want
	obj := &v1alpha1.OutboxRelay{}
	obj.Namespace, obj.Name = relay.Namespace, relay.Name
	go func() {
		ctx, cancel := context.WithTimeout(w.ctx, switchWaitBackground)
		defer cancel()
		_, err := outboxdb.RetrySwitch(ctx, w.clock, db, t, want, switchRetry, switchWaitBackground)
		if err != nil && w.ctx.Err() == nil {
			ctrl.Log.WithName("reshard").V(1).Info("background wait for a switch of layout ended", "outboxrelay", key.String(), "error", describeDBError(err))
		}
		w.mu.Lock()
		delete(w.running, key)
		w.mu.Unlock()
		select {
		case w.events <- event.TypedGenericEvent[*v1alpha1.OutboxRelay]{Object: obj}:
		case <-w.ctx.Done():
		}
	}()
	return true
}
