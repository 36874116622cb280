// Package migrations holds the versioned, embedded SQL of the outbox schema and the small API
// that applies it and keeps its daily partitions.
//
// The outbox table's schema and name are parameters: every SQL file under sql/ is a template
// whose identifiers are filled in from a validated, quoted Table. Migrations are applied with
// goose under a PostgreSQL session advisory lock derived from the table, so several processes
// may apply at once and a re-run is a no-op. Each outbox table keeps its own version history in
// <schema>.<table>_schema_version.
package migrations

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/outbox-operator/outbox-operator/internal/tablename"
)

//go:embed sql/*.sql
var files embed.FS

// Buckets is the number of hash buckets aggregates are spread over (see BucketExpr).
// Shard k of N owns the buckets b with b % N == k, so N can be at most Buckets.
const Buckets = 256

// BucketExpr is the SQL expression of an outbox row's bucket: the function PostgreSQL's hash
// partitioning uses (stable across upgrades), over aggregate_id. Queries compute it; nothing
// stores it (migration 00006).
const BucketExpr = `(hashtextextended(aggregate_id, 0) & 255)::smallint`

// MaxNameLength bounds the table name so that every derived name fits PostgreSQL's 63 bytes.
const MaxNameLength = tablename.MaxNameLength

// ErrInvalidTable is returned for a table name that is not a valid identifier.
var ErrInvalidTable = tablename.ErrInvalid

// ErrPartitionHasPending is returned by DropPartition for a partition that still holds unsent rows.
var ErrPartitionHasPending = errors.New("partition still holds unsent events")

// ErrPartitionBusy is returned by DropPartition when a transaction still used the table and the
// lock the drop needs was not granted within its timeout; the partition is kept, try again later.
var ErrPartitionBusy = errors.New("a transaction still uses the table")

// Table names an outbox table: a schema and a table name, both validated identifiers
// (see package internal/tablename for its methods).
type Table = tablename.Table

// ParseTable parses "name" (schema public) or "schema.name". Both parts must match
// ^[a-z_][a-z0-9_]*$; the schema is at most 63 bytes and the name at most MaxNameLength.
func ParseTable(s string) (Table, error) { return tablename.Parse(s) }

// MustParseTable is ParseTable for constants; it panics on an invalid name.
func MustParseTable(s string) Table {
	t, err := ParseTable(s)
	if err != nil {
		panic(err)
	}
	return t
}

// migrationLockID is the session lock goose holds while it applies migrations.
func migrationLockID(t Table) int64 {
	h := fnv.New64a()
	h.Write([]byte("outbox-operator:migrations:" + t.String()))
	return int64(h.Sum64() >> 1)
}

func versionTable(t Table) string { return t.Schema + "." + t.Name + "_schema_version" }

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// params fills the SQL templates. Every value is quoted for the place it goes.
type params struct{ t Table }

func (p params) Table() string        { return p.t.Ident() }
func (p params) TableLit() string     { return quoteLiteral(p.t.Ident()) }
func (p params) Seq() string          { return p.t.Derived("id_seq") }
func (p params) SeqRegclass() string  { return quoteLiteral(p.t.Derived("id_seq")) }
func (p params) Default() string      { return p.t.Derived("default") }
func (p params) DefaultLit() string   { return quoteLiteral(p.t.Derived("default")) }
func (p params) PendingIndex() string { return pgx.Identifier{p.t.Name + "_pending_idx"}.Sanitize() }
func (p params) NotifyFunc() string   { return p.t.Derived("notify") }
func (p params) NotifyTrigger() string {
	return pgx.Identifier{p.t.Name + "_notify"}.Sanitize()
}
func (p params) ChannelLit() string { return quoteLiteral(p.t.Channel()) }
func (p params) LayoutNotificationLit() string {
	return quoteLiteral(LayoutNotification)
}
func (p params) Inbox() string           { return pgx.Identifier{p.t.Schema, "inbox"}.Sanitize() }
func (p params) NameLit() string         { return quoteLiteral(p.t.Name) }
func (p params) SchemaLit() string       { return quoteLiteral(p.t.Schema) }
func (p params) LockKey() string         { return strconv.Itoa(int(p.t.LockKey())) }
func (p params) Func(name string) string { return p.t.Derived(name) }

