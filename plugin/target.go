package plugin

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// queryTimeout bounds each statement the plugin runs (a startup parameter of its session).
const queryTimeout = 30 * time.Second

// target is one OutboxRelay and a connection to its database.
type target struct {
	kube  *kube
	relay *v1alpha1.OutboxRelay
	table outboxdb.Table
	db    *sql.DB
}

// open finds the OutboxRelay name, reads its database URL and connects. The caller closes it.
func (o *Options) open(ctx context.Context, name string) (*target, error) {
	k, err := o.kube()
	if err != nil {
		return nil, err
	}
	r, err := k.relay(ctx, name)
	if err != nil {
		return nil, err
	}
	table := r.Spec.Database.Table
	if table == "" {
		table = "outbox"
	}
	t, err := outboxdb.ParseTable(table)
	if err != nil {
		return nil, fmt.Errorf("OutboxRelay %s/%s: spec.database.table: %w", r.Namespace, r.Name, err)
	}
	url, red, err := k.databaseURL(ctx, r)
	if err != nil {
		return nil, err
	}
	o.red = red
	db, err := connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connecting to the database of OutboxRelay %s/%s: %w", r.Namespace, r.Name, err)
	}
	return &target{kube: k, relay: r, table: t, db: db}, nil
}

func (t *target) Close() error { return t.db.Close() }

// connect opens the database named by url as kubectl-outbox, with a statement timeout.
func connect(ctx context.Context, url string) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, errors.New("cannot parse the database URL (details withheld: they could contain the password)")
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "kubectl-outbox"
	}
	cfg.RuntimeParams["statement_timeout"] = fmt.Sprint(queryTimeout.Milliseconds())
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > 15*time.Second {
		cfg.ConnectTimeout = 15 * time.Second
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(2)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// schemaReady fails with a clear message when the table's schema lacks the migration the
// plugin needs (the operator applies it; an older operator has not).
func (t *target) schemaReady(ctx context.Context) (int64, error) {
	v, err := outboxdb.CurrentVersion(ctx, t.db, t.table)
	if err != nil {
		return 0, fmt.Errorf("reading the schema version of %s: %w", t.table, err)
	}
	if v < actionsMigration {
		return v, fmt.Errorf("the schema of %s is at version %d; kubectl outbox needs version %d or later (the operator applies it: upgrade the operator)",
			t.table, v, actionsMigration)
	}
	return v, nil
}

// actionsMigration is the migration that records skips and retries (00013_operator_actions.sql).
const actionsMigration = 13

// snapshotTracked reports whether the table is tracked by snapshot: a cursor row exists
// (row tracking leaves the cursor table empty).
func (t *target) snapshotTracked(ctx context.Context) ([]outboxdb.CursorRow, bool, error) {
	rows, err := outboxdb.ReadCursor(ctx, t.db, t.table)
	if err != nil {
		return nil, false, err
	}
	return rows, len(rows) > 0, nil
}

// trackingOf returns the tracking mode snapshotTracked found.
func trackingOf(snapshot bool) contract.Tracking {
	if snapshot {
		return contract.TrackSnapshot
	}
	return contract.TrackRow
}

// topicOf returns the topic the relay publishes an aggregate type to, "" when none.
func topicOf(r *v1alpha1.OutboxRelay, aggType string) string {
	if t, ok := r.Spec.Topics[aggType]; ok {
		return string(t)
	}
	return string(r.Spec.DefaultTopic)
}

// withTarget checks the output format, opens the OutboxRelay name and its database, runs fn and
// closes them: what every command that reads the table does first.
func (o *Options) withTarget(ctx context.Context, name string, fn func(t *target) error) error {
	if err := o.checkOutput(); err != nil {
		return err
	}
	t, err := o.open(ctx, name)
	if err != nil {
		return err
	}
	defer t.Close()
	return fn(t)
}
