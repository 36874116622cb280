package controllers

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

func TestPlanIndexes(t *testing.T) {
	valid := outboxdb.PendingIndexState{IndexState: outboxdb.IndexState{Exists: true, Valid: true}}
	started := outboxdb.PendingIndexState{IndexState: outboxdb.IndexState{Exists: true, Valid: true}, SnapshotStarted: true}
	building := outboxdb.PendingIndexState{IndexState: outboxdb.IndexState{Exists: true, Missing: []string{"p"}}, SnapshotStarted: true}
	for name, c := range map[string]struct {
		mode v1alpha1.Tracking
		s    outboxdb.PendingIndexState
		want indexPlan
	}{
		"snapshot before its first batch keeps the index": {v1alpha1.TrackSnapshot, valid, indexKeep},
		"snapshot past its first batch drops it":          {v1alpha1.TrackSnapshot, started, indexDrop},
		"snapshot drops a build cut short":                {v1alpha1.TrackSnapshot, building, indexDrop},
		"snapshot without the index":                      {v1alpha1.TrackSnapshot, outboxdb.PendingIndexState{SnapshotStarted: true}, indexKeep},
		"row with the index":                              {v1alpha1.TrackRow, valid, indexKeep},
		"row without the index builds it":                 {v1alpha1.TrackRow, outboxdb.PendingIndexState{}, indexBuild},
		"row goes on with a build":                        {v1alpha1.TrackRow, building, indexBuild},
		"mode not resolved yet":                           {"", started, indexKeep},
	} {
		t.Run(name, func(t *testing.T) {
			if got := planIndexes(c.mode, c.s); got != c.want {
				t.Errorf("planIndexes(%s, %+v) = %d, want %d", c.mode, c.s, got, c.want)
			}
		})
	}
}

func TestPlanBucketIndex(t *testing.T) {
	valid := outboxdb.IndexState{Exists: true, Valid: true}
	building := outboxdb.IndexState{Exists: true, Missing: []string{"p"}}
	for name, c := range map[string]struct {
		wants bool
		s     outboxdb.IndexState
		want  indexPlan
	}{
		"several shards, built":       {true, valid, indexKeep},
		"several shards, missing":     {true, outboxdb.IndexState{}, indexBuild},
		"several shards, being built": {true, building, indexBuild},
		"one shard drops it":          {false, valid, indexDrop},
		"one shard drops a build":     {false, building, indexDrop},
		"one shard, dropped already":  {false, outboxdb.IndexState{}, indexKeep},
	} {
		t.Run(name, func(t *testing.T) {
			if got := planBucketIndex(c.wants, c.s); got != c.want {
				t.Errorf("planBucketIndex(%v, %+v) = %d, want %d", c.wants, c.s, got, c.want)
			}
		})
	}
}

// ensureIndexes drops the pending index once a snapshot cursor has passed its first batch, and
// builds it back, a partition per pass, for row tracking; PostgreSQL's catalog is the observer.
func TestEnsureIndexes(t *testing.T) {
	e := newStepEnv(t, time.Now())
	ctx := context.Background()
	if _, err := outboxdb.EnsurePartitions(ctx, e.db, e.s.table, time.Now().UTC().AddDate(0, 0, -1), time.Now().UTC().AddDate(0, 0, 2)); err != nil {
		t.Fatal(err)
	}
	catalog := func() (exists, valid bool) {
		t.Helper()
		if err := e.db.QueryRow(`SELECT to_regclass('public.outbox_pending_idx') IS NOT NULL,
  coalesce((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('public.outbox_pending_idx')), false)`).Scan(&exists, &valid); err != nil {
			t.Fatal(err)
		}
		return exists, valid
	}
	pass := func(step string, want time.Duration) []string {
		t.Helper()
		res, err := e.r.ensureIndexes(ctx, e.s)
		if err != nil || res.RequeueAfter != want {
			t.Fatalf("%s: %v, requeue after %s, want %s", step, err, res.RequeueAfter, want)
		}
		return drain(e.rec)
	}
	e.s.relay.Status.Tracking = v1alpha1.TrackSnapshot
	if evs := pass("no cursor yet", 0); len(evs) != 0 {
		t.Errorf("no cursor yet: events %q", evs)
	}
	if _, err := e.db.Exec(`INSERT INTO public.outbox_relay_cursor (buckets, system_identifier)
  VALUES (ARRAY(SELECT generate_series(0, 255))::smallint[], 1)`); err != nil {
		t.Fatal(err)
	}
	pass("before the first batch", 0)
	if exists, _ := catalog(); !exists {
		t.Fatal("the index was dropped before the cursor's first batch")
	}
	if _, err := e.db.Exec(`UPDATE public.outbox_relay_cursor SET snap = pg_current_snapshot()`); err != nil {
		t.Fatal(err)
	}
	if evs := pass("past the first batch", 0); len(evs) != 1 || !strings.Contains(evs[0], "Dropped the pending index") {
		t.Errorf("past the first batch: events %q, want one saying it dropped the index", evs)
	}
	if exists, _ := catalog(); exists {
		t.Fatal("the catalog still has the pending index")
	}
	if evs := pass("dropped already", 0); len(evs) != 0 {
		t.Errorf("dropped already: events %q", evs)
	}

	e.s.relay.Status.Tracking = v1alpha1.TrackRow
	var parts int
	if err := e.db.QueryRow(`SELECT count(*) FROM pg_inherits WHERE inhparent = 'public.outbox'::regclass`).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < parts; i++ {
		evs := pass("building", indexesNext)
		if i == 1 && (len(evs) != 1 || !strings.Contains(evs[0], "Building the pending index")) || i > 1 && len(evs) != 0 {
			t.Errorf("building, pass %d: events %q", i, evs)
		}
		if exists, valid := catalog(); !exists || valid {
			t.Fatalf("pass %d of %d: the index exists %v, valid %v", i, parts, exists, valid)
		}
	}
	if evs := pass("the last partition", 0); len(evs) != 1 || !strings.Contains(evs[0], "Built the pending index") {
		t.Errorf("the last partition: events %q, want one saying it built the index", evs)
	}
	if exists, valid := catalog(); !exists || !valid {
		t.Fatalf("built: the index exists %v, valid %v", exists, valid)
	}
}

