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
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/migrations"
)

// PendingCountLimit bounds the unsent rows the operator counts one by one. Past it,
// status.pendingEvents is estimated from the id range of the unsent rows (an upper bound), so the
// cost of a measurement does not grow with the backlog.
const PendingCountLimit = 100_000

// lagQueries are the lag queries. Each reads only the partial index
// <table>_pending_idx ON (id) WHERE sent_at IS NULL, which holds unsent rows only: the count is an
// index scan bounded by PendingCountLimit; the id span and the oldest row are index probes at the
// ends of each partition's index.
type lagQueries struct{ count, span, oldest string }

func pendingQueries(t migrations.Table) lagQueries {
	return lagQueries{
		count: fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %s WHERE sent_at IS NULL LIMIT %d) AS pending`,
			t.Ident(), PendingCountLimit),
		span: fmt.Sprintf(`SELECT coalesce(max(id) - min(id) + 1, 0) FROM %s WHERE sent_at IS NULL`, t.Ident()),
		oldest: fmt.Sprintf(`SELECT greatest(0, floor(extract(epoch FROM statement_timestamp() - created_at)))::bigint
FROM %s WHERE sent_at IS NULL ORDER BY id LIMIT 1`, t.Ident()),
	}
}

// measureLag returns the number of unsent events (exact up to PendingCountLimit, then an
// estimate) and the age in seconds of the oldest, by the database's clock.
func measureLag(ctx context.Context, db *sql.DB, t migrations.Table) (pending, lagSeconds int64, err error) {
	q := pendingQueries(t)
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	if err := db.QueryRowContext(ctx, q.count).Scan(&pending); err != nil {
		return 0, 0, err
	}
	if pending == 0 {
		return 0, 0, nil
	}
	if pending >= PendingCountLimit {
		var span int64
		if err := db.QueryRowContext(ctx, q.span).Scan(&span); err != nil {
			return 0, 0, err
		}
		pending = max(pending, span)
	}
	if err := db.QueryRowContext(ctx, q.oldest).Scan(&lagSeconds); err != nil {
		if errors.Is(err, sql.ErrNoRows) { // sent in between
			return 0, 0, nil
		}
		return 0, 0, err
	}
	return pending, lagSeconds, nil
}

// observeLag measures the backlog, sets LagWithinTarget, copies the numbers into status coarsely,
// and asks to run again after the lag polling interval.
func (r *OutboxRelayReconciler) observeLag(ctx context.Context, s *scope) (Result, error) {
	relay := s.relay
	key := types.NamespacedName{Namespace: relay.Namespace, Name: relay.Name}
	pending, lag, err := measureLag(ctx, s.db, s.table)
	if err != nil {
		msg := redact("cannot measure lag: "+describeDBError(err), s.dbURL)
		setLagCondition(relay, lagObservation{message: msg})
		return Result{}, errors.New(msg)
	}
	obs := lagObservation{known: true, pending: pending, lagSeconds: lag, target: relay.Spec.LagTarget}
	if obs.target <= 0 {
		obs.target = 60
	}
	before := meta.FindStatusCondition(s.before.Status.Conditions, v1alpha1.ConditionLagWithinTarget)
	setLagCondition(relay, obs)
	after := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionLagWithinTarget)
	changed := before == nil || before.Status != after.Status

	now := r.Clock.Now()
	r.lagMu.Lock()
	last, seen := r.lagWrites[key]
	r.lagMu.Unlock()
	since := now.Sub(last)
	if !seen {
		since = r.LagStatusInterval // first pass of this process: allow a write
	}
	if applyLagStatus(&relay.Status, obs, changed, since, r.LagStatusInterval) {
		r.lagMu.Lock()
		r.lagWrites[key] = now
		r.lagMu.Unlock()
	}
	return Result{RequeueAfter: r.LagPollInterval}, nil
}

// forget drops the in-memory bookkeeping of a deleted OutboxRelay.
func (r *OutboxRelayReconciler) forget(key types.NamespacedName) {
	r.lagMu.Lock()
	delete(r.lagWrites, key)
	r.lagMu.Unlock()
	r.applied.forget(key.Namespace + "/" + key.Name + "-shard-")
}
