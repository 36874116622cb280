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
	"time"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// wakeupsLockWait bounds how long a change of the table's insert trigger waits for the table's
// lock behind the inserts in progress (it blocks new inserts while it waits).
const wakeupsLockWait = 2 * time.Second

// wakeupsRetry is how soon a change of the insert trigger that could not take the lock is tried
// again.
const wakeupsRetry = 30 * time.Second

// wantsNotify reports whether the relays of relay listen for notifications (spec.publish.notify,
// contract.DefaultNotify when unset), and so whether the table needs its insert trigger.
func wantsNotify(relay *v1alpha1.OutboxRelay) bool {
	if relay.Spec.Publish.Notify == nil {
		return contract.DefaultNotify
	}
	return *relay.Spec.Publish.Notify
}

// ensureWakeups matches the table's insert trigger to spec.publish.notify (migration
// 00010_wake_by_polling.sql): relays that poll need no trigger, and without it the writers'
// inserts pay nothing for wake-ups. A change that cannot take the table's lock within
// wakeupsLockWait is recorded and retried; the relays work either way (a relay that listens on
// a table without the trigger falls back to its poll interval).
func (r *OutboxRelayReconciler) ensureWakeups(ctx context.Context, s *scope) (Result, error) {
	want := wantsNotify(s.relay)
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	// One cheap read per pass; the change, in its own transaction, only when due.
	on, err := outboxdb.Notifies(ctx, s.db, s.table)
	if err == nil && on == want {
		return Result{}, nil
	}
	changed := false
	if err == nil {
		changed, err = outboxdb.SetNotify(ctx, s.db, s.table, want, wakeupsLockWait)
	}
	if err != nil {
		msg := redact(fmt.Sprintf("setting the wake-ups of table %s to %s failed (retried in %s): %s",
			s.table, wakeupMode(want), wakeupsRetry, describeDBError(err)), s.dbURL)
		r.Recorder.Eventf(s.relay, nil, corev1.EventTypeWarning, v1alpha1.ReasonWakeupsFailed, "SetWakeups", msg)
		return Result{RequeueAfter: wakeupsRetry}, nil
	}
	if changed {
		what := "created the insert trigger: inserts notify a waiting relay"
		if !want {
			what = "dropped the insert trigger: the relays poll, inserts pay nothing for wake-ups"
		}
		r.Recorder.Eventf(s.relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonWakeupsChanged, "SetWakeups",
			"Wake-ups of table %s set to %s: %s", s.table, wakeupMode(want), what)
	}
	return Result{}, nil
}

func wakeupMode(notify bool) string {
	if notify {
		return "notify"
	}
	return "poll"
}