// bucketIndexInCatalog is the observer of the bucket index: whether PostgreSQL's catalog has it,
// and valid.
func bucketIndexInCatalog(t *testing.T, db *sql.DB) (exists, valid bool) {
	t.Helper()
	if err := db.QueryRow(`SELECT to_regclass('public.outbox_bucket_idx') IS NOT NULL,
  coalesce((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('public.outbox_bucket_idx')), false)`).Scan(&exists, &valid); err != nil {
		t.Fatal(err)
	}
	return exists, valid
}

// ensureBucketIndex keeps the bucket index while no layout is set, drops it under a layout of
// one shard, and builds it back, a partition per pass, when more shards are desired (or the
// autoscaler may run more); PostgreSQL's catalog is the observer.
func TestEnsureBucketIndex(t *testing.T) {
	e := newStepEnv(t, time.Now())
	ctx := context.Background()
	if _, err := outboxdb.EnsurePartitions(ctx, e.db, e.s.table, time.Now().UTC().AddDate(0, 0, -1), time.Now().UTC().AddDate(0, 0, 2)); err != nil {
		t.Fatal(err)
	}
	catalog := func() (exists, valid bool) { return bucketIndexInCatalog(t, e.db) }
	pass := func(step string, want time.Duration, ready bool) []string {
		t.Helper()
		l, err := outboxdb.ReadLayout(ctx, e.db, e.s.table)
		if err != nil {
			t.Fatal(err)
		}
		e.s.layout = l
		res, err := e.r.ensureBucketIndex(ctx, e.s)
		if err != nil || res.RequeueAfter != want || e.s.bucketIndexReady != ready {
			t.Fatalf("%s: %v, requeue after %s (want %s), ready %v (want %v)", step, err, res.RequeueAfter, want, e.s.bucketIndexReady, ready)
		}
		return drain(e.rec)
	}
	e.s.relay.Spec.Shards = 1
	if evs := pass("no layout yet", 0, true); len(evs) != 0 {
		t.Errorf("no layout yet: events %q", evs)
	}
	if ok, err := outboxdb.SwitchLayout(ctx, e.db, e.s.table, 1); err != nil || !ok {
		t.Fatalf("layout of 1: %v, %v", ok, err)
	}
	e.s.relay.Spec.Autoscaling = &v1alpha1.AutoscalingSpec{MinShards: 1, MaxShards: 3}
	if evs := pass("one shard, autoscaled up to 3", 0, true); len(evs) != 0 {
		t.Errorf("autoscaled: events %q", evs)
	}
	e.s.relay.Spec.Autoscaling = nil
	if evs := pass("one shard", 0, false); len(evs) != 1 || !strings.Contains(evs[0], "Dropped the bucket index") {
		t.Errorf("one shard: events %q, want one saying it dropped the index", evs)
	}
	if exists, _ := catalog(); exists {
		t.Fatal("the catalog still has the bucket index")
	}
	if evs := pass("dropped already", 0, false); len(evs) != 0 {
		t.Errorf("dropped already: events %q", evs)
	}

	e.s.relay.Status.DesiredShards = 2
	var parts int
	if err := e.db.QueryRow(`SELECT count(*) FROM pg_inherits WHERE inhparent = 'public.outbox'::regclass`).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < parts; i++ {
		evs := pass("building", indexesNext, false)
		if i == 1 && (len(evs) != 1 || !strings.Contains(evs[0], "Building the bucket index")) || i > 1 && len(evs) != 0 {
			t.Errorf("building, pass %d: events %q", i, evs)
		}
		if exists, valid := catalog(); !exists || valid {
			t.Fatalf("pass %d of %d: the index exists %v, valid %v", i, parts, exists, valid)
		}
	}
	if evs := pass("the last partition", 0, true); len(evs) != 1 || !strings.Contains(evs[0], "Built the bucket index") {
		t.Errorf("the last partition: events %q, want one saying it built the index", evs)
	}
	if exists, valid := catalog(); !exists || !valid {
		t.Fatalf("built: the index exists %v, valid %v", exists, valid)
	}
}
