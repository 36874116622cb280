package outboxdb_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// checksFromCatalog is the observer: the CHECK constraints of the table and of each of its
// partitions, from PostgreSQL's catalog, as name -> validated.
func checksFromCatalog(t *testing.T, db *sql.DB, rel string) map[string]bool {
	t.Helper()
	rows, err := db.Query(`SELECT conname, convalidated FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c'`, rel)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var name string
		var valid bool
		if err := rows.Scan(&name, &valid); err != nil {
			t.Fatal(err)
		}
		out[name] = valid
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// badInserts are the four inserts the table's CHECKs refuse, one per CHECK.
var badInserts = map[string]string{
	"outbox_aggregate_type_check": `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('', 'a', 'E', '{}')`,
	"outbox_aggregate_id_check":   `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', '', 'E', '{}')`,
	"outbox_event_type_check":     `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'a', '', '{}')`,
	"outbox_headers_check":        `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('t', 'a', 'E', '{}', '[]')`,
}

// refusedBy returns the constraint that refused the insert, or "" when it was accepted.
func refusedBy(t *testing.T, db *sql.DB, insert string) string {
	t.Helper()
	_, err := db.Exec(insert)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &pgErr) && pgErr.Code == "23514":
		return pgErr.ConstraintName
	default:
		t.Fatalf("%s: %v", insert, err)
		return ""
	}
}

// TestChecksDropAndReturn: dropping the table's CHECKs removes them from the table and every
// partition, after which PostgreSQL accepts what they refused; adding them back adds them NOT
// VALID (no scan: the rows written meanwhile stay), refusing each bad insert again, on the
// partitions that exist and on a day's partition created afterwards (valid there). Both are
// idempotent, the application's own CHECK on one of the columns is never touched, and a change
// that cannot take the table's lock gives up after the lock wait with nothing changed.
func TestChecksDropAndReturn(t *testing.T) {
	ctx, db, _, tb := pendingFixture(t)
	if _, err := db.Exec(`ALTER TABLE outbox ADD CONSTRAINT app_short_ids CHECK (aggregate_id <> 'forbidden')`); err != nil {
		t.Fatal(err)
	}
	on, err := outboxdb.Checks(ctx, db, tb)
	if err != nil || !on {
		t.Fatalf("Checks after the migrations: %v, %v; want true", on, err)
	}
	for name, insert := range badInserts {
		if got := refusedBy(t, db, insert); got != name {
			t.Fatalf("with the CHECKs: %s refused by %q, want %q", insert, got, name)
		}
	}

	// A writer holds the table: the drop waits for its lock at most the lock wait, then gives up.
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'held', 'E', '{}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := outboxdb.SetChecks(ctx, db, tb, false, 200*time.Millisecond); !isLockTimeout(err) {
		t.Fatalf("drop behind a writer: %v, want lock_not_available", err)
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	if on, _ := outboxdb.Checks(ctx, db, tb); !on {
		t.Fatal("a drop that gave up changed the table")
	}

	changed, err := outboxdb.SetChecks(ctx, db, tb, false, time.Second)
	if err != nil || !changed {
		t.Fatalf("drop: %v, %v", changed, err)
	}
	partitions := partitionNames(t, db)
	for _, rel := range append([]string{"outbox"}, partitions...) {
		got := checksFromCatalog(t, db, rel)
		if len(got) != 1 || !hasKey(got, "app_short_ids") {
			t.Fatalf("%s after the drop has the CHECKs %v, want only the application's", rel, got)
		}
	}
	for _, insert := range badInserts {
		if got := refusedBy(t, db, insert); got != "" {
			t.Fatalf("without the CHECKs: %s refused by %q", insert, got)
		}
	}
	if got := refusedBy(t, db, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'forbidden', 'E', '{}')`); got != "app_short_ids" {
		t.Fatalf("the application's CHECK: refused by %q", got)
	}
	if changed, err := outboxdb.SetChecks(ctx, db, tb, false, time.Second); err != nil || changed {
		t.Fatalf("second drop: %v, %v; want nothing to do", changed, err)
	}
	if on, err := outboxdb.Checks(ctx, db, tb); err != nil || on {
		t.Fatalf("Checks after the drop: %v, %v", on, err)
	}

	// Back, NOT VALID: the bad rows written meanwhile stay, new ones are refused.
	if changed, err := outboxdb.SetChecks(ctx, db, tb, true, time.Second); err != nil || !changed {
		t.Fatalf("add back: %v, %v", changed, err)
	}
	for _, rel := range append([]string{"outbox"}, partitions...) {
		got := checksFromCatalog(t, db, rel)
		for name := range badInserts {
			if valid, ok := got[name]; !ok || valid {
				t.Fatalf("%s after adding back: %v, want %s NOT VALID", rel, got, name)
			}
		}
	}
	var bad int
	if err := db.QueryRow(`SELECT count(*) FROM outbox WHERE aggregate_type = '' OR aggregate_id = '' OR event_type = '' OR jsonb_typeof(headers) <> 'object'`).Scan(&bad); err != nil || bad != len(badInserts) {
		t.Fatalf("rows written without the CHECKs: %d, %v; want %d kept", bad, err, len(badInserts))
	}
	for name, insert := range badInserts {
		if got := refusedBy(t, db, insert); got != name {
			t.Fatalf("CHECKs back: %s refused by %q, want %q", insert, got, name)
		}
	}
	if on, err := outboxdb.Checks(ctx, db, tb); err != nil || !on {
		t.Fatalf("Checks after adding back: %v, %v", on, err)
	}
	if changed, err := outboxdb.SetChecks(ctx, db, tb, true, time.Second); err != nil || changed {
		t.Fatalf("second add: %v, %v; want nothing to do", changed, err)
	}

	// A day's partition created afterwards gets them (as valid: it starts empty) and refuses
	// what the table refuses.
	later := time.Now().UTC().AddDate(0, 0, 5)
	if _, err := outboxdb.EnsurePartitions(ctx, db, tb, later, later); err != nil {
		t.Fatal(err)
	}
	newDay := "outbox_p" + later.Format("20060102")
	got := checksFromCatalog(t, db, newDay)
	for name := range badInserts {
		if valid, ok := got[name]; !ok || !valid {
			t.Fatalf("%s: %v, want %s valid", newDay, got, name)
		}
	}
	if _, err := db.Exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) VALUES ('t', '', 'E', '{}', $1)`, later); err == nil {
		t.Fatalf("an empty aggregate id into %s was accepted", newDay)
	}
}

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

func hasKey(m map[string]bool, k string) bool { _, ok := m[k]; return ok }

// partitionNames lists the table's partitions, from pg_inherits.
func partitionNames(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'outbox'::regclass`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	if len(out) < 2 {
		t.Fatalf("partitions %v, want several", out)
	}
	return out
}
