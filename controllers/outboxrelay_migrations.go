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
	"crypto/x509"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/migrations"
)

// OpenDB opens the database behind a libpq URL. It is the reconciler's default DB factory.
// Every connection plans the backlog statement as the relays do (migrations.PlanInIDOrder).
func OpenDB(ctx context.Context, dsn string) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("the database URL is not a valid libpq URL")
	}
	db := stdlib.OpenDB(*cfg, stdlib.OptionAfterConnect(func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, migrations.PlanInIDOrder)
		return err
	}))
	db.SetMaxOpenConns(2)
	db.SetMaxIdleConns(2)
	db.SetConnMaxIdleTime(time.Minute)
	return db, nil
}

// dbTarget identifies a database without its credentials.
type dbTarget struct {
	host     string
	port     uint16
	database string
}

// parseDBTarget reads host, port and database name from a libpq URL or keyword/value string.
// Its error never contains the input.
func parseDBTarget(dsn string) (dbTarget, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return dbTarget{}, errors.New("the value is not a valid libpq URL")
	}
	return dbTarget{host: strings.ToLower(cfg.Host), port: cfg.Port, database: cfg.Database}, nil
}

// redact removes the URL, its password and its user information from a message: a last line of
// defence, since messages are built from classified errors and never from the URL itself.
func redact(msg, dsn string) string {
	if dsn == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, dsn, "[redacted]")
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && len(p) >= 3 {
			msg = strings.ReplaceAll(msg, p, "[redacted]")
			msg = strings.ReplaceAll(msg, url.QueryEscape(p), "[redacted]")
		}
	}
	if cfg, err := pgconn.ParseConfig(dsn); err == nil && len(cfg.Password) >= 3 {
		msg = strings.ReplaceAll(msg, cfg.Password, "[redacted]")
	}
	return msg
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
	case errors.Is(err, migrations.ErrInvalidTable):
		return err.Error()
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
	t, err := migrations.ParseTable(qualifiedTable(relay.Spec.Database.Table))
	if err != nil {
		return fail(v1alpha1.ReasonInvalidTable, err.Error())
	}
	s.table = t

	ref := relay.Spec.Database.SecretRef
	key := string(ref.Key)
	if key == "" {
		key = v1alpha1.DefaultDatabaseURLKey
	}
	val, err := r.readSecretKey(ctx, relay.Namespace, string(ref.Name), key)
	if err != nil {
		var se *errSecret
		if errors.As(err, &se) {
			return fail(se.reason, "database: "+se.msg)
		}
		return Result{}, err
	}
	s.dbURL = string(val)
	s.secretValues[string(ref.Name)+"/"+key] = val
	target, err := parseDBTarget(s.dbURL)
	if err != nil {
		return fail(v1alpha1.ReasonInvalidDatabaseURL,
			fmt.Sprintf("Secret %q key %q: %s", ref.Name, key, err.Error()))
	}
	relay.Status.TableID = tableID(target, t)
	other, err := r.conflictingRelay(ctx, relay, t, target)
	if err != nil {
		return Result{}, err
	}
	if other != nil {
		msg := fmt.Sprintf("OutboxRelay %s/%s already relays table %s of the same database; this one stays idle",
			other.Namespace, other.Name, t)
		if !hasCondition(relay, v1alpha1.ConditionMigrationsApplied, metav1.ConditionFalse, v1alpha1.ReasonTableConflict, msg) {
			r.Recorder.Eventf(relay, other, corev1.EventTypeWarning, v1alpha1.ReasonTableConflict, "Claim", msg)
		}
		if err := r.deleteRelayDeployments(ctx, relay); err != nil {
			return Result{}, err
		}
		return fail(v1alpha1.ReasonTableConflict, msg)
	}
	return Result{}, nil
}

// tableID identifies a table of a database without credentials.
func tableID(target dbTarget, t migrations.Table) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d\x00%s\x00%s", target.host, target.port, target.database, t)))
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

