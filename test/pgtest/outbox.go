package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// OutboxSchema applies the embedded migrations for table to the database at url. With
// daysBack >= 0 it also creates the daily partitions from daysBack days ago to tomorrow (UTC);
// with daysBack < 0 it creates none, and rows land in the default partition.
func OutboxSchema(ctx context.Context, url string, table outboxdb.Table, daysBack int) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := outboxdb.Apply(ctx, db, table); err != nil {
		return err
	}
	if daysBack < 0 {
		return nil
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	_, err = outboxdb.EnsurePartitions(ctx, db, table, today.AddDate(0, 0, -daysBack), today.AddDate(0, 0, 1))
	return err
}

// RunWithExampleDB is Run for a package whose runnable examples need a database before any test
// runs: it starts the shared server, creates the database "examples" holding the outbox schema
// for table, exports its URL as DATABASE_URL (the examples read it, as an application would),
// runs the tests and stops the server.
func RunWithExampleDB(m *testing.M, table outboxdb.Table) int {
	if err := startShared(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: cannot start PostgreSQL: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	url, err := shared.CreateDatabase(ctx, "examples")
	if err == nil {
		err = OutboxSchema(ctx, url, table, -1)
	}
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: the examples database: %v\n", err)
		shared.Close()
		return 1
	}
	os.Setenv("DATABASE_URL", url)
	return Run(m)
}
