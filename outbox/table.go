package outbox

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The table name rules are those of migrations.ParseTable (a test keeps them in step). They are
// repeated here because package migrations brings goose and database/sql into every application
// that would import it, and this package depends on pgx only.

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// maxTableNameLength is migrations.MaxNameLength.
const maxTableNameLength = 40

// ErrInvalidTable is returned by New for a table name that is not a valid identifier.
var ErrInvalidTable = errors.New("outbox: invalid table name")

type table struct{ schema, name string }

// parseTable parses "name" (schema public) or "schema.name".
func parseTable(s string) (table, error) {
	schema, name, found := strings.Cut(s, ".")
	if !found {
		schema, name = "public", s
	}
	if !identRE.MatchString(schema) || len(schema) > 63 {
		return table{}, fmt.Errorf("%w: schema %q must match ^[a-z_][a-z0-9_]*$ and have at most 63 characters", ErrInvalidTable, schema)
	}
	if !identRE.MatchString(name) || len(name) > maxTableNameLength {
		return table{}, fmt.Errorf("%w: table %q must match ^[a-z_][a-z0-9_]*$ and have at most %d characters", ErrInvalidTable, name, maxTableNameLength)
	}
	return table{schema: schema, name: name}, nil
}

func (t table) String() string { return t.schema + "." + t.name }

func (t table) ident() string { return pgx.Identifier{t.schema, t.name}.Sanitize() }

// lockPrefix is the SQL literal prefixed to an aggregate id to form its advisory lock key. The
// name holds identifier characters only, so it needs no escaping.
func (t table) lockPrefix() string { return "'" + t.String() + ":'" }
