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
	"crypto/x509"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	redactpkg "github.com/outbox-operator/outbox-operator/internal/redact"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// OpenDB opens the database behind a libpq URL. It is the reconciler's default DB factory.
// Every connection plans the backlog statement as the relays do (outboxdb.PlanInIDOrder).
func OpenDB(ctx context.Context, dsn string) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("the database URL is not a valid libpq URL")
	}
	db := stdlib.OpenDB(*cfg, stdlib.OptionAfterConnect(func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, outboxdb.PlanInIDOrder)
		return err
	}))
	db.SetMaxOpenConns(2)
	db.SetMaxIdleConns(2)
	db.SetConnMaxIdleTime(time.Minute)
	return db, nil
}

// checkDatabaseURL parses a libpq URL or keyword/value string; its error never contains the
// input.
func checkDatabaseURL(dsn string) error {
	if _, err := pgconn.ParseConfig(dsn); err != nil {
		return errors.New("the value is not a valid libpq URL")
	}
	return nil
}

// redact removes the URL, its password and its user information from a message: a last line of
// defence, since messages are built from classified errors and never from the URL itself.
func redact(msg, dsn string) string {
	return redactpkg.New(redactpkg.DatabaseSecrets(dsn)...).String(msg)
}

// describeDBError says what went wrong talking to PostgreSQL without repeating the client's
// error text, which can carry connection details. Server errors keep their message and SQLSTATE.
func describeDBError(err error) string {
	var pgErr *pgconn.PgError
	var dnsErr *net.DNSError
	var netErr net.Error
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var certErr x509.CertificateInvalidError
	var unsupported *outboxdb.UnsupportedServerError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &pgErr):
		return fmt.Sprintf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "host unreachable"
	case errors.As(err, &dnsErr):
		return "host name not found"
	case errors.As(err, &unknownAuth), errors.As(err, &hostErr), errors.As(err, &certErr):
		return "TLS: the server certificate is not trusted"
	case errors.As(err, &netErr) && netErr.Timeout():
		return "timed out"
	case strings.Contains(err.Error(), "tls"):
		return "TLS handshake failed"
	case errors.Is(err, outboxdb.ErrInvalidTable):
		return err.Error()
	case errors.As(err, &unsupported):
		return unsupported.Error()
	default:
		var ce *pgconn.ConnectError
		if errors.As(err, &ce) {
			return "cannot connect"
		}
		return "unexpected database error"
	}
}

// loadDatabase reads the URL from the Secret, parses the table and refuses a table another,
// older OutboxRelay already relays.
func (r *OutboxRelayReconciler) loadDatabase(ctx context.Context, s *scope) (Result, error) {
	relay := s.relay
	fail := func(reason, msg string) (Result, error) {
		setMigrationsCondition(relay, migrationsObservation{reason: reason, message: msg})
		return Result{}, errWait
	}
	t, err := outboxdb.ParseTable(qualifiedTable(relay.Spec.Database.Table))
	if err != nil {
		return fail(v1alpha1.ReasonInvalidTable, err.Error())
	}
	s.table = t

	ref := relay.Spec.Database.SecretRef
	key := ref.URLKey()
	val, err := r.readSecretKey(ctx, s, string(ref.Name), key)
	if err != nil {
		var se *errSecret
		if errors.As(err, &se) {
			return fail(se.reason, "database: "+se.msg)
		}
		return Result{}, err
	}
	s.dbURL = string(val)
	if relay.Spec.Relay.DatabaseSecretRef == nil {
		// The relay pods connect with this URL too: a change of it rolls them. With a URL of their
		// own (checkRelayDatabase) a change of the operator's alone restarts none.
		s.secretValues[string(ref.Name)+"/"+key] = val
	}
	if err := checkDatabaseURL(s.dbURL); err != nil {
		return fail(v1alpha1.ReasonInvalidDatabaseURL,
			fmt.Sprintf("Secret %q key %q: %s", ref.Name, key, err.Error()))
	}
	return Result{}, nil
}

// ensureMigrations applies the embedded migrations of the table, on the connection claimTable
// opened.
func (r *OutboxRelayReconciler) ensureMigrations(ctx context.Context, s *scope) (Result, error) {
	relay := s.relay
	db := s.db
	qctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	current, err := outboxdb.CurrentVersion(qctx, db, s.table)
	if err != nil {
		return r.unreachable(s, err)
	}
	latest := outboxdb.LatestVersion()
	if current > latest {
		setMigrationsCondition(relay, migrationsObservation{reason: v1alpha1.ReasonSchemaNewer, message: fmt.Sprintf(
			"table %s is at schema version %d, newer than %d of this operator: upgrade the operator", s.table, current, latest)})
		return Result{}, errWait
	}
	version := current
	if current < latest {
		mctx, cancel := context.WithTimeout(ctx, migrateTimeout)
		defer cancel()
		version, err = outboxdb.Apply(mctx, db, s.table)
		if err != nil {
			msg := redact(fmt.Sprintf("applying migrations to table %s failed: %s", s.table, describeDBError(err)), s.dbURL)
			setMigrationsCondition(relay, migrationsObservation{reason: v1alpha1.ReasonMigrationFailed, message: msg})
			r.Recorder.Eventf(relay, nil, corev1.EventTypeWarning, v1alpha1.ReasonMigrationFailed, "Migrate", msg)
			return Result{}, errors.New(msg)
		}
		r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonAppliedMigrations, "Migrate",
			"Applied migrations to table %s: schema version %d to %d", s.table, current, version)
		s.newTable = current == 0
	}
	setMigrationsCondition(relay, migrationsObservation{version: version, latest: latest})
	return Result{}, nil
}