// Index is the name of an index of the table (created in the table's schema, so unqualified).
func (p params) Index(suffix string) string {
	return pgx.Identifier{p.t.Name + "_" + suffix}.Sanitize()
}

// BucketExpr is migrations.BucketExpr; BucketExprOf the same over the alias's aggregate_id.
func (p params) BucketExpr() string { return BucketExpr }
func (p params) BucketExprOf(alias string) string {
	return strings.Replace(BucketExpr, "aggregate_id", alias+".aggregate_id", 1)
}

// Regclass is the derived name as a literal, for functions that take a regclass (setval).
func (p params) Regclass(name string) string { return quoteLiteral(p.t.Derived(name)) }

type source struct {
	version int64
	name    string
	tmpl    *template.Template
}

var sources = mustLoad()

func mustLoad() []source {
	entries, err := fs.ReadDir(files, "sql")
	if err != nil {
		panic(err)
	}
	var out []source
	for _, e := range entries {
		name := e.Name()
		v, err := strconv.ParseInt(strings.SplitN(name, "_", 2)[0], 10, 64)
		if err != nil {
			panic(fmt.Sprintf("migrations: %s: file name must start with a version number", name))
		}
		text, err := files.ReadFile(path.Join("sql", name))
		if err != nil {
			panic(err)
		}
		out = append(out, source{version: v, name: name,
			tmpl: template.Must(template.New(name).Option("missingkey=error").Parse(string(text)))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out
}

// LatestVersion is the version of the newest embedded migration.
func LatestVersion() int64 { return sources[len(sources)-1].version }

// Render returns the SQL of every migration for t, in order, as it would be applied.
func Render(t Table) ([]string, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(sources))
	for _, s := range sources {
		var b bytes.Buffer
		if err := s.tmpl.Execute(&b, params{t}); err != nil {
			return nil, fmt.Errorf("migrations: render %s: %w", s.name, err)
		}
		out = append(out, b.String())
	}
	return out, nil
}

// Apply brings the schema of t up to LatestVersion and returns the version now applied.
// It is safe to call from several processes at once and to call again.
func Apply(ctx context.Context, db *sql.DB, t Table) (int64, error) {
	rendered, err := Render(t)
	if err != nil {
		return 0, err
	}
	if err := ensureSchema(ctx, db, t); err != nil {
		return 0, err
	}
	migs := make([]*goose.Migration, len(sources))
	for i, s := range sources {
		stmt := rendered[i]
		migs[i] = goose.NewGoMigration(s.version, &goose.GoFunc{
			RunTx: func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("%s: %w", s.name, err)
				}
				return nil
			},
		}, nil)
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID(t)))
	if err != nil {
		return 0, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, nil,
		goose.WithDisableGlobalRegistry(true),
		goose.WithGoMigrations(migs...),
		goose.WithSessionLocker(locker),
		goose.WithTableName(versionTable(t)),
		goose.WithLogger(goose.NopLogger()),
	)
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return 0, fmt.Errorf("migrations: apply to %s: %w", t, err)
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrations: read version of %s: %w", t, err)
	}
	return v, nil
}

// ensureSchema creates the table's schema, which must exist before goose creates its version
// table in it.
func ensureSchema(ctx context.Context, db *sql.DB, t Table) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", migrationLockID(t)); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := tx.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{t.Schema}.Sanitize()); err != nil {
		return fmt.Errorf("migrations: create schema %s: %w", t.Schema, err)
	}
	return tx.Commit()
}

