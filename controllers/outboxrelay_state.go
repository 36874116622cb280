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
	"crypto/sha256"
	"database/sql"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
)

// relayState is what the reconciler remembers of one OutboxRelay from pass to pass. It lives until
// a pass finds the OutboxRelay gone (NotFound): a failed read forgets nothing.
type relayState struct {
	mu sync.Mutex
	// db is the OutboxRelay's pooled database handle, so that the pass that runs every lag
	// polling interval reuses its connections instead of dialing anew; dbSum is the SHA-256 of
	// the URL it was opened with (never the URL itself): when the Secret's URL changes, the old
	// handle is closed and a new one opened.
	db    *sql.DB
	dbSum [sha256.Size]byte
	// relayDBChecked is the SHA-256 of the relays' own URL (spec.relay.databaseSecretRef) and the
	// table's identity the last time a connection with that URL found that same table's database
	// (checkRelayDatabase): it is checked again only when either changes.
	relayDBChecked [sha256.Size]byte
	// relayRole is the role the relays' own URL logs in as (current_user), found by the same check.
	relayRole string
	// relayGranted is the SHA-256 of the table's identity, its schema version and the relay role
	// the last time the operator granted that role the relay's privileges (grantRelayRole).
	relayGranted [sha256.Size]byte
	// lagWrite is when pendingEvents and lagSeconds were last written to status.
	lagWrite time.Time
	// applied remembers, per Deployment, the hash of the last applied configuration and the
	// resourceVersion the API server returned for it (as CAPI's ssa.Cache does).
	applied map[string][2]string
	// autoscale is the built-in autoscaler's history (spec.autoscaling), nil without it.
	autoscale *autoscaleHistory
	// partitions is when partition upkeep last ran (the generation, and the UTC day) and when it
	// is due again however little changed.
	partitions    upkeep
	partitionsDay time.Time
	// topics is when the topics were last checked and when they are due again (ensureTopics).
	topics upkeep
}

// relayStates holds the relayState of every OutboxRelay a pass has seen.
type relayStates struct {
	mu sync.Mutex
	m  map[types.NamespacedName]*relayState
}

// stateOf returns the state of the OutboxRelay a pass works on.
func (r *OutboxRelayReconciler) stateOf(relay *v1alpha1.OutboxRelay) *relayState {
	return r.relays.of(client.ObjectKeyFromObject(relay))
}

// of returns key's state, new if there is none.
func (s *relayStates) of(key types.NamespacedName) *relayState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[types.NamespacedName]*relayState{}
	}
	st := s.m[key]
	if st == nil {
		st = &relayState{}
		s.m[key] = st
	}
	return st
}

// forget drops the state of a deleted OutboxRelay and closes its database handle.
func (s *relayStates) forget(key types.NamespacedName) {
	s.mu.Lock()
	st := s.m[key]
	delete(s.m, key)
	s.mu.Unlock()
	if st != nil {
		st.closeDB()
	}
}

// closeAll closes every database handle (the manager is stopping).
func (s *relayStates) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.m {
		st.closeDB()
	}
}

// database returns the OutboxRelay's handle for url, opening it with open when there is none or
// the URL changed.
func (st *relayState) database(ctx context.Context, url string, open func(context.Context, string) (*sql.DB, error)) (*sql.DB, error) {
	sum := sha256.Sum256([]byte(url))
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.db != nil && st.dbSum == sum {
		return st.db, nil
	}
	st.closeDBLocked() // none yet, or opened for another URL
	db, err := open(ctx, url)
	if err != nil {
		return nil, err
	}
	st.db, st.dbSum = db, sum
	return db, nil
}

func (st *relayState) closeDB() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.closeDBLocked()
}

// closeDBLocked closes the database handle, if any; st.mu is held.
func (st *relayState) closeDBLocked() {
	if st.db != nil {
		_ = st.db.Close()
		st.db, st.dbSum = nil, [sha256.Size]byte{}
	}
}

