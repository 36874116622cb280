/*
Copyright 2026 The outbox-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// The table's optional indexes (outboxdb/indexes.go, outboxdb/bucket_index.go): a table tracked
// by snapshot does without the pending index, which only row tracking reads, and a table whose
// relays run one shard does without the bucket index, which only the shards of a layout of
// several read.

package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// indexBuildTimeout bounds one pass's build of the pending index's part on one partition
// (CREATE INDEX CONCURRENTLY: writers go on meanwhile). A build cut short is resumed by the
// next pass.
const indexBuildTimeout = 10 * time.Minute

// indexesNext is how soon the build goes on with the next partition (a change that failed is
// tried again after tableChangeRetry).
const indexesNext = time.Second

// indexPlan is what ensureIndexes does in one pass.
type indexPlan int

const (
	indexKeep  indexPlan = iota
	indexDrop            // snapshot tracking, past every cursor row's first batch
	indexBuild           // row tracking, and the index is missing or incomplete
)

// planIndexes decides the pass's change of the pending index from the tracking mode the relays
// run and the index's state. Snapshot tracking keeps the index until every cursor row has passed
// its first batch, which reads the lowest unsent id (the row-tracking backlog it takes over).
func planIndexes(mode v1alpha1.Tracking, s outboxdb.PendingIndexState) indexPlan {
	switch {
	case mode == v1alpha1.TrackSnapshot && s.Exists && s.SnapshotStarted:
		return indexDrop
	case mode == v1alpha1.TrackRow && !s.Valid:
		return indexBuild
	}
	return indexKeep
}

// ensureIndexes matches the table's pending index to the tracking mode (planIndexes). The index
// is an optimisation of row tracking's reads, not a condition of correctness: a change that
// fails is recorded and retried, and the pass goes on.
func (r *OutboxRelayReconciler) ensureIndexes(ctx context.Context, s *scope) (Result, error) {
	mode := s.relay.Status.Tracking
	rctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	state, err := outboxdb.ReadPendingIndex(rctx, s.db, s.table)
	if err != nil {
		return r.indexesFailed(s, "reading the indexes", err)
	}
	switch planIndexes(mode, state) {
	case indexDrop:
		if _, err := outboxdb.DropPendingIndex(rctx, s.db, s.table, tableLockWait); err != nil {
			return r.indexesFailed(s, "dropping the pending index", err)
		}
		r.Recorder.Eventf(s.relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonIndexesChanged, "SetIndexes",
			"Dropped the pending index of table %s: its relays track by snapshot, which reads ids from the primary key; each insert writes one index entry less", s.table)
	case indexBuild:
		if !state.Exists {
			r.Recorder.Eventf(s.relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonIndexesChanged, "SetIndexes",
				"Building the pending index of table %s for row tracking, a partition at a time, CONCURRENTLY (writers go on)", s.table)
		}
		bctx, cancel := context.WithTimeout(ctx, indexBuildTimeout)
		defer cancel()
		after, err := outboxdb.BuildPendingIndex(bctx, s.db, s.table, tableLockWait, 1)
		if err != nil {
			return r.indexesFailed(s, "building the pending index", err)
		}
		if !after.Valid {
			return Result{RequeueAfter: indexesNext}, nil
		}
		r.Recorder.Eventf(s.relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonIndexesChanged, "SetIndexes",
			"Built the pending index of table %s: row tracking reads its unsent rows in id order", s.table)
	}
	return Result{}, nil
}

// mostShards is the most shards the relay's layout may move to: the autoscaler's maximum, or
// the desired count.
func mostShards(relay *v1alpha1.OutboxRelay) int32 {
	most := desiredOf(relay)
	if a := relay.Spec.Autoscaling; a != nil {
		most = max(most, a.MaxShards)
	}
	return most
}

// planBucketIndex decides the pass's change of the bucket index from whether the layout may have
// several shards (outboxdb.WantsBucketIndex) and the index's state.
func planBucketIndex(wants bool, s outboxdb.IndexState) indexPlan {
	switch {
	case wants && !s.Valid:
		return indexBuild
	case !wants && s.Exists:
		return indexDrop
	}
	return indexKeep
}

// ensureBucketIndex matches the table's bucket index to its shard layout (planBucketIndex): it
// drops it while the layout has one shard and nothing may ask for more (each insert writes one
// index entry less), and builds it, a partition a pass, CONCURRENTLY, before a layout of several
// takes effect (ensureLayout waits for it: s.bucketIndexReady).
func (r *OutboxRelayReconciler) ensureBucketIndex(ctx context.Context, s *scope) (Result, error) {
	rctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	state, err := outboxdb.ReadBucketIndex(rctx, s.db, s.table)
	if err != nil {
		return r.indexesFailed(s, "reading the bucket index", err)
	}
	s.bucketIndexReady = state.Valid
	switch planBucketIndex(outboxdb.WantsBucketIndex(s.layout, mostShards(s.relay)), state) {
	case indexDrop:
		dropped, err := outboxdb.DropBucketIndex(rctx, s.db, s.table, tableLockWait)
		if err != nil {
			return r.indexesFailed(s, "dropping the bucket index", err)
		}
		if dropped {
			s.bucketIndexReady = false
			r.Recorder.Eventf(s.relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonIndexesChanged, "SetIndexes",
				"Dropped the bucket index of table %s: its relays run one shard, which reads ids from the primary key; each insert writes one index entry less (built again before a layout of several shards)", s.table)
		}
	case indexBuild:
		if !state.Exists {
			r.Recorder.Eventf(s.relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonIndexesChanged, "SetIndexes",
				"Building the bucket index of table %s for a layout of up to %d shards, a partition at a time, CONCURRENTLY (writers go on)", s.table, mostShards(s.relay))
		}
		bctx, cancel := context.WithTimeout(ctx, indexBuildTimeout)
		defer cancel()
		after, err := outboxdb.BuildBucketIndex(bctx, s.db, s.table, tableLockWait, 1)
		if err != nil {
			return r.indexesFailed(s, "building the bucket index", err)
		}
		if s.bucketIndexReady = after.Valid; !after.Valid {
			return Result{RequeueAfter: indexesNext}, nil
		}
		r.Recorder.Eventf(s.relay, nil, corev1.EventTypeNormal, v1alpha1.ReasonIndexesChanged, "SetIndexes",
			"Built the bucket index of table %s: the shards of a layout of several read their buckets through it", s.table)
	}
	return Result{}, nil
}

// indexesFailed records a change of the indexes that failed, and retries it later.
func (r *OutboxRelayReconciler) indexesFailed(s *scope, what string, err error) (Result, error) {
	msg := redact(fmt.Sprintf("%s of table %s failed (retried in %s): %s", what, s.table, tableChangeRetry, describeDBError(err)), s.dbURL)
	r.Recorder.Eventf(s.relay, nil, corev1.EventTypeWarning, v1alpha1.ReasonIndexesFailed, "SetIndexes", msg)
	return Result{RequeueAfter: tableChangeRetry}, nil
}
