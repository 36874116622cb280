package outboxdb_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

func openDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, url
}

func TestParseTable(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    outboxdb.Table
		wantErr bool
	}{
		"bare name":       {in: "outbox", want: outboxdb.Table{Schema: "public", Name: "outbox"}},
		"qualified":       {in: "shop.events", want: outboxdb.Table{Schema: "shop", Name: "events"}},
		"underscore":      {in: "_s._t1", want: outboxdb.Table{Schema: "_s", Name: "_t1"}},
		"empty":           {in: "", wantErr: true},
		"upper case":      {in: "Outbox", wantErr: true},
		"quote":           {in: `out"box`, wantErr: true},
		"semicolon":       {in: "outbox;drop table x", wantErr: true},
		"space":           {in: "out box", wantErr: true},
		"three parts":     {in: "a.b.c", wantErr: true},
		"leading digit":   {in: "1outbox", wantErr: true},
		"empty schema":    {in: ".outbox", wantErr: true},
		"name too long":   {in: strings.Repeat("a", outboxdb.MaxNameLength+1), wantErr: true},
		"longest name":    {in: strings.Repeat("a", outboxdb.MaxNameLength), want: outboxdb.Table{Schema: "public", Name: strings.Repeat("a", outboxdb.MaxNameLength)}},
		"schema too long": {in: strings.Repeat("s", 64) + ".t", wantErr: true},
		"dash":            {in: "out-box", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := outboxdb.ParseTable(tc.in)
			if tc.wantErr {
				if !errors.Is(err, outboxdb.ErrInvalidTable) {
					t.Fatalf("ParseTable(%q) = %v, %v; want ErrInvalidTable", tc.in, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseTable(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestApplyCreatesSchemaAndIsIdempotent(t *testing.T) {
	ctx := context.Background()
	db, _ := openDB(t)
	for _, table := range []string{"outbox", "shop.events"} {
		tb := outboxdb.MustParseTable(table)
		for range 2 {
			v, err := outboxdb.Apply(ctx, db, tb)
			if err != nil {
				t.Fatal(err)
			}
			if v != outboxdb.LatestVersion() {
				t.Fatalf("version %d, want %d", v, outboxdb.LatestVersion())
			}
		}
		cur, err := outboxdb.CurrentVersion(ctx, db, tb)
		if err != nil || cur != outboxdb.LatestVersion() {
			t.Fatalf("CurrentVersion = %d, %v", cur, err)
		}
		for _, obj := range []string{tb.Ident(), tb.Derived("default"), tb.Derived("id_seq"),
			pgx.Identifier{tb.Schema, tb.Name + "_pending_idx"}.Sanitize(), pgx.Identifier{tb.Schema, "inbox"}.Sanitize()} {
			var ok bool
			if err := db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", obj).Scan(&ok); err != nil || !ok {
				t.Errorf("%s: missing after Apply (err %v)", obj, err)
			}
		}
	}
	// A second table in the same database keeps its own history.
	cur, err := outboxdb.CurrentVersion(ctx, db, outboxdb.MustParseTable("other"))
	if err != nil || cur != 0 {
		t.Fatalf("unapplied table: version %d, err %v", cur, err)
	}
}

func TestConcurrentApply(t *testing.T) {
	ctx := context.Background()
	_, url := openDB(t)
	tb := outboxdb.MustParseTable("outbox")
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := sql.Open("pgx", url) // one pool per "process"
			if err != nil {
				errs <- err
				return
			}
			defer db.Close()
			_, err = outboxdb.Apply(ctx, db, tb)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Apply: %v", err)
		}
	}
}

func TestApplyRejectsInvalidTable(t *testing.T) {
	db, _ := openDB(t)
	_, err := outboxdb.Apply(context.Background(), db, outboxdb.Table{Schema: "public", Name: `x"; DROP TABLE y; --`})
	if !errors.Is(err, outboxdb.ErrInvalidTable) {
		t.Fatalf("Apply with a hostile name: %v", err)
	}
}

func insert(t *testing.T, db *sql.DB, tb outboxdb.Table, createdAt time.Time, sent bool) {
	t.Helper()
	var sentAt any
	if sent {
		sentAt = createdAt
	}
	_, err := db.Exec(fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, event_type, payload, created_at, sent_at)
		VALUES ('order', 'o-1', 'OrderCreated', '{}', $1, $2)`, tb.Ident()), createdAt, sentAt)
	if err != nil {
		t.Fatal(err)
	}
}

func TestRowsWithoutPartitionLandInDefaultAndMoveWhenTheDayIsCreated(t *testing.T) {
	ctx := context.Background()
	db, _ := openDB(t)
	tb := outboxdb.MustParseTable("outbox")
	if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
		t.Fatal(err)
	}
	day := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	insert(t, db, tb, day.Add(23*time.Hour+59*time.Minute), false) // 23:59 UTC, no partition yet
	insert(t, db, tb, day.Add(24*time.Hour), false)                // 00:00 next day

	created, err := outboxdb.EnsurePartitions(ctx, db, tb, day, day.AddDate(0, 0, 2))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"outbox_p20261129", "outbox_p20261130", "outbox_p20261201"}
	if strings.Join(created, ",") != strings.Join(want, ",") {
		t.Fatalf("created %v, want %v", created, want)
	}
	again, err := outboxdb.EnsurePartitions(ctx, db, tb, day, day.AddDate(0, 0, 2))
	if err != nil || len(again) != 0 {
		t.Fatalf("second EnsurePartitions created %v, %v", again, err)
	}
	counts := map[string]int{}
	rows, err := db.Query(fmt.Sprintf("SELECT tableoid::regclass::text, count(*) FROM %s GROUP BY 1", tb.Ident()))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		counts[name] = n
	}
	rows.Close()
	if counts["outbox_p20261129"] != 1 || counts["outbox_p20261130"] != 1 || counts["outbox_default"] != 0 {
		t.Fatalf("rows per partition: %v", counts)
	}
	// The moved rows still hash to one bucket.
	var buckets int
	if err := db.QueryRow(fmt.Sprintf("SELECT count(DISTINCT "+outboxdb.BucketExpr+") FROM %s", tb.Ident())).Scan(&buckets); err != nil || buckets != 1 {
		t.Fatalf("buckets of one aggregate: %d, %v", buckets, err)
	}
	parts, err := outboxdb.ListPartitions(ctx, db, tb)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 4 || !parts[3].Default || !parts[0].Day.Equal(day) || !parts[0].HasPending || parts[2].HasPending {
		t.Fatalf("partitions: %+v", parts)
	}
}

func TestDropOnlyFullySentPartitionsOlderThanRetention(t *testing.T) {
	ctx := context.Background()
	db, _ := openDB(t)
	tb := outboxdb.MustParseTable("outbox")
	if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
		t.Fatal(err)
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	old := today.AddDate(0, 0, -10)
	if _, err := outboxdb.EnsurePartitions(ctx, db, tb, old, today); err != nil {
		t.Fatal(err)
	}
	insert(t, db, tb, old.Add(time.Hour), true)                     // day -10: all sent
	insert(t, db, tb, old.AddDate(0, 0, 1).Add(time.Hour), false)   // day -9: one unsent row
	insert(t, db, tb, today.AddDate(0, 0, -2).Add(time.Hour), true) // inside retention

	droppable, err := outboxdb.DroppablePartitions(ctx, db, tb, 7*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	name := func(d time.Time) string { return "outbox_p" + d.Format("20060102") }
	got := strings.Join(droppable, ",")
	if !strings.Contains(got, name(old)) || strings.Contains(got, name(old.AddDate(0, 0, 1))) ||
		strings.Contains(got, name(today.AddDate(0, 0, -2))) || strings.Contains(got, name(today.AddDate(0, 0, -7))) {
		t.Fatalf("droppable %v", droppable)
	}
	for _, p := range droppable {
		if err := outboxdb.DropPartition(ctx, db, tb, p); err != nil {
			t.Fatal(err)
		}
	}
	// The partition with an unsent row is refused even when asked directly.
	err = outboxdb.DropPartition(ctx, db, tb, name(old.AddDate(0, 0, 1)))
	if !errors.Is(err, outboxdb.ErrPartitionHasPending) {
		t.Fatalf("drop of a partition with an unsent row: %v", err)
	}
	if err := outboxdb.DropPartition(ctx, db, tb, "inbox"); err == nil {
		t.Fatal("DropPartition accepted a table that is not a daily partition")
	}
	var n int
	if err := db.QueryRow(fmt.Sprintf("SELECT count(*) FROM %s WHERE sent_at IS NULL", tb.Ident())).Scan(&n); err != nil || n != 1 {
		t.Fatalf("unsent rows after pruning: %d, %v", n, err)
	}
}

func TestRenderQuotesEveryIdentifier(t *testing.T) {
	sqls, err := outboxdb.Render(outboxdb.MustParseTable("shop.events"))
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(sqls, "\n")
	if strings.Contains(all, "{{") || !strings.Contains(all, `"shop"."events"`) || strings.Contains(all, "public") {
		t.Fatalf("rendered SQL is not parameterised by the table:\n%s", all)
	}
}
