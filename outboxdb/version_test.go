package outboxdb_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestCheckVersionNum(t *testing.T) {
	const needs = ": outbox-operator needs PostgreSQL 13 or later"
	tests := []struct {
		num  int
		want string // "" when supported
	}{
		{num: 90624, want: "PostgreSQL 9.6.24 is not supported" + needs},
		{num: 100023, want: "PostgreSQL 10.23 is not supported" + needs},
		{num: 120022, want: "PostgreSQL 12.22 is not supported" + needs},
		{num: 130000},
		{num: 130023},
		{num: 150018},
		{num: 180007},
		{num: 190000},
	}
	for _, tc := range tests {
		err := outboxdb.CheckVersionNum(tc.num)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%d: %v, want supported", tc.num, err)
			}
			continue
		}
		var unsupported *outboxdb.UnsupportedServerError
		if !errors.As(err, &unsupported) || unsupported.VersionNum != tc.num {
			t.Errorf("%d: %v (%T), want an *UnsupportedServerError of %d", tc.num, err, err, tc.num)
			continue
		}
		if err.Error() != tc.want {
			t.Errorf("%d: %q, want %q", tc.num, err, tc.want)
		}
	}
	if outboxdb.MinServerVersion != 13 {
		t.Errorf("MinServerVersion %d: the messages above and the version matrix (make test-pg) say 13", outboxdb.MinServerVersion)
	}
}

// TestCheckServerVersion runs the check against the package's real server (the version matrix
// runs it on every supported major): both forms accept it.
func TestCheckServerVersion(t *testing.T) {
	ctx := context.Background()
	db, url := openDB(t)
	if err := outboxdb.CheckServerVersion(ctx, db); err != nil {
		t.Fatalf("CheckServerVersion on PostgreSQL %s: %v", pgtest.Shared(t).Version, err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := outboxdb.CheckServerVersionConn(ctx, conn); err != nil {
		t.Fatalf("CheckServerVersionConn on PostgreSQL %s: %v", pgtest.Shared(t).Version, err)
	}
	if got, want := pgtest.Shared(t).VersionNum/10000, outboxdb.MinServerVersion; got < want {
		t.Fatalf("the test server is PostgreSQL %s, older than %d", pgtest.Shared(t).Version, want)
	}
}
