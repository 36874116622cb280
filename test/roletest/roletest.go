// Package roletest runs the parts of outbox-operator as PostgreSQL login roles that hold only
// the privileges outboxdb.GrantSQL renders (docs/privileges.md): no SUPERUSER, REPLICATION,
// CREATEDB, CREATEROLE or BYPASSRLS, in a database whose PUBLIC privileges are revoked.
//
//	db := roletest.New(t, table, nil)       // the roles, the database, the administrator's part
//	db.Migrate(t, 1)                        // the schema and partitions as the owner, then its grants
//	pool := db.Pool(t, db.Roles.Relay)      // a session as the relay's role
package roletest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// Admin is the role name DB's methods take for the server's superuser (the administrator).
const Admin = ""

// DB is a fresh database on the package's pgtest server with one login role per part.
type DB struct {
	Table outboxdb.Table
	Roles outboxdb.Roles
	// AdminURL is the database's URL as the server's superuser.
	AdminURL string
}

var counter atomic.Int64

// Options adjust New.
type Options struct {
	// SkipAdmin leaves out the administrator's statements it returns true for.
	SkipAdmin func(outboxdb.Privilege) bool
}

// New creates the roles, then the database, revokes what PUBLIC holds in it by default (CONNECT
// and TEMPORARY on the database, every privilege on the public schema) and runs the
// administrator's part of the script as the superuser. The roles are dropped after the database.
func New(t testing.TB, table outboxdb.Table, opts *Options) *DB {
	t.Helper()
	if opts == nil {
		opts = &Options{}
	}
	srv := pgtest.Shared(t)
	n := counter.Add(1)
	name := func(part string) string { return fmt.Sprintf("%s_%d_%d", part, os.Getpid(), n) }
	d := &DB{Table: table, Roles: outboxdb.Roles{
		Owner: name("owner"), Relay: name("relay"), Writer: name("writer"), Consumer: name("consumer"), Reader: name("reader"),
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, r := range d.all() {
		if _, err := conn.Exec(ctx, "CREATE ROLE "+pgx.Identifier{r}.Sanitize()+
			" LOGIN NOSUPERUSER NOREPLICATION NOCREATEDB NOCREATEROLE NOBYPASSRLS"); err != nil {
			t.Fatal(err)
		}
	}
	// Registered before the database's removal, so run after it (the roles own its objects).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, srv.URL("postgres"))
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		for _, r := range d.all() {
			_, _ = conn.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{r}.Sanitize())
		}
	})
	d.AdminURL = srv.NewDatabase(t)
	d.Exec(t, Admin, `DO $x$ BEGIN EXECUTE format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database()); END $x$`)
	d.Exec(t, Admin, `REVOKE ALL ON SCHEMA public FROM PUBLIC`)
	ps, err := outboxdb.Privileges(table, d.Roles)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.By == outboxdb.ByAdmin && (opts.SkipAdmin == nil || !opts.SkipAdmin(p)) {
			d.Exec(t, Admin, p.SQL)
		}
	}
	return d
}

func (d *DB) all() []string {
	return []string{d.Roles.Owner, d.Roles.Relay, d.Roles.Writer, d.Roles.Consumer, d.Roles.Reader}
}

// URL returns the database's URL as role (Admin: the superuser).
func (d *DB) URL(role string) string {
	if role == Admin {
		return d.AdminURL
	}
	u, err := url.Parse(d.AdminURL)
	if err != nil {
		panic(err)
	}
	u.User = url.User(role)
	return u.String()
}

// Exec runs sql (several statements when args is empty) as role, failing the test on error.
func (d *DB) Exec(t testing.TB, role, sql string, args ...any) {
	t.Helper()
	if err := d.TryExec(role, sql, args...); err != nil {
		t.Fatalf("as %s: %s: %v", roleName(role), sql, err)
	}
}

// TryExec runs sql as role and returns its error.
func (d *DB) TryExec(role, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.URL(role))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

func roleName(role string) string {
	if role == Admin {
		return "the superuser"
	}
	return role
}

// SQL opens a database/sql handle as role, closed when the test ends.
func (d *DB) SQL(t testing.TB, role string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", d.URL(role))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Pool opens a pgx pool as role, closed when the test ends.
func (d *DB) Pool(t testing.TB, role string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), d.URL(role))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Migrate applies the schema as the owner (outboxdb.Apply), creates the daily partitions from
// daysBack days ago to tomorrow as the owner (none when daysBack < 0), and runs the owner's part
// of the script as the owner.
func (d *DB) Migrate(t testing.TB, daysBack int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := d.SQL(t, d.Roles.Owner)
	if _, err := outboxdb.Apply(ctx, db, d.Table); err != nil {
		t.Fatalf("outboxdb.Apply as the owner %s: %v", d.Roles.Owner, err)
	}
	if daysBack >= 0 {
		today := time.Now().UTC().Truncate(24 * time.Hour)
		if _, err := outboxdb.EnsurePartitions(ctx, db, d.Table, today.AddDate(0, 0, -daysBack), today.AddDate(0, 0, 1)); err != nil {
			t.Fatalf("outboxdb.EnsurePartitions as the owner %s: %v", d.Roles.Owner, err)
		}
	}
	d.GrantAsOwner(t)
}

// GrantAsOwner runs the owner's part of the script as the owner.
func (d *DB) GrantAsOwner(t testing.TB) {
	t.Helper()
	script, err := outboxdb.OwnerGrantSQL(d.Table, d.Roles)
	if err != nil {
		t.Fatal(err)
	}
	d.Exec(t, d.Roles.Owner, script)
}

// CheckRoles fails the test unless every role is a plain login role: no superuser, replication,
// database or role creation, no row-level security bypass, member of no role but
// pg_read_all_stats (the owner), and owning no schema but the table's (the owner) and no database.
func (d *DB) CheckRoles(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, r := range d.all() {
		var attrs, member []string
		var schemas, dbs int
		err := conn.QueryRow(ctx, `SELECT
  array_remove(ARRAY[CASE WHEN rolsuper THEN 'SUPERUSER' END, CASE WHEN rolreplication THEN 'REPLICATION' END,
    CASE WHEN rolcreatedb THEN 'CREATEDB' END, CASE WHEN rolcreaterole THEN 'CREATEROLE' END,
    CASE WHEN rolbypassrls THEN 'BYPASSRLS' END, CASE WHEN NOT rolcanlogin THEN 'NOLOGIN' END], NULL),
  ARRAY(SELECT g.rolname::text FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid ORDER BY 1),
  (SELECT count(*) FROM pg_namespace WHERE nspowner = r.oid), (SELECT count(*) FROM pg_database WHERE datdba = r.oid)
FROM pg_roles r WHERE rolname = $1`, r).Scan(&attrs, &member, &schemas, &dbs)
		if err != nil {
			t.Fatal(err)
		}
		wantMember, wantSchemas := "[]", 0
		if r == d.Roles.Owner {
			wantMember = "[pg_read_all_stats]"
			if d.Table.Schema != "public" {
				wantSchemas = 1
			}
		}
		if len(attrs) > 0 || fmt.Sprint(member) != wantMember || schemas != wantSchemas || dbs != 0 {
			t.Errorf("role %s: attributes %v, member of %v (want %s), owns %d schemas (want %d) and %d databases",
				r, attrs, member, wantMember, schemas, wantSchemas, dbs)
		}
	}
}
