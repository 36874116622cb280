// An outbox table set up as the operator sets it up, for the scenarios: the indexes of snapshot
// tracking and of a layout of one shard, the insert trigger, the CHECKs.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// setSnapshotIndexes gives the table the indexes of snapshot tracking (no pending index), as the
// operator does: with a snapshot relay running (relay), once its cursor has passed its first
// batch.
func (e *env) setSnapshotIndexes(ctx context.Context, url string, relay bool) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	for deadline := time.Now().Add(time.Minute); relay; {
		s, err := outboxdb.ReadPendingIndex(ctx, db, e.table)
		if err != nil {
			return err
		}
		if s.SnapshotStarted {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the snapshot relay's cursor did not pass its first batch within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := outboxdb.DropPendingIndex(ctx, db, e.table, 10*time.Second); err != nil {
		return fmt.Errorf("dropping the pending index: %w", err)
	}
	return nil
}

// oneShardIndexes gives table t what the operator gives the table of an OutboxRelay of one shard
// (controllers/outboxrelay_indexes.go, ensureBucketIndex): a layout of one shard, and no bucket
// index, which only the shards of a layout of several read.
func oneShardIndexes(ctx context.Context, url string, t outboxdb.Table) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	if ok, err := outboxdb.SwitchLayout(ctx, db, t, 1); err != nil || !ok {
		return fmt.Errorf("setting a layout of one shard on %s: %v, %w", t, ok, err)
	}
	if dropped, err := outboxdb.DropBucketIndex(ctx, db, t, 10*time.Second); err != nil || !dropped {
		return fmt.Errorf("dropping the bucket index of %s: %v, %w", t, dropped, err)
	}
	return nil
}

// setNotify creates (on) or drops the outbox table's insert trigger, as the operator does for
// spec.publish.notify.
func (e *env) setNotify(ctx context.Context, url string, on bool) error {
	return setNotifyAt(ctx, url, e.table, on)
}

func setNotifyAt(ctx context.Context, url string, t outboxdb.Table, on bool) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := outboxdb.SetNotify(ctx, db, t, on, 10*time.Second); err != nil {
		return fmt.Errorf("setting the insert trigger to %v: %w", on, err)
	}
	return nil
}

// setChecksAt drops (false) or adds back the CHECKs of table t in the database at url.
func setChecksAt(ctx context.Context, url string, t outboxdb.Table, on bool) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := outboxdb.SetChecks(ctx, db, t, on, 10*time.Second); err != nil {
		return fmt.Errorf("setting the CHECKs to %v: %w", on, err)
	}
	return nil
}
