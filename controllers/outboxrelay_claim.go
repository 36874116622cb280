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
*/package controllers

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// claimTable connects to the database with the relay's own credentials, identifies the table by
// what PostgreSQL says (its cluster's system_identifier and the database's OID, not the host
// name in a URL), records that identity in status.tableID, and refuses the table when an older
// OutboxRelay claimed the same one. A relay whose credentials do not get it in cannot claim a
// table, so a Secret with dummy credentials takes no table away from anyone; and another
// spelling of the host (an IP, a service alias) names the same database, so it does not get
// past the check.
func (r *OutboxRelayReconciler) claimTable(ctx context.Context, s *scope) (Result, error) {
	relay := s.relay
	if res, err := r.connectDatabase(ctx, s); err != nil {
		return res, err
	}
	other, err := r.conflictingRelay(ctx, relay)
	if err != nil {
		return Result{}, err
	}
	if other == nil {
		return Result{}, nil
	}
	msg := fmt.Sprintf("OutboxRelay %s/%s already relays table %s of the same database; this one stays idle",
		other.Namespace, other.Name, s.table)
	if !hasCondition(relay, v1alpha1.ConditionMigrationsApplied, metav1.ConditionFalse, v1alpha1.ReasonTableConflict, msg) {
		r.Recorder.Eventf(relay, other, corev1.EventTypeWarning, v1alpha1.ReasonTableConflict, "Claim", msg)
	}
	if err := r.deleteRelayDeployments(ctx, relay); err != nil {
		return Result{}, err
	}
	setMigrationsCondition(relay, migrationsObservation{reason: v1alpha1.ReasonTableConflict, message: msg})
	return Result{}, errWait
}

// connectDatabase opens (or reuses) the relay's database handle and records the table's identity
// in status.tableID.
func (r *OutboxRelayReconciler) connectDatabase(ctx context.Context, s *scope) (Result, error) {
	relay := s.relay
	db, err := r.stateOf(relay).database(ctx, s.dbURL, r.OpenDB)
	if err != nil {
		return r.unreachable(s, err)
	}
	s.db = db
	id, err := tableIDOf(ctx, db, s.table)
	if err != nil {
		return r.unreachable(s, err)
	}
	relay.Status.TableID = id
	return Result{}, nil
}

// tableIDOf asks the database behind db for its identity (tableID) of table t.
func tableIDOf(ctx context.Context, db *sql.DB, t outboxdb.Table) (string, error) {
	qctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	var (
		system int64
		dbOID  uint32
	)
	if err := db.QueryRowContext(qctx, `SELECT (SELECT system_identifier FROM pg_control_system()),
		(SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&system, &dbOID); err != nil {
		return "", err
	}
	return tableID(system, dbOID, t), nil
}

// unreachable records that the database could not be reached and asks for a retry with backoff.
func (r *OutboxRelayReconciler) unreachable(s *scope, err error) (Result, error) {
	msg := redact("cannot reach the database: "+describeDBError(err), s.dbURL)
	setMigrationsCondition(s.relay, migrationsObservation{reason: v1alpha1.ReasonDatabaseUnreachable, message: msg})
	return Result{}, errors.New(msg) // backoff; the message is safe to log
}

// tableID identifies a table by what PostgreSQL says of its database: the cluster's
// system_identifier and the database's OID.
func tableID(system int64, dbOID uint32, t outboxdb.Table) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%d\x00%d\x00%s", system, dbOID, t)))
	return hex.EncodeToString(h[:16])
}

// olderThan orders OutboxRelays by creation, then by namespace/name: the older one keeps a
// contested table.
func olderThan(a, b *v1alpha1.OutboxRelay) bool {
	ta, tb := a.CreationTimestamp.Time, b.CreationTimestamp.Time
	if !ta.Equal(tb) {
		return ta.Before(tb)
	}
	return types.NamespacedName{Namespace: a.Namespace, Name: a.Name}.String() <
		types.NamespacedName{Namespace: b.Namespace, Name: b.Name}.String()
}

// conflictingRelay returns the oldest OutboxRelay, older than relay, that claimed the same
// table (the same status.tableID, which only a relay that got into the database records), or
// nil. No other relay's Secret is read.
func (r *OutboxRelayReconciler) conflictingRelay(ctx context.Context, relay *v1alpha1.OutboxRelay) (*v1alpha1.OutboxRelay, error) {
	var claimed v1alpha1.OutboxRelayList
	if err := r.List(ctx, &claimed, client.MatchingFields{tableIDIndex: relay.Status.TableID}); err != nil {
		return nil, fmt.Errorf("while listing the OutboxRelays of table %s: %w", relay.Spec.Database.Table, err)
	}
	candidates := claimed.Items
	sort.Slice(candidates, func(i, j int) bool { return olderThan(&candidates[i], &candidates[j]) })
	for i := range candidates {
		other := &candidates[i]
		if other.UID != relay.UID && other.DeletionTimestamp.IsZero() && olderThan(other, relay) {
			return other, nil
		}
	}
	return nil, nil
}
