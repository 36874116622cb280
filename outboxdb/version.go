package outboxdb

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
)

// MinServerVersion is the oldest PostgreSQL major version outbox-operator supports: the one
// place the minimum is defined (the schema, the relay's statements and the version matrix of
// make test-pg start there).
const MinServerVersion = 13

// UnsupportedServerError is a server older than MinServerVersion.
type UnsupportedServerError struct {
	VersionNum int // the server's server_version_num, e.g. 120022
}

func (e *UnsupportedServerError) Error() string {
	return fmt.Sprintf("PostgreSQL %s is not supported: outbox-operator needs PostgreSQL %d or later",
		versionString(e.VersionNum), MinServerVersion)
}

// versionString renders a server_version_num as PostgreSQL writes the version: 120022 is
// "12.22", 90624 (before 10) "9.6.24".
func versionString(num int) string {
	if num < 100000 {
		return fmt.Sprintf("%d.%d.%d", num/10000, num/100%100, num%100)
	}
	return fmt.Sprintf("%d.%d", num/10000, num%10000)
}

// CheckVersionNum returns an *UnsupportedServerError when server_version_num num is older than
// MinServerVersion, nil otherwise.
func CheckVersionNum(num int) error {
	if num < MinServerVersion*10000 {
		return &UnsupportedServerError{VersionNum: num}
	}
	return nil
}

// serverVersionNumSQL reads the server's version as a number.
const serverVersionNumSQL = `SELECT current_setting('server_version_num')`

// CheckServerVersion returns an *UnsupportedServerError when db's server is older than
// MinServerVersion. Apply calls it before it applies anything.
func CheckServerVersion(ctx context.Context, db *sql.DB) error {
	var s string
	if err := db.QueryRowContext(ctx, serverVersionNumSQL).Scan(&s); err != nil {
		return fmt.Errorf("reading the server's version: %w", err)
	}
	return checkVersionText(s)
}

// CheckServerVersionConn is CheckServerVersion on a pgx connection (the relay's, when it
// connects).
func CheckServerVersionConn(ctx context.Context, q Querier) error {
	var s string
	if err := q.QueryRow(ctx, serverVersionNumSQL).Scan(&s); err != nil {
		return fmt.Errorf("reading the server's version: %w", err)
	}
	return checkVersionText(s)
}

func checkVersionText(s string) error {
	num, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("reading the server's version: server_version_num %q: %w", s, err)
	}
	return CheckVersionNum(num)
}
