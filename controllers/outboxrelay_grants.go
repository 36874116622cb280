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

// The relays' own role (spec.relay.databaseSecretRef): the operator, as the table's owner, grants
// it what a relay needs on the table's objects, after the migrations that create them.

package controllers

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// grantRelayRole grants role, the one the relays' own URL logs in as, the relay's privileges on
// the table's objects (outboxdb.RelayGrants), on the operator's connection: the owner's, which
// may grant on what it owns. It runs once per table identity, schema version and role: after the
// first migrations, after each upgrade that migrates (a migration that adds an object would leave
// the relays without it until the owner's grants ran again), and once after the operator starts;
// before the Deployments are applied, so relays of a new version find their grants in place.
// GRANT only adds: PUBLIC's privileges and the other roles' stay as they are. Relays that connect
// as the owner need nothing.
//
// A failure (the operator's role does not own the objects, say) is a Warning event and does not
// stop the pass: an administrator may have granted by hand (relay grants --owner-part), and a
// relay that lacks a privilege says permission denied in its log and readiness. It is tried again
// at the next pass.
func (r *OutboxRelayReconciler) grantRelayRole(ctx context.Context, s *scope, role string) {
	if role == "" {
		return
	}
	st := r.stateOf(s.relay)
	sum := relayGrantSum(s.relay.Status.TableID, outboxdb.LatestVersion(), role)
	if st.relayRoleGranted(sum) {
		return
	}
	n, err := applyRelayGrants(ctx, s, role)
	if err != nil {
		why := describeDBError(err)
		if errors.Is(err, errNotOwner) {
			why = err.Error()
		}
		msg := redact(fmt.Sprintf("granting role %q the relay's privileges on table %s failed: %s; run `relay grants --owner-part` as the table's owner",
			role, s.table, why), s.dbURL)
		r.Recorder.Eventf(s.relay, nil, corev1.EventTypeWarning, v1alpha1.ReasonRelayGrantFailed, "Grant", msg)
		return
	}
	st.markRelayRoleGranted(sum)
	if n > 0 {
		r.Recorder.Eventf(s.relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonGrantedRelayRole, "Grant",
			"Granted role %q the relay's privileges on table %s at schema version %d (%d statements)", role, s.table, outboxdb.LatestVersion(), n)
	}
}

// applyRelayGrants runs the relay role's grants in one transaction as the operator's role and
// returns how many it ran: none when that role is the relays' own.
func applyRelayGrants(ctx context.Context, s *scope, role string) (int, error) {
	qctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	tx, err := s.db.BeginTx(qctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	// A role that does not own the objects gets a warning from GRANT, not an error, and grants
	// nothing: ask first.
	var owner string
	if err := tx.QueryRowContext(qctx, `SELECT current_user`).Scan(&owner); err != nil {
		return 0, err
	}
	if owner == role {
		return 0, nil
	}
	var owns bool
	if err := tx.QueryRowContext(qctx, `SELECT pg_has_role(current_user, relowner, 'USAGE') FROM pg_class WHERE oid = $1::regclass`,
		s.table.Ident()).Scan(&owns); err != nil {
		return 0, err
	}
	if !owns {
		return 0, fmt.Errorf("%w: the operator's role %q does not own table %s", errNotOwner, owner, s.table)
	}
	stmts, err := outboxdb.RelayGrants(s.table, owner, role)
	if err != nil {
		return 0, err
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(qctx, q); err != nil {
			return 0, err
		}
	}
	return len(stmts), tx.Commit()
}

// errNotOwner: the operator's role may not grant on the table's objects.
var errNotOwner = errors.New("not the owner")

// relayGrantSum identifies a grant to role for a table identity at a schema version.
func relayGrantSum(tableID string, version int64, role string) [sha256.Size]byte {
	return sha256.Sum256([]byte(tableID + "\x00" + strconv.FormatInt(version, 10) + "\x00" + role))
}
