package controllers

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestCheckDatabaseURL(t *testing.T) {
	for dsn, ok := range map[string]bool{
		"postgres://u:p@DB.example:6543/shop?sslmode=disable":             true,
		"host=db port=5433 dbname=shop user=u password=p sslmode=disable": true,
		"postgres://u:p@db:notaport/shop":                                 false,
	} {
		err := checkDatabaseURL(dsn)
		if (err == nil) != ok {
			t.Errorf("%s: %v", dsn, err)
		}
		if err != nil && (strings.Contains(err.Error(), "u:p") || strings.Contains(err.Error(), "notaport")) {
			t.Errorf("error repeats the input: %v", err)
		}
	}
}

func TestRedact(t *testing.T) {
	dsn := "postgres://outbox:s3cr3t%21pw@db:5432/shop?sslmode=disable"
	msg := "failed: " + dsn + " and s3cr3t!pw and s3cr3t%21pw"
	got := redact(msg, dsn)
	for _, leak := range []string{dsn, "s3cr3t!pw", "s3cr3t%21pw"} {
		if strings.Contains(got, leak) {
			t.Errorf("redact left %q in %q", leak, got)
		}
	}
	if redact("plain", "") != "plain" {
		t.Error("redact without a URL changed the message")
	}
}

func TestDescribeDBError(t *testing.T) {
	tests := map[string]struct {
		err  error
		want string
	}{
		"server error":  {&pgconn.PgError{Code: "42501", Message: "permission denied for schema public"}, "permission denied for schema public (SQLSTATE 42501)"},
		"refused":       {fmt.Errorf("dial: %w", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), "connection refused"},
		"dns":           {&net.DNSError{Err: "no such host", Name: "db.secret-host.internal"}, "host name not found"},
		"timeout":       {fmt.Errorf("x: %w", context.DeadlineExceeded), "timed out"},
		"unknown":       {errors.New("failed to connect to `user=outbox database=shop`: weird"), "unexpected database error"},
		"invalid table": {fmt.Errorf("%w: table %q", outboxdb.ErrInvalidTable, "X"), "invalid outbox table name"},
		"old server": {fmt.Errorf("x: %w", &outboxdb.UnsupportedServerError{VersionNum: 120022}),
			"PostgreSQL 12.22 is not supported: outbox-operator needs PostgreSQL 13 or later"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := describeDBError(tc.err)
			if !strings.Contains(got, tc.want) {
				t.Errorf("describeDBError = %q, want %q", got, tc.want)
			}
			if strings.Contains(got, "user=") || strings.Contains(got, "secret-host") {
				t.Errorf("connection details in %q", got)
			}
		})
	}
}

// TestEnsureMigrations runs the migrations step against a real PostgreSQL: it applies the schema
// once, says so once, and then only checks the version.
func TestEnsureMigrations(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	e := newStepEnvURL(t, url, "shop.events")
	var opened int
	e.r.OpenDB = func(ctx context.Context, dsn string) (*sql.DB, error) {
		opened++
		return OpenDB(ctx, dsn)
	}
	for pass := 1; pass <= 2; pass++ {
		e.s.db = nil
		if _, err := e.connectAndMigrate(ctx); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		checkCondition(t, e.s.relay, v1alpha1.ConditionMigrationsApplied,
			wantCondition{metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied, fmt.Sprint(outboxdb.LatestVersion())})
		evs := drain(e.rec)
		if want := map[int]int{1: 1, 2: 0}[pass]; len(evs) != want {
			t.Errorf("pass %d events %q, want %d", pass, evs, want)
		}
	}
	if opened != 1 {
		t.Errorf("DB factory called %d times in two passes, want 1: the second pass reuses the handle", opened)
	}
	db := openTestDB(t, url)
	for _, name := range []string{"shop.events", "shop.events_default", "shop.events_pending_idx", "shop.inbox", "shop.events_schema_version"} {
		if !regclassExists(t, db, name) {
			t.Errorf("%s missing", name)
		}
	}
	if e.s.relay.Status.SchemaVersion != outboxdb.LatestVersion() {
		t.Errorf("schemaVersion %d", e.s.relay.Status.SchemaVersion)
	}

	// A schema newer than the operator: stop, do not touch it.
	if _, err := db.Exec(`INSERT INTO shop.events_schema_version (version_id, is_applied) VALUES ($1, true)`, outboxdb.LatestVersion()+1); err != nil {
		t.Fatal(err)
	}
	e.s.db = nil
	if _, err := e.connectAndMigrate(ctx); !errors.Is(err, errWait) {
		t.Fatalf("newer schema: %v, want errWait", err)
	}
	checkCondition(t, e.s.relay, v1alpha1.ConditionMigrationsApplied, wantCondition{metav1.ConditionFalse, v1alpha1.ReasonSchemaNewer, "upgrade the operator"})
}

func TestEnsureMigrationsDatabaseDown(t *testing.T) {
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	url := srv.NewDatabase(t)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	e := newStepEnvURL(t, url, "outbox")
	start := time.Now()
	_, err = e.connectAndMigrate(context.Background())
	if err == nil || errors.Is(err, errWait) {
		t.Fatalf("database down: %v, want an error (backoff)", err)
	}
	if time.Since(start) > 15*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
	checkCondition(t, e.s.relay, v1alpha1.ConditionMigrationsApplied, wantCondition{metav1.ConditionFalse, v1alpha1.ReasonDatabaseUnreachable, "connection refused"})
	if strings.Contains(err.Error(), url) || strings.Contains(err.Error(), "user=") {
		t.Errorf("error carries connection details: %v", err)
	}

	// Back up: the next pass succeeds.
	if err := srv.StartAgain(); err != nil {
		t.Fatal(err)
	}
	e.s.db = nil
	if _, err := e.connectAndMigrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkCondition(t, e.s.relay, v1alpha1.ConditionMigrationsApplied, wantCondition{metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied, ""})
}

// connectAndMigrate runs, as a pass does, the connection and the migrations steps.
func (e *stepEnv) connectAndMigrate(ctx context.Context) (Result, error) {
	if res, err := e.r.connectDatabase(ctx, e.s); err != nil {
		return res, err
	}
	return e.r.ensureMigrations(ctx, e.s)
}

// newStepEnvURL is a step environment on an unmigrated database at url.
func newStepEnvURL(t *testing.T, url, table string) *stepEnv {
	t.Helper()
	return newStepEnvOn(t, time.Now(), url, table, false)
}