// CurrentVersion returns the applied version of t's schema, 0 when nothing is applied.
func CurrentVersion(ctx context.Context, db *sql.DB, t Table) (int64, error) {
	if err := t.Validate(); err != nil {
		return 0, err
	}
	var exists bool
	if err := db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL",
		pgx.Identifier{t.Schema, t.Name + "_schema_version"}.Sanitize()).Scan(&exists); err != nil {
		return 0, err
	}
	if !exists {
		return 0, nil
	}
	var v int64
	err := db.QueryRowContext(ctx, fmt.Sprintf(
		"SELECT coalesce(max(version_id), 0) FROM %s WHERE is_applied",
		pgx.Identifier{t.Schema, t.Name + "_schema_version"}.Sanitize())).Scan(&v)
	return v, err
}

// Partition is one partition of the outbox table.
type Partition struct {
	Name       string
	Day        time.Time // UTC midnight; zero for the default partition
	Default    bool
	HasPending bool
}

// EnsurePartitions creates the daily partitions for the UTC days from..to (inclusive) that do not
// exist yet, and returns the names it created.
func EnsurePartitions(ctx context.Context, db *sql.DB, t Table, from, to time.Time) ([]string, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, fmt.Sprintf("SELECT * FROM %s($1::date, $2::date)", t.Derived("create_partitions")),
		from.UTC().Format(time.DateOnly), to.UTC().Format(time.DateOnly))
	if err != nil {
		return nil, fmt.Errorf("create partitions of %s: %w", t, err)
	}
	return scanNames(rows)
}

// ListPartitions returns the daily partitions, oldest first, then the default partition.
func ListPartitions(ctx context.Context, db *sql.DB, t Table) ([]Partition, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, fmt.Sprintf("SELECT name, day, has_pending FROM %s()", t.Derived("partitions")))
	if err != nil {
		return nil, fmt.Errorf("list partitions of %s: %w", t, err)
	}
	defer rows.Close()
	var out []Partition
	for rows.Next() {
		var p Partition
		if err := rows.Scan(&p.Name, &p.Day, &p.HasPending); err != nil {
			return nil, err
		}
		p.Day = p.Day.UTC()
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var pending bool
	if err := db.QueryRowContext(ctx, fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE sent_at IS NULL)",
		t.Derived("default"))).Scan(&pending); err != nil {
		return nil, fmt.Errorf("list partitions of %s: %w", t, err)
	}
	return append(out, Partition{Name: t.Name + "_default", Default: true, HasPending: pending}), nil
}

// DroppablePartitions returns the daily partitions whose whole day ended more than retention
// ago and whose rows are all sent.
func DroppablePartitions(ctx context.Context, db *sql.DB, t Table, retention time.Duration) ([]string, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, fmt.Sprintf("SELECT * FROM %s(make_interval(secs => $1))", t.Derived("droppable_partitions")),
		retention.Seconds())
	if err != nil {
		return nil, fmt.Errorf("droppable partitions of %s: %w", t, err)
	}
	return scanNames(rows)
}

// DropPartition drops one daily partition unless a row in it is unsent, in which case it returns
// ErrPartitionHasPending and keeps it. The drop needs the outbox's ACCESS EXCLUSIVE lock for an
// instant; it waits for it at most 250 ms (inserts that arrive meanwhile queue behind it) and
// returns ErrPartitionBusy past that: a transaction still uses the table, try again later.
func DropPartition(ctx context.Context, db *sql.DB, t Table, name string) error {
	if err := t.Validate(); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, fmt.Sprintf("SELECT %s($1)", t.Derived("drop_partition")), name)
	return dropError(name, err)
}

// dropError translates what PostgreSQL said when a partition was not dropped.
func dropError(name string, err error) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == "55006":
		return fmt.Errorf("drop %s: %w", name, ErrPartitionHasPending)
	case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available
		return fmt.Errorf("drop %s: the lock it needs was not granted within the lock timeout: %w", name, ErrPartitionBusy)
	}
	return fmt.Errorf("drop partition %s: %w", name, err)
}

func scanNames(rows *sql.Rows) ([]string, error) {
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
