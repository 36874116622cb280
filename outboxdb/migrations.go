// The outbox schema: versioned, embedded SQL templates applied with goose.
//
// The outbox table's schema and name are parameters: every SQL file of package migrations (the
// top-level migrations/ folder) is a template whose identifiers are filled in from a validated,
// quoted Table. Migrations are applied with goose under a PostgreSQL session advisory lock
// derived from the table, so several processes may apply at once and a re-run is a no-op. Each
// outbox table keeps its own version history in <schema>.<table>_schema_version.

package outboxdb

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"hash/fnv"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/outbox-operator/outbox-operator/internal/tablename"
	"github.com/outbox-operator/outbox-operator/migrations"
)

// Buckets is the number of hash buckets aggregates are spread over (see BucketExpr).
// Shard k of N owns the buckets b with b % N == k, so N can be at most Buckets.
const Buckets = 256

// BucketExpr is the SQL expression of an outbox row's bucket: the function PostgreSQL's hash
// partitioning uses (stable across upgrades), over aggregate_id. Queries compute it; nothing
// stores it (migration 00006).
const BucketExpr = `(hashtextextended(aggregate_id, 0) & 255)::smallint`

// BucketExprOf is BucketExpr over <alias>.aggregate_id, for statements that name the table by an
// alias (a join, a correlated subquery).
func BucketExprOf(alias string) string { return BucketOf(alias + ".aggregate_id") }

// BucketOf is BucketExpr over a text expression in place of aggregate_id: the bucket an aggregate
// id so computed falls in.
func BucketOf(expr string) string { return strings.Replace(BucketExpr, "aggregate_id", expr, 1) }

// MaxNameLength bounds the table name so that every derived name fits PostgreSQL's 63 bytes.
const MaxNameLength = tablename.MaxNameLength

// ErrInvalidTable is returned for a table name that is not a valid identifier.
var ErrInvalidTable = tablename.ErrInvalid

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

// QuoteLiteral quotes s as an SQL string literal (standard_conforming_strings, the default since
// PostgreSQL 9.1: a quote is doubled, a backslash is an ordinary character).
func QuoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// params fills the SQL templates. Every value is quoted for the place it goes.
type params struct{ t Table }

func (p params) Table() string        { return p.t.Ident() }
func (p params) TableLit() string     { return QuoteLiteral(p.t.Ident()) }
func (p params) Seq() string          { return p.t.Derived("id_seq") }
func (p params) SeqRegclass() string  { return QuoteLiteral(p.t.Derived("id_seq")) }
func (p params) Default() string      { return p.t.Derived("default") }
func (p params) DefaultLit() string   { return QuoteLiteral(p.t.Derived("default")) }
func (p params) PendingIndex() string { return pgx.Identifier{pendingIndex.name(p.t)}.Sanitize() }
func (p params) NotifyFunc() string   { return p.t.Derived("notify") }
func (p params) NotifyTrigger() string {
	return pgx.Identifier{p.t.Name + "_notify"}.Sanitize()
}
func (p params) ChannelLit() string { return QuoteLiteral(p.t.Channel()) }
func (p params) LayoutNotificationLit() string {
	return QuoteLiteral(LayoutNotification)
}
func (p params) Inbox() string     { return pgx.Identifier{p.t.Schema, "inbox"}.Sanitize() }
func (p params) NameLit() string   { return QuoteLiteral(p.t.Name) }
func (p params) SchemaLit() string { return QuoteLiteral(p.t.Schema) }
func (p params) LockKey() string   { return strconv.Itoa(int(p.t.LockKey())) }

// LockPrefixLit is the literal prefixed to an aggregate id to form its advisory lock key, the
// writer library's (outbox/table.go lockPrefix): '<schema>.<table>:'.
func (p params) LockPrefixLit() string   { return QuoteLiteral(p.t.String() + ":") }
func (p params) Func(name string) string { return p.t.Derived(name) }

// Index is the name of an index of the table (created in the table's schema, so unqualified).
func (p params) Index(suffix string) string {
	return pgx.Identifier{p.t.Name + "_" + suffix}.Sanitize()
}

// ConstraintLit is the name of a constraint of the table as PostgreSQL names it (<table>_<suffix>),
// as a literal.
func (p params) ConstraintLit(suffix string) string { return QuoteLiteral(p.t.Name + "_" + suffix) }

// BucketExpr is outboxdb.BucketExpr; BucketExprOf is outboxdb.BucketExprOf.
func (p params) BucketExpr() string               { return BucketExpr }
func (p params) BucketExprOf(alias string) string { return BucketExprOf(alias) }

// Regclass is the derived name as a literal, for functions that take a regclass (setval).
func (p params) Regclass(name string) string { return QuoteLiteral(p.t.Derived(name)) }

type source struct {
	version int64
	name    string
	tmpl    *template.Template
}

var sources = mustLoad()

func mustLoad() []source {
	entries, err := fs.ReadDir(migrations.FS, ".")
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
		text, err := migrations.FS.ReadFile(name)
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
// It is safe to call from several processes at once and to call again. A server older than
// MinServerVersion is refused (an *UnsupportedServerError) before anything is applied.
func Apply(ctx context.Context, db *sql.DB, t Table) (int64, error) {
	return ApplyTo(ctx, db, t, LatestVersion())
}

// ApplyTo is Apply up to version (at most LatestVersion), as a release whose newest migration is
// that version would apply it: the upgrade tests start from the previous release's schema so.
func ApplyTo(ctx context.Context, db *sql.DB, t Table, version int64) (int64, error) {
	rendered, err := Render(t)
	if err != nil {
		return 0, err
	}
	if err := CheckServerVersion(ctx, db); err != nil {
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
	if _, err := p.UpTo(ctx, version); err != nil {
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
	// CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even where the schema exists, so
	// a schema a DBA created for the owner (docs/privileges.md) is not created again.
	var exists bool
	if err := tx.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)", t.Schema).Scan(&exists); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if exists {
		return tx.Commit()
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
