package outboxdb_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// bucketIndexFromCatalog is the observer: the bucket index's validity and its parts, from
// PostgreSQL's catalog.
func bucketIndexFromCatalog(t *testing.T, db *sql.DB) (exists, valid bool, parts int) {
	t.Helper()
	return indexFromCatalog(t, db, "public.outbox_bucket_idx")
}

// TestBucketIndexFollowsTheLayout: the bucket index is dropped only while the layout has one
// shard and no change to more is requested, and built back, a partition at a time, before a
// layout of several; PostgreSQL's catalog and planner agree with the state read, and a shard's
// read of one bucket goes through it again.
func TestBucketIndexFollowsTheLayout(t *testing.T) {
	ctx, db, url, tb := pendingFixture(t)
	s, err := outboxdb.ReadBucketIndex(ctx, db, tb)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Exists || !s.Valid || len(s.Missing) != 0 {
		t.Fatalf("after the migrations: %+v, want a valid index", s)
	}
	// No layout yet: the relays may run any number of shards, the index stays.
	if dropped, err := outboxdb.DropBucketIndex(ctx, db, tb, time.Second); err != nil || dropped {
		t.Fatalf("drop without a layout: %v, %v; want the index kept", dropped, err)
	}
	if ok, err := outboxdb.SwitchLayout(ctx, db, tb, 2); err != nil || !ok {
		t.Fatalf("layout of 2: %v, %v", ok, err)
	}
	if dropped, err := outboxdb.DropBucketIndex(ctx, db, tb, time.Second); err != nil || dropped {
		t.Fatalf("drop under 2 shards: %v, %v; want the index kept", dropped, err)
	}
	if ok, err := outboxdb.SwitchLayout(ctx, db, tb, 1); err != nil || !ok {
		t.Fatalf("layout of 1: %v, %v", ok, err)
	}
	// A change to 3 requested: kept.
	if err := outboxdb.RequestLayout(ctx, db, tb, 3); err != nil {
		t.Fatal(err)
	}
	if dropped, err := outboxdb.DropBucketIndex(ctx, db, tb, time.Second); err != nil || dropped {
		t.Fatalf("drop with 3 shards requested: %v, %v; want the index kept", dropped, err)
	}
	if err := outboxdb.RequestLayout(ctx, db, tb, 1); err != nil { // withdrawn
		t.Fatal(err)
	}
	dropped, err := outboxdb.DropBucketIndex(ctx, db, tb, time.Second)
	if err != nil || !dropped {
		t.Fatalf("drop under 1 shard: %v, %v", dropped, err)
	}
	if exists, _, _ := bucketIndexFromCatalog(t, db); exists {
		t.Fatal("the catalog still has the index")
	}
	var parts int
	if err := db.QueryRow(`SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass`).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	if built, err := outboxdb.EnsureBucketIndexFor(ctx, db, tb, 1, time.Second); err != nil || built {
		t.Fatalf("ensure for 1 shard: %v, %v; want nothing built", built, err)
	}
	if s, err = outboxdb.BuildBucketIndex(ctx, db, tb, time.Second, 1); err != nil {
		t.Fatal(err)
	}
	exists, valid, attached := bucketIndexFromCatalog(t, db)
	if !exists || valid || attached != 1 || s.Valid || len(s.Missing) != parts-1 {
		t.Fatalf("one partition built: catalog exists %v valid %v parts %d; read %+v; want %d missing", exists, valid, attached, s, parts-1)
	}
	built, err := outboxdb.EnsureBucketIndexFor(ctx, db, tb, 4, time.Second)
	if err != nil || !built {
		t.Fatalf("ensure for 4 shards: %v, %v", built, err)
	}
	exists, valid, attached = bucketIndexFromCatalog(t, db)
	if !exists || !valid || attached != parts {
		t.Fatalf("built: catalog exists %v valid %v parts %d (want %d)", exists, valid, attached, parts)
	}
	if built, err := outboxdb.EnsureBucketIndexFor(ctx, db, tb, 4, time.Second); err != nil || built {
		t.Fatalf("ensure again: %v, %v; want nothing to do", built, err)
	}
	// The planner reads one bucket through it, and finds every unsent row of the bucket.
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, `SET enable_seqscan = off; SET enable_bitmapscan = off`); err != nil {
		t.Fatal(err)
	}
	q := `SELECT count(*) FROM (SELECT id FROM outbox WHERE sent_at IS NULL AND ` + outboxdb.BucketExpr + ` = 7 ORDER BY ` + outboxdb.BucketExpr + `, id) AS s`
	rows, err := c.Query(ctx, `EXPLAIN (COSTS OFF) `+q)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var byIndex, byScan int64
	if err := c.QueryRow(ctx, q).Scan(&byIndex); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM outbox WHERE sent_at IS NULL AND ` + outboxdb.BucketExpr + ` = 7`).Scan(&byScan); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(plan, "\n"), "bucket_idx") || byIndex != byScan || byScan == 0 {
		t.Fatalf("bucket 7 through the index %d, by a scan %d; plan:\n%s", byIndex, byScan, strings.Join(plan, "\n"))
	}
}

func TestWantsBucketIndex(t *testing.T) {
	for _, c := range []struct {
		l    *outboxdb.Layout
		most int32
		want bool
	}{
		{nil, 1, true}, // no layout yet
		{&outboxdb.Layout{ShardCount: 1}, 1, false},
		{&outboxdb.Layout{ShardCount: 1}, 4, true}, // the autoscaler may reshard
		{&outboxdb.Layout{ShardCount: 1, Requested: 2}, 1, true},
		{&outboxdb.Layout{ShardCount: 2}, 1, true}, // moving back to one: kept until it has
		{&outboxdb.Layout{ShardCount: 2, Requested: 1}, 1, true},
	} {
		if got := outboxdb.WantsBucketIndex(c.l, c.most); got != c.want {
			t.Errorf("WantsBucketIndex(%+v, %d) = %v, want %v", c.l, c.most, got, c.want)
		}
	}
}