// relayDatabaseChecked reports whether sum (relayDatabaseSum) was found to name the table's
// database, and the role it logs in as.
func (st *relayState) relayDatabaseChecked(sum [sha256.Size]byte) (bool, string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.relayDBChecked == sum, st.relayRole
}

// relayDatabaseFound records that sum (relayDatabaseSum) names the table's database, as role.
func (st *relayState) relayDatabaseFound(sum [sha256.Size]byte, role string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.relayDBChecked, st.relayRole = sum, role
}

// relayRoleGranted reports whether sum (relayGrantSum) was granted; markRelayRoleGranted records it.
func (st *relayState) relayRoleGranted(sum [sha256.Size]byte) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.relayGranted == sum
}

func (st *relayState) markRelayRoleGranted(sum [sha256.Size]byte) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.relayGranted = sum
}

// appliedUnchanged reports whether Deployment name was last applied with the configuration of
// hash and has not changed since (its resourceVersion is the one the apply returned).
func (st *relayState) appliedUnchanged(name, hash, resourceVersion string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	v, ok := st.applied[name]
	return ok && resourceVersion != "" && v == [2]string{hash, resourceVersion}
}

// recordApplied remembers the apply of Deployment name.
func (st *relayState) recordApplied(name, hash, resourceVersion string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.applied == nil {
		st.applied = map[string][2]string{}
	}
	st.applied[name] = [2]string{hash, resourceVersion}
}

// lastLagWrite returns when lag was last written to status, and whether it was by this process.
func (st *relayState) lastLagWrite() (time.Time, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.lagWrite, !st.lagWrite.IsZero()
}

func (st *relayState) lagWritten(at time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.lagWrite = at
}

// upkeep is when a periodic step last ran, for which generation of the spec, and when it is due
// again however little changed.
type upkeep struct {
	gen  int64
	next time.Time
}

// due reports whether the step is due at now for generation gen and, when it is not, how long
// until it is.
func (u *upkeep) due(now time.Time, gen int64) (time.Duration, bool) {
	if u.next.IsZero() || gen != u.gen || !now.Before(u.next) {
		return 0, true
	}
	return u.next.Sub(now), false
}

// done records a run at now for generation gen, due again after again.
func (u *upkeep) done(now time.Time, gen int64, again time.Duration) {
	u.gen, u.next = gen, now.Add(again)
}

// partitionsDue reports whether partition upkeep is due at now for generation gen (a new UTC
// day too) and, when it is not, how long until it is.
func (st *relayState) partitionsDue(now time.Time, gen int64) (time.Duration, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !utcDay(now).Equal(st.partitionsDay) {
		return 0, true
	}
	return st.partitions.due(now, gen)
}

// partitionsDone records an upkeep at now for generation gen, due again after again.
func (st *relayState) partitionsDone(now time.Time, gen int64, again time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.partitionsDay = utcDay(now)
	st.partitions.done(now, gen, again)
}

// topicsDue and topicsDone are partitionsDue and partitionsDone for the topics' check.
func (st *relayState) topicsDue(now time.Time, gen int64) (time.Duration, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.topics.due(now, gen)
}

func (st *relayState) topicsDone(now time.Time, gen int64, again time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.topics.done(now, gen, again)
}

// decide runs the autoscaler on this pass's lag (autoscaleHistory.decide).
func (st *relayState) decide(p autoscalePolicy, now time.Time, current int32, lagSeconds int64) int32 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.history().decide(p, now, current, lagSeconds)
}

// hold records why (the kind of cause) this pass does not act on the lag it sees, "" when it does,
// and reports whether that changed (the caller says so in an event).
func (st *relayState) hold(why string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	h := st.history()
	changed := h.held != why
	h.held = why
	return changed
}

// forgetAutoscale drops the autoscaler's history (spec.autoscaling was removed).
func (st *relayState) forgetAutoscale() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.autoscale = nil
}

// history returns the autoscaler's history, new if there is none; st.mu is held.
func (st *relayState) history() *autoscaleHistory {
	if st.autoscale == nil {
		st.autoscale = &autoscaleHistory{}
	}
	return st.autoscale
}