// conflictingRelay returns an older OutboxRelay that relays the same table of the same database
// (same host, port and database name in its URL), or nil. Candidates come from the cache: the
// relays that claimed the same tableID, and those of the same table name that have not claimed
// one yet. Each candidate is confirmed by reading its own Secret, since its status may be stale.
func (r *OutboxRelayReconciler) conflictingRelay(ctx context.Context, relay *v1alpha1.OutboxRelay, t migrations.Table, target dbTarget) (*v1alpha1.OutboxRelay, error) {
	var claimed, unclaimed v1alpha1.OutboxRelayList
	if err := r.List(ctx, &claimed, client.MatchingFields{tableIDIndex: relay.Status.TableID}); err != nil {
		return nil, fmt.Errorf("while listing OutboxRelays of table %s: %w", t, err)
	}
	if err := r.List(ctx, &unclaimed, client.MatchingFields{tableIndex: t.String()}); err != nil {
		return nil, fmt.Errorf("while listing OutboxRelays of table %s: %w", t, err)
	}
	candidates := claimed.Items
	for _, o := range unclaimed.Items {
		if o.Status.TableID == "" {
			candidates = append(candidates, o)
		}
	}
	sort.Slice(candidates, func(i, j int) bool { return olderThan(&candidates[i], &candidates[j]) })
	for i := range candidates {
		other := &candidates[i]
		if other.UID == relay.UID || !other.DeletionTimestamp.IsZero() || !olderThan(other, relay) ||
			qualifiedTable(other.Spec.Database.Table) != t.String() {
			continue
		}
		ref := other.Spec.Database.SecretRef
		key := string(ref.Key)
		if key == "" {
			key = v1alpha1.DefaultDatabaseURLKey
		}
		val, err := r.readSecretKey(ctx, other.Namespace, string(ref.Name), key)
		if err != nil {
			var se *errSecret
			if errors.As(err, &se) {
				continue // the other relay cannot run either
			}
			return nil, err
		}
		if ot, err := parseDBTarget(string(val)); err == nil && ot == target {
			return other, nil
		}
	}
	return nil, nil
}

// ensureMigrations connects to the database and applies the embedded migrations of the table.
func (r *OutboxRelayReconciler) ensureMigrations(ctx context.Context, s *scope) (Result, error) {
	relay := s.relay
	unreachable := func(err error) (Result, error) {
		msg := redact("cannot reach the database: "+describeDBError(err), s.dbURL)
		setMigrationsCondition(relay, migrationsObservation{reason: v1alpha1.ReasonDatabaseUnreachable, message: msg})
		return Result{}, errors.New(msg) // backoff; the message is safe to log
	}
	db, err := r.dbs.get(ctx, types.NamespacedName{Namespace: relay.Namespace, Name: relay.Name}, s.dbURL, r.OpenDB)
	if err != nil {
		return unreachable(err)
	}
	s.db = db
	qctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	if err := db.PingContext(qctx); err != nil {
		return unreachable(err)
	}
	current, err := migrations.CurrentVersion(qctx, db, s.table)
	if err != nil {
		return unreachable(err)
	}
	latest := migrations.LatestVersion()
	if current > latest {
		setMigrationsCondition(relay, migrationsObservation{reason: v1alpha1.ReasonSchemaNewer, message: fmt.Sprintf(
			"table %s is at schema version %d, newer than %d of this operator: upgrade the operator", s.table, current, latest)})
		return Result{}, errWait
	}
	version := current
	if current < latest {
		mctx, cancel := context.WithTimeout(ctx, migrateTimeout)
		defer cancel()
		version, err = migrations.Apply(mctx, db, s.table)
		if err != nil {
			msg := redact(fmt.Sprintf("applying migrations to table %s failed: %s", s.table, describeDBError(err)), s.dbURL)
			setMigrationsCondition(relay, migrationsObservation{reason: v1alpha1.ReasonMigrationFailed, message: msg})
			r.Recorder.Eventf(relay, nil, corev1.EventTypeWarning, v1alpha1.ReasonMigrationFailed, "Migrate", msg)
			return Result{}, errors.New(msg)
		}
		r.Recorder.Eventf(relay, nil, corev1.EventTypeNormal, "AppliedMigrations", "Migrate",
			"Applied migrations to table %s: schema version %d to %d", s.table, current, version)
	}
	setMigrationsCondition(relay, migrationsObservation{version: version, latest: latest})
	return Result{}, nil
}
