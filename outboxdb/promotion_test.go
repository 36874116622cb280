package outboxdb_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestWakeUpAfterPromotion promotes a streaming standby of a primary that was killed, and checks
// on the new primary what a relay and a writer do with the wake-up objects: claim, end a claim,
// and insert with the trigger's WHEN condition. Two databases, both created and migrated while
// the standby streamed (so the standby has them from the WAL): one with this release's schema,
// and one left as the release before migration 00015 left it (the claims' sequence and table
// UNLOGGED), which the promotion broke ("bad magic number in sequence") and which migrating
// again on the new primary must mend.
func TestWakeUpAfterPromotion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a, b := pgtest.StartWithStandby(ctx, t, true)
	tb := outboxdb.MustParseTable("outbox")
	migrate := func(url string) *sql.DB {
		t.Helper()
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
			t.Fatal(err)
		}
		return db
	}
	for _, name := range []string{"current", "previous"} {
		if _, err := a.CreateDatabase(ctx, name); err != nil {
			t.Fatal(err)
		}
		migrate(a.URL(name))
	}
	prev, err := pgx.Connect(ctx, a.URL("previous"))
	if err != nil {
		t.Fatal(err)
	}
	var unloggedSequences bool
	if err := prev.QueryRow(ctx, `SELECT current_setting('server_version_num')::int >= 150000`).Scan(&unloggedSequences); err != nil {
		t.Fatal(err)
	}
	if unloggedSequences { // PostgreSQL 13 and 14 have none: the previous release did not run there
		for _, q := range []string{
			`ALTER SEQUENCE outbox_wake_until SET UNLOGGED`,
			`ALTER TABLE outbox_relay_waiting SET UNLOGGED`,
			`DELETE FROM outbox_schema_version WHERE version_id >= 15`,
			`SELECT setval('outbox_wake_until', 9000000000000000)`,
		} {
			if _, err := prev.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	prev.Close(ctx)
	// A commit that waits for the standby's flush: everything before it is there too.
	if _, err := a.CreateDatabase(ctx, "barrier"); err != nil {
		t.Fatal(err)
	}
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := b.Promote(ctx); err != nil {
		t.Fatal(err)
	}

	if unloggedSequences {
		c, err := pgx.Connect(ctx, b.URL("previous"))
		if err != nil {
			t.Fatal(err)
		}
		var v int64
		err = c.QueryRow(ctx, `SELECT last_value FROM outbox_wake_until`).Scan(&v)
		c.Close(ctx)
		t.Logf("the previous release's unlogged sequence on the promoted standby: %d, %v", v, err)
		migrate(b.URL("previous"))
	}
	for _, name := range []string{"current", "previous"} {
		t.Run(name, func(t *testing.T) {
			c, err := pgx.Connect(ctx, b.URL(name))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(ctx)
			var unlogged int
			if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_class
WHERE relname IN ('outbox_wake_until', 'outbox_relay_waiting') AND relpersistence <> 'p'`).Scan(&unlogged); err != nil {
				t.Fatal(err)
			}
			if unlogged != 0 {
				t.Errorf("%d wake-up relations not logged after migrating", unlogged)
			}
			w := outboxdb.WakeStatements(tb)
			var watch []int64
			if err := c.QueryRow(ctx, w.Wait, 5.0, nil).Scan(&watch); err != nil {
				t.Fatalf("claim on the promoted standby: %v", err)
			}
			var wanted bool
			if err := c.QueryRow(ctx, `SELECT outbox_wake_wanted()`).Scan(&wanted); err != nil || !wanted {
				t.Fatalf("wake_wanted after a claim: %v, %v", wanted, err)
			}
			if _, err := c.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', 'o-1', 'Created', '{}')`); err != nil {
				t.Fatalf("insert on the promoted standby: %v", err)
			}
			if _, err := c.Exec(ctx, w.Woke); err != nil {
				t.Fatalf("end the claim: %v", err)
			}
			if err := c.QueryRow(ctx, `SELECT outbox_wake_wanted()`).Scan(&wanted); err != nil || wanted {
				t.Fatalf("wake_wanted after the claim ended: %v, %v", wanted, err)
			}
		})
	}
}
