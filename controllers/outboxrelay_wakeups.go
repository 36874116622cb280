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
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// tableLockWait bounds how long a change of the table's DDL (its insert trigger, its lock
// trigger, the drop of its pending index) waits for the table's lock behind the inserts in
// progress (it blocks new inserts while it waits).
const tableLockWait = 2 * time.Second

// tableChangeRetry is how soon a change of the table's DDL that failed (most often: it could not
// take the lock) is tried again.
const tableChangeRetry = 30 * time.Second

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
// tableLockWait is recorded and retried; the relays work either way (a relay that listens on
// a table without the trigger falls back to its poll interval).
func (r *OutboxRelayReconciler) ensureWakeups(ctx context.Context, s *scope) (Result, error) {
	want := wantsNotify(s.relay)
	what := "created the insert trigger: inserts notify a waiting relay"
	if !want {
		what = "dropped the insert trigger: the relays poll, inserts pay nothing for wake-ups"
	}
	return r.ensureTableTrigger(ctx, s, tableTrigger{
		want: want, read: outboxdb.Notifies, set: outboxdb.SetNotify,
		changed: v1alpha1.ReasonWakeupsChanged, failed: v1alpha1.ReasonWakeupsFailed, action: "SetWakeups",
		setting: "the wake-ups", mode: wakeupMode(want), what: what,
	})
}

// ensureInserts matches the table's lock trigger to spec.writers.plainInserts (migration
// 00019_locked_inserts.sql); unset, the table is left as it is (no statement). Like the insert
// trigger, a change that cannot take the table's lock in time is recorded and retried.
func (r *OutboxRelayReconciler) ensureInserts(ctx context.Context, s *scope) (Result, error) {
	mode := s.relay.Spec.Writers.PlainInserts
	if mode == "" {
		return Result{}, nil
	}
	want := mode == v1alpha1.InsertsLocked
	what := "created the lock trigger: a plain INSERT takes its aggregate's lock, as outbox.Append does, at a cost to every insert"
	if !want {
		what = "dropped the lock trigger: only the writer libraries and the SQL append take the aggregate's lock"
	}
	return r.ensureTableTrigger(ctx, s, tableTrigger{
		want: want, read: outboxdb.LockedInserts, set: outboxdb.SetLockedInserts,
		changed: v1alpha1.ReasonInsertsChanged, failed: v1alpha1.ReasonInsertsFailed, action: "SetPlainInserts",
		setting: "plain inserts", mode: string(mode), what: what,
	})
}

// checksPlan is what ensureChecks does with the table's four CHECKs.
type checksPlan struct {
	act  bool // false: leave the table as it is (no statement)
	want bool // the CHECKs exist after the pass
	mode string
}

// planChecks decides from spec.writers.checks and whether this pass made the table: a set field
// is matched; unset, a table made in this pass gets outboxdb.NewTableChecks (as relay migrate
// gives a new table), and an existing one is left as it is.
func planChecks(mode v1alpha1.Checks, newTable bool) checksPlan {
	switch {
	case mode != "":
		return checksPlan{act: true, want: mode == v1alpha1.ChecksTable, mode: string(mode)}
	case newTable:
		m := v1alpha1.ChecksRelay
		if outboxdb.NewTableChecks {
			m = v1alpha1.ChecksTable
		}
		return checksPlan{act: true, want: outboxdb.NewTableChecks, mode: string(m) + " (a new table's default; spec.writers.checks is unset)"}
	}
	return checksPlan{}
}

// ensureChecks matches the table's four CHECKs to spec.writers.checks (migration
// 00022_checks_at_the_relay.sql), by planChecks. A change that cannot take the table's lock in
// time is recorded and retried, as for the triggers. A new table whose pass ends before this step
// (the operator restarted in between) keeps its CHECKs: the stricter table.
func (r *OutboxRelayReconciler) ensureChecks(ctx context.Context, s *scope) (Result, error) {
	p := planChecks(s.relay.Spec.Writers.Checks, s.newTable)
	if !p.act {
		return Result{}, nil
	}
	what := "added the CHECKs back (NOT VALID: the rows written meanwhile are not scanned): PostgreSQL refuses a bad event at insert"
	if !p.want {
		what = "dropped the CHECKs: PostgreSQL accepts a bad event from a plain INSERT, and the relays deal with it as poison (reason invalid); " +
			"outbox.Append and the SQL appends still refuse it"
	}
	return r.ensureTableTrigger(ctx, s, tableTrigger{
		want: p.want, read: outboxdb.Checks, set: outboxdb.SetChecks,
		changed: v1alpha1.ReasonChecksChanged, failed: v1alpha1.ReasonChecksFailed, action: "SetChecks",
		setting: "the checks", mode: p.mode, what: what,
	})
}

// tableTrigger is a part of the table's DDL (a trigger, its CHECKs) that a spec field turns on or
// off.
type tableTrigger struct {
	want            bool
	read            func(context.Context, *sql.DB, outboxdb.Table) (bool, error)
	set             func(context.Context, *sql.DB, outboxdb.Table, bool, time.Duration) (bool, error)
	changed, failed string // event reasons
	action          string // event action
	setting, mode   string // "the wake-ups", "poll"
	what            string // what the change did, for the event
}

// ensureTableTrigger reads whether the table has the trigger (one cheap statement per pass) and,
// only when it differs, changes it in a transaction of its own that waits at most
// tableLockWait for the table's lock; a change is recorded in an Event, a failure too, and
// retried after tableChangeRetry.
func (r *OutboxRelayReconciler) ensureTableTrigger(ctx context.Context, s *scope, tr tableTrigger) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	on, err := tr.read(ctx, s.db, s.table)
	if err == nil && on == tr.want {
		return Result{}, nil
	}
	changed := false
	if err == nil {
		changed, err = tr.set(ctx, s.db, s.table, tr.want, tableLockWait)
	}
	if err != nil {
		msg := redact(fmt.Sprintf("setting %s of table %s to %s failed (retried in %s): %s",
			tr.setting, s.table, tr.mode, tableChangeRetry, describeDBError(err)), s.dbURL)
		r.Recorder.Eventf(s.relay, nil, corev1.EventTypeWarning, tr.failed, tr.action, msg)
		return Result{RequeueAfter: tableChangeRetry}, nil
	}
	if changed {
		r.Recorder.Eventf(s.relay, nil, corev1.EventTypeNormal, tr.changed, tr.action,
			"%s of table %s set to %s: %s", capitalize(tr.setting), s.table, tr.mode, tr.what)
	}
	return Result{}, nil
}

// capitalize upper-cases the first letter of an ASCII phrase.
func capitalize(s string) string {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}

func wakeupMode(notify bool) string {
	if notify {
		return "notify"
	}
	return "poll"
}
