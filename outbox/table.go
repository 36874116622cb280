package outbox

import "github.com/outbox-operator/outbox-operator/internal/tablename"

// ErrInvalidTable is returned by New for a table name that is not a valid identifier
// (the rules of outboxdb.ParseTable, from the same package).
var ErrInvalidTable = tablename.ErrInvalid

// table is the outbox table the writer appends to.
type table struct{ tablename.Table }

func parseTable(s string) (table, error) {
	t, err := tablename.Parse(s)
	return table{t}, err
}

func (t table) ident() string { return t.Ident() }

// lockPrefix is the SQL literal prefixed to an aggregate id to form its advisory lock key. The
// name holds identifier characters only, so it needs no escaping.
func (t table) lockPrefix() string { return "'" + t.String() + ":'" }
