// Package tablename holds the rules for naming an outbox table, shared by the schema (migrations),
// the relay and the writer library. It depends on pgx only, so that applications importing the
// writer do not pull in the migration tooling.
package tablename

import (
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// MaxNameLength bounds the table name so that every name derived from it
// (<table>_create_partitions, <table>_pYYYYMMDD, ...) stays within PostgreSQL's 63 bytes.
const MaxNameLength = 40

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// ErrInvalid is returned for a table name that is not a valid identifier.
var ErrInvalid = errors.New("invalid outbox table name")

// Table names an outbox table: a schema and a table name, both validated identifiers.
type Table struct {
	Schema string
	Name   string
}

// Parse parses "name" (schema public) or "schema.name". Both parts must match
// ^[a-z_][a-z0-9_]*$; the schema is at most 63 bytes and the name at most MaxNameLength.
func Parse(s string) (Table, error) {
	schema, name, found := strings.Cut(s, ".")
	if !found {
		schema, name = "public", s
	}
	t := Table{Schema: schema, Name: name}
	return t, t.Validate()
}

// Validate reports whether both parts are valid identifiers.
func (t Table) Validate() error {
	if !identRE.MatchString(t.Schema) || len(t.Schema) > 63 {
		return fmt.Errorf("%w: schema %q must match ^[a-z_][a-z0-9_]*$ and have at most 63 characters", ErrInvalid, t.Schema)
	}
	if !identRE.MatchString(t.Name) || len(t.Name) > MaxNameLength {
		return fmt.Errorf("%w: table %q must match ^[a-z_][a-z0-9_]*$ and have at most %d characters", ErrInvalid, t.Name, MaxNameLength)
	}
	return nil
}

// String returns schema.name, unquoted, for logs and messages.
func (t Table) String() string { return t.Schema + "." + t.Name }

// Ident returns the quoted, schema-qualified name for SQL.
func (t Table) Ident() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// Derived returns the quoted, schema-qualified name of an object derived from the table,
// <schema>.<table>_<suffix>.
func (t Table) Derived(suffix string) string {
	return pgx.Identifier{t.Schema, t.Name + "_" + suffix}.Sanitize()
}

// Channel is the LISTEN/NOTIFY channel the table's insert trigger notifies: "<schema>.<table>".
// Quote it with pgx.Identifier when used in a LISTEN statement.
func (t Table) Channel() string { return t.Schema + "." + t.Name }

// LockKey is the first key of the relay's bucket locks, pg_advisory_lock(LockKey(), bucket), and
// of the schema's own locks (bucket -1 for partition upkeep).
func (t Table) LockKey() int32 {
	h := fnv.New32a()
	h.Write([]byte("outbox-operator:" + t.String()))
	return int32(h.Sum32())
}
