package pgtest

import (
	"context"
	"database/sql"
	"time"

	"github.com/outbox-operator/outbox-operator/migrations"
)

// OutboxSchema applies the embedded migrations for table to the database at url. With
// daysBack >= 0 it also creates the daily partitions from daysBack days ago to tomorrow (UTC);
// with daysBack < 0 it creates none, and rows land in the default partition.
func OutboxSchema(ctx context.Context, url string, table migrations.Table, daysBack int) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := migrations.Apply(ctx, db, table); err != nil {
		return err
	}
	if daysBack < 0 {
		return nil
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	_, err = migrations.EnsurePartitions(ctx, db, table, today.AddDate(0, 0, -daysBack), today.AddDate(0, 0, 1))
	return err
}
