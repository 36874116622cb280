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
	"math"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// PendingCountLimit bounds the unsent rows the operator counts one by one. Past it,
// status.pendingEvents is estimated from the density of the first PendingCountLimit unsent ids
// (outboxdb.Backlog.Pending), so the cost of a measurement does not grow with the backlog.
const PendingCountLimit = outboxdb.DefaultBacklogCountLimit

// measureLag returns the number of unsent events (exact up to PendingCountLimit, then an
// estimate) and the age in whole seconds of the oldest, by the database's clock. It runs
// the statement the relays measure their shards with (outboxdb.TrackedBacklogSQL) over the
// whole table.
func measureLag(ctx context.Context, db *sql.DB, t outboxdb.Table, mode contract.Tracking) (pending, lagSeconds int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	b := outboxdb.Backlog{Limit: PendingCountLimit}
	stmt := outboxdb.TrackedBacklogSQL(t, mode, false)
	if err := db.QueryRowContext(ctx, stmt, outboxdb.BacklogArgs(nil, b.Limit)...).Scan(b.Dest()...); err != nil {
		return 0, 0, err
	}
	pending = b.Pending()
	if pending == 0 {
		return 0, 0, nil
	}
	return pending, int64(max(0, math.Floor(b.OldestAgeSeconds))), nil
}

// measureScalableLag returns the age in whole seconds of the oldest event that no failed event
// holds back (0 when there is none): the lag more shards can fix.
func measureScalableLag(ctx context.Context, db *sql.DB, t outboxdb.Table) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	var age sql.NullFloat64
	if err := db.QueryRowContext(ctx, outboxdb.ScalableLagSQL(t), scalableLagWindow).Scan(&age); err != nil {
		return 0, err
	}
	return int64(max(0, math.Floor(age.Float64))), nil
}

// scalableLagWindow is how many unsent rows, oldest first, the row-tracking measure of the
// scalable lag reads to find failed events and the events they hold back.
const scalableLagWindow = 10_000

// countParked returns the number of parked events of a snapshot-tracked table.
func countParked(ctx context.Context, db *sql.DB, t outboxdb.Table) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	var events int64
	err := db.QueryRowContext(ctx, outboxdb.ParkedCountSQL(t)).Scan(&events)
	return events, err
}

// observeLag measures the backlog, sets LagWithinTarget, copies the numbers into status coarsely,
// and asks to run again after the lag polling interval.
func (r *OutboxRelayReconciler) observeLag(ctx context.Context, s *scope) (Result, error) {
	relay := s.relay
	mode := relay.ResolvedTracking().Mode()
	pending, lag, err := measureLag(ctx, s.db, s.table, mode)
	if err != nil {
		msg := redact("cannot measure lag: "+describeDBError(err), s.dbURL)
		setLagCondition(relay, lagObservation{message: msg})
		return Result{}, errors.New(msg)
	}
	obs := lagObservation{known: true, pending: pending, lagSeconds: lag, target: relay.Spec.LagTarget}
	if mode.Parks() {
		parked, err := countParked(ctx, s.db, s.table)
		if err != nil {
			msg := redact("cannot count parked events: "+describeDBError(err), s.dbURL)
			setLagCondition(relay, lagObservation{message: msg})
			return Result{}, errors.New(msg)
		}
		obs.parked = &parked
	}
	s.lagKnown, s.lagSeconds = true, lag
	// The autoscaler reads it, and status (an external autoscaler, through the operator's
	// metrics). Nothing pending: 0 without a statement. Unknown after a failure: the autoscaler
	// uses lagSeconds, status leaves it out.
	switch {
	case lag == 0 && pending == 0:
		s.scalableKnown, s.scalableLag = true, 0
	default:
		if scalable, err := measureScalableLag(ctx, s.db, s.table); err == nil {
			s.scalableKnown, s.scalableLag = true, min(scalable, lag)
		}
	}
	if s.scalableKnown {
		obs.scalable = &s.scalableLag
	}
	if obs.target <= 0 {
		obs.target = 60
	}
	before := meta.FindStatusCondition(s.before.Status.Conditions, v1alpha1.ConditionLagWithinTarget)
	setLagCondition(relay, obs)
	after := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionLagWithinTarget)
	changed := before == nil || before.Status != after.Status

	now := r.Clock.Now()
	st := r.stateOf(relay)
	last, seen := st.lastLagWrite()
	since := now.Sub(last)
	if !seen {
		since = r.LagStatusInterval // first pass of this process: allow a write
	}
	wrote := applyLagStatus(&relay.Status, obs, changed, since, r.LagStatusInterval)
	if replay, err := observeReplay(ctx, s.db, s.table); err == nil {
		wrote = applyReplayStatus(&relay.Status, replay, since, r.LagStatusInterval) || wrote
	}
	if wrote {
		st.lagWritten(now)
	}
	return Result{RequeueAfter: r.LagPollInterval}, nil
}

// observeReplay reads the oldest replay not finished (`kubectl outbox replay`), nil when none.
// A failure leaves status.replay as it was: the lag pass does not depend on it.
func observeReplay(ctx context.Context, db *sql.DB, t outboxdb.Table) (*v1alpha1.ReplayStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	var rp v1alpha1.ReplayStatus
	err := db.QueryRowContext(ctx, outboxdb.OpenReplaySQL(t)).Scan(&rp.ID, &rp.State, &rp.Replayed, &rp.Total)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &rp, nil
}

// applyReplayStatus sets status.replay to the replay observed (nil: none): at once when a replay
// appears, ends or changes state; its progress coarsely, as the lag's (sinceLast, interval). It
// reports whether it changed the status.
func applyReplayStatus(st *v1alpha1.OutboxRelayStatus, o *v1alpha1.ReplayStatus, sinceLast, interval time.Duration) bool {
	switch {
	case o == nil:
		if st.Replay == nil {
			return false
		}
		st.Replay = nil
		return true
	case st.Replay == nil || st.Replay.ID != o.ID || st.Replay.State != o.State:
		st.Replay = o
		return true
	case *st.Replay != *o && sinceLast >= interval:
		st.Replay = o
		return true
	}
	return false
}
