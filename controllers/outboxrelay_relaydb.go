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

// The relays' own database URL (spec.relay.databaseSecretRef): the relay pods connect with it,
// for example as the least-privilege relay role of outboxdb.GrantSQL, while the operator's steps
// keep the owner's URL of spec.database.secretRef.

package controllers

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
)

// relayDatabasePrefix starts the RelaysAvailable message of every problem with the relays' URL.
const relayDatabasePrefix = "relay database: "

// checkRelayDatabase reads the URL of spec.relay.databaseSecretRef, puts it, instead of the
// operator's own URL, into the values the pod template's hash covers (a change of it rolls the
// relays), and checks that it names the database of the table the operator works on. Unset, the
// relays use the operator's URL and there is nothing to check.
//
// The check is PostgreSQL's word, as the table claim's (claimTable): a connection with the relays'
// URL must find the table identity of status.tableID (the cluster's system_identifier, the
// database's OID). Comparing host and database names in the two URLs would refuse the same
// database reached by another spelling (an IP, a service alias, a session-mode pooler) and let
// through another server that answers to the same name; a relay connected to another database
// would publish none of this table's events and would take part in that database's shard layout.
// A URL found right is not checked again until it or the table's identity changes.
//
// A missing Secret or key and a value that is no libpq URL or names another database set
// RelaysAvailable False and wait for a change (errWait); a connection that fails sets it False
// with DatabaseUnreachable and returns the error, retried with backoff. Either way no Deployment
// is applied: running relays keep their configuration. Messages name the Secret and key, never
// the URL.
func (r *OutboxRelayReconciler) checkRelayDatabase(ctx context.Context, s *scope) error {
	relay := s.relay
	ref := relay.Spec.Relay.DatabaseSecretRef
	if ref == nil {
		return nil
	}
	name, key := string(ref.Name), ref.URLKey()
	blocked := func(reason, msg string) {
		setRelaysCondition(relay, relaysObservation{blocked: reason, message: relayDatabasePrefix + msg})
	}
	val, err := r.readSecretKey(ctx, s, name, key)
	if err != nil {
		var se *errSecret
		if errors.As(err, &se) {
			blocked(se.reason, se.msg)
			return errWait
		}
		return err
	}
	url := string(val)
	if err := checkDatabaseURL(url); err != nil {
		blocked(v1alpha1.ReasonInvalidDatabaseURL, fmt.Sprintf("Secret %q key %q: %s", name, key, err.Error()))
		return errWait
	}
	s.secretValues[name+"/"+key] = val
	if url == s.dbURL {
		return nil // the operator's own URL: claimTable found the table there
	}
	st := r.stateOf(relay)
	sum := relayDatabaseSum(url, relay.Status.TableID)
	if ok, role := st.relayDatabaseChecked(sum); ok {
		r.grantRelayRole(ctx, s, role)
		return nil
	}
	id, role, err := r.relayTableID(ctx, url, s)
	if err != nil {
		msg := redact(redact(fmt.Sprintf("Secret %q key %q: cannot connect with it: %s", name, key, describeDBError(err)), url), s.dbURL)
		blocked(v1alpha1.ReasonDatabaseUnreachable, msg)
		return errors.New(relayDatabasePrefix + msg) // backoff; the message is safe to log
	}
	if id != relay.Status.TableID {
		blocked(v1alpha1.ReasonInvalidDatabaseURL, fmt.Sprintf(
			"Secret %q key %q names another database than spec.database.secretRef (PostgreSQL reports another system identifier or database): relays connected there would not publish table %s",
			name, key, s.table))
		return errWait
	}
	st.relayDatabaseFound(sum, role)
	r.grantRelayRole(ctx, s, role)
	return nil
}

// relayTableID connects with the relays' URL and returns the identity it finds of the table and
// the role it logs in as.
func (r *OutboxRelayReconciler) relayTableID(ctx context.Context, url string, s *scope) (id, role string, err error) {
	open := r.OpenDB
	if open == nil {
		open = OpenDB
	}
	db, err := open(ctx, url)
	if err != nil {
		return "", "", err
	}
	defer db.Close()
	if id, err = tableIDOf(ctx, db, s.table); err != nil {
		return "", "", err
	}
	qctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	err = db.QueryRowContext(qctx, `SELECT current_user`).Scan(&role)
	return id, role, err
}

// relayDatabaseSum identifies a check of the relays' URL against a table identity without
// keeping the URL.
func relayDatabaseSum(url, tableID string) [sha256.Size]byte {
	return sha256.Sum256([]byte(url + "\x00" + tableID))
}
