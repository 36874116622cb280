// Package migrations holds the outbox table's versioned SQL templates, embedded: one file per
// version, NNNNN_what.sql, applied in order. They are text/template sources whose identifiers
// (the table, its derived objects) are filled in by package outboxdb, which renders and applies
// them (outboxdb/migrations.go); this package only carries them.
//
// A migration that changes a function redefines it whole (CREATE OR REPLACE FUNCTION), so a
// function's current definition is in the last migration that defines it: INDEX.md lists it for
// every function (regenerate with `go test ./migrations -update`; the test fails when it is stale).
package migrations

import "embed"

// FS holds the migration templates at its root, NNNNN_what.sql.
//
//go:embed *.sql
var FS embed.FS
