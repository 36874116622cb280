package outboxdb

// The bucket index (<table>_bucket_idx ON ((bucket), id) WHERE sent_at IS NULL, migration 00008)
// is read only by the shards of a layout of several: each reads its own buckets, bucket by
// bucket, and measures its backlog so (BacklogSQL). A layout of one shard reads the whole table
// by id and never reads it, yet every insert pays its entry: an expression evaluated, an entry
// in one of 256 places, its WAL. On PostgreSQL 15 with 32 durable writers (pgbench, the
// application's transaction of a business row and an event, interleaved rounds), dropping it
// raised the transactions per second by about 6% (docs/architecture.md, "The write path per
// mode").
//
// So the operator drops it while the table's layout has one shard and nothing asks for more,
// and builds it back, a partition at a time and CONCURRENTLY (BuildPendingIndex's steps), before
// a layout of several takes effect: a shard of several must not read without it (each of its
// buckets would walk the id order of the whole range).

import (
	"context"
	"database/sql"
	"time"
)

// ReadBucketIndex reads the state of t's bucket index.
func ReadBucketIndex(ctx context.Context, db *sql.DB, t Table) (IndexState, error) {
	var s IndexState
	err := readIndex(ctx, db, t, bucketIndex, "", &s)
	return s, err
}

// BuildBucketIndex builds t's bucket index without blocking writers, at most maxParts partitions
// per call (0: all), resumably, as BuildPendingIndex does, and returns its state after.
func BuildBucketIndex(ctx context.Context, db *sql.DB, t Table, lockWait time.Duration, maxParts int) (IndexState, error) {
	if err := buildIndex(ctx, db, t, bucketIndex, lockWait, maxParts); err != nil {
		return IndexState{}, err
	}
	return ReadBucketIndex(ctx, db, t)
}

// DropBucketIndex drops t's bucket index, within lockWait as DropPendingIndex does, if the
// table's layout has one shard and no change to more is requested, and reports whether it
// dropped it. The dropping transaction reads the layout row FOR UPDATE: a switch of layout,
// which updates that row, waits for the drop and then finds the index gone (a caller that
// reshards builds it first: EnsureBucketIndexFor), or the drop waits for the switch and leaves
// the index.
func DropBucketIndex(ctx context.Context, db *sql.DB, t Table, lockWait time.Duration) (bool, error) {
	guard := `SELECT coalesce((SELECT shard_count = 1 AND coalesce(requested_shard_count, 1) = 1
  FROM ` + t.Derived("relay_layout") + ` FOR UPDATE), false)`
	return dropIndex(ctx, db, t, bucketIndex, lockWait, guard)
}

// WantsBucketIndex reports whether a table whose layout is l (nil: none set yet) and whose
// relays may run up to most shards needs the bucket index: when any layout it has, is moving
// to, or may move to has several shards.
func WantsBucketIndex(l *Layout, most int32) bool {
	if most > 1 {
		return true
	}
	return l == nil || l.ShardCount != 1 || l.Requested > 1
}

// EnsureBucketIndexFor builds t's bucket index, every partition, if a layout of n shards needs
// it (n > 1) and it is not valid yet: what `relay layout set` does before it reshards.
func EnsureBucketIndexFor(ctx context.Context, db *sql.DB, t Table, n int32, lockWait time.Duration) (built bool, err error) {
	if n <= 1 {
		return false, nil
	}
	s, err := ReadBucketIndex(ctx, db, t)
	if err != nil || s.Valid {
		return false, err
	}
	_, err = BuildBucketIndex(ctx, db, t, lockWait, 0)
	return err == nil, err
}
