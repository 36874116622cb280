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
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

const day = 24 * time.Hour

// partitionRetry is how soon a partition pass that failed, or could not drop a partition because
// a transaction still used the table, runs again. A failed pass does not stop the steps after it
// (the Deployments, the shard layout): partitions are made days ahead, so a retry costs nothing.
const partitionRetry = 5 * time.Minute

// partitionRecheck is how often partition upkeep runs when neither the UTC day nor the
// OutboxRelay's generation changed: for a partition kept because it held an unsent event, and a
// table changed by hand. Every other pass (the lag poll brings one every 30 s) skips it.
const partitionRecheck = 10 * time.Minute

// boundarySlack is added to the wait for the next UTC midnight, so the pass after it surely sees
// the new day.
const boundarySlack = 5 * time.Second

// utcDay returns midnight UTC of the day of t.
func utcDay(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// partitionWindow returns the UTC days whose partitions must exist at now: today through
// today + premakeDays.
func partitionWindow(now time.Time, premakeDays int32) (from, to time.Time) {
	from = utcDay(now)
	return from, from.AddDate(0, 0, int(premakeDays))
}

// untilNextDay returns how long to wait, from now, until the pass that creates the next day's
// partition: just after the next UTC midnight.
func untilNextDay(now time.Time) time.Duration {
	return utcDay(now).Add(day).Sub(now) + boundarySlack
}

// premakeDays returns spec.partitions.premakeDays with its default.
func premakeDays(relay *v1alpha1.OutboxRelay) int32 {
	return ptr.Deref(relay.Spec.Partitions.PremakeDays, outboxdb.DefaultPremakeDays)
}

// retention returns spec.partitions.retention with its default.
func retention(relay *v1alpha1.OutboxRelay) time.Duration {
	if r := relay.Spec.Partitions.Retention; r != nil && r.Duration > day {
		return r.Duration
	}
	return outboxdb.DefaultRetention
}

// ensurePartitions creates the daily partitions of today through premakeDays ahead and drops the
// ones past retention. A partition that still holds an unsent event is never dropped: it is kept,
// PartitionsReady turns False and a Warning event says so. It asks to run again just after the
// next UTC midnight. Its DDL never waits more than a second for a lock (a long application
// transaction on the outbox): a pass that fails sets PartitionsReady False with what failed,
// records a Warning event and is retried after partitionRetry, and the steps after it still run.
//
// Upkeep runs only when it is due: on a new UTC day, a new generation of the OutboxRelay,
// partitionRecheck after the last upkeep (partitionRetry after one that failed or deferred a
// drop), or the first pass of this process. The passes in between leave the condition as the
// last upkeep set it.
func (r *OutboxRelayReconciler) ensurePartitions(ctx context.Context, s *scope) (Result, error) {
	relay := s.relay
	now := r.Clock.Now()
	st := r.stateOf(relay)
	if wait, due := st.partitionsDue(now, relay.Generation); !due {
		return Result{RequeueAfter: min(untilNextDay(now), wait)}, nil
	}
	from, to := partitionWindow(now, premakeDays(relay))
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	failed := func(what string, err error) (Result, error) {
		st.partitionsDone(now, relay.Generation, partitionRetry)
		msg := redact(fmt.Sprintf("%s partitions of table %s failed: %s", what, s.table, describeDBError(err)), s.dbURL)
		setPartitionsCondition(relay, partitionsObservation{reason: v1alpha1.ReasonPartitionMaintenanceFailed, message: msg})
		r.Recorder.Eventf(relay, nil, corev1.EventTypeWarning, v1alpha1.ReasonPartitionMaintenanceFailed, "EnsurePartitions",
			"%s; retrying in %s", msg, partitionRetry)
		return Result{RequeueAfter: partitionRetry}, nil
	}

	created, err := outboxdb.EnsurePartitions(ctx, s.db, s.table, from, to)
	if err != nil {
		return failed("creating", err)
	}
	if len(created) > 0 {
		r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonCreatedPartitions, "CreatePartition",
			"Created partitions %s", strings.Join(created, ", "))
	}

	// A partition kept for an unsent row shows in the observation below.
	pruned, err := outboxdb.PrunePartitions(ctx, s.db, s.table, retention(relay))
	dropped, busy := pruned.Dropped, pruned.Busy
	if err != nil {
		return failed("dropping", err)
	}
	if len(dropped) > 0 {
		r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonDroppedPartitions, "DropPartition",
			"Dropped partitions past retention %s: %s", retention(relay), strings.Join(dropped, ", "))
	}
	next := untilNextDay(r.Clock.Now())
	recheck := partitionRecheck
	if len(busy) > 0 {
		recheck = partitionRetry
		r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonPartitionDropDeferred, "DropPartition",
			"Partitions past retention %s not dropped yet, a transaction still uses the table: %s; retrying in %s",
			retention(relay), strings.Join(busy, ", "), partitionRetry)
		next = min(next, partitionRetry)
	}

	parts, err := outboxdb.ListPartitions(ctx, s.db, s.table)
	if err != nil {
		return failed("listing", err)
	}
	obs := observePartitions(parts, r.Clock.Now(), retention(relay))
	obs.through = to.Format(time.DateOnly)
	if len(obs.kept) > 0 {
		was := hasConditionReason(relay, v1alpha1.ConditionPartitionsReady, v1alpha1.ReasonRetentionBlocked)
		setPartitionsCondition(relay, obs)
		if !was {
			r.Recorder.Eventf(relay, nil, corev1.EventTypeWarning, v1alpha1.ReasonRetentionBlocked, "DropPartition",
				"Partitions past retention %s hold unsent events and are kept: %s", retention(relay), strings.Join(obs.kept, ", "))
		}
	} else {
		setPartitionsCondition(relay, obs)
	}
	st.partitionsDone(now, relay.Generation, recheck)
	return Result{RequeueAfter: next}, nil
}

// observePartitions summarises the daily partitions: oldest, newest, count, and those whose day
// ended more than retention before now but which hold unsent events.
func observePartitions(parts []outboxdb.Partition, now time.Time, retention time.Duration) partitionsObservation {
	var o partitionsObservation
	for _, p := range parts {
		if p.Default {
			continue
		}
		d := p.Day.Format(time.DateOnly)
		if o.count == 0 {
			o.first = d
		}
		o.last = d
		o.count++
		if p.HasPending && !p.Day.Add(day).After(now.Add(-retention)) {
			o.kept = append(o.kept, p.Name)
		}
	}
	return o
}

// hasConditionReason reports whether the condition is False with the reason.
func hasConditionReason(relay *v1alpha1.OutboxRelay, typ, reason string) bool {
	for _, c := range relay.Status.Conditions {
		if c.Type == typ {
			return c.Status == metav1.ConditionFalse && c.Reason == reason
		}
	}
	return false
}
