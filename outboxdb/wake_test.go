package outboxdb_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// wakeFixture is one database with the outbox schema, a listener on the table's channel (the
// observer: what PostgreSQL delivered, not what the protocol's functions say) and sessions that
// play relays and writers.
type wakeFixture struct {
	t        *testing.T
	ctx      context.Context
	url      string
	tb       outboxdb.Table
	sql      outboxdb.WakeSQL
	listener *pgx.Conn
}

func newWakeFixture(t *testing.T) *wakeFixture {
	ctx := context.Background()
	db, url := openDB(t)
	tb := outboxdb.MustParseTable("outbox")
	if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
		t.Fatal(err)
	}
	f := &wakeFixture{t: t, ctx: ctx, url: url, tb: tb, sql: outboxdb.WakeStatements(tb)}
	f.listener = f.conn()
	if _, err := f.listener.Exec(ctx, "LISTEN "+pgx.Identifier{tb.Channel()}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *wakeFixture) conn() *pgx.Conn {
	f.t.Helper()
	c, err := pgx.Connect(f.ctx, f.url)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// insert runs n inserts in one transaction on c.
func (f *wakeFixture) insert(c *pgx.Conn, n int) {
	f.t.Helper()
	err := pgx.BeginFunc(f.ctx, c, func(tx pgx.Tx) error { return f.insertIn(tx, n) })
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *wakeFixture) insertIn(tx pgx.Tx, n int) error {
	for i := range n {
		if _, err := tx.Exec(f.ctx, fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', $1, 'OrderCreated', '{}')`, f.tb.Ident()), fmt.Sprint(i)); err != nil {
			return err
		}
	}
	return nil
}

// notifications counts what the listener receives until it has been quiet for quiet.
func (f *wakeFixture) notifications(quiet time.Duration) int {
	f.t.Helper()
	got := 0
	for {
		wctx, cancel := context.WithTimeout(f.ctx, quiet)
		n, err := f.listener.WaitForNotification(wctx)
		cancel()
		if err != nil {
			return got
		}
		if n.Channel != f.tb.Channel() || n.Payload != "" {
			f.t.Fatalf("notification %q on %q", n.Payload, n.Channel)
		}
		got++
	}
}

// expect runs a transaction of inserts on c and checks how many notifications arrive.
func (f *wakeFixture) expect(c *pgx.Conn, inserts, want int, what string) {
	f.t.Helper()
	f.insert(c, inserts)
	if n := f.notifications(300 * time.Millisecond); n != want {
		f.t.Fatalf("%s: %d notifications for a transaction of %d inserts, want %d", what, n, inserts, want)
	}
}

func (f *wakeFixture) wait(c *pgx.Conn, claim time.Duration, watch []int64) []int64 {
	f.t.Helper()
	var out []int64
	if err := c.QueryRow(f.ctx, f.sql.Wait, claim.Seconds(), watch).Scan(&out); err != nil {
		f.t.Fatal(err)
	}
	return out
}

func (f *wakeFixture) woke(c *pgx.Conn) {
	f.t.Helper()
	if _, err := c.Exec(f.ctx, f.sql.Woke); err != nil {
		f.t.Fatal(err)
	}
}

func xidOf(t *testing.T, ctx context.Context, tx pgx.Tx) int64 {
	t.Helper()
	var x int64
	if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::int8").Scan(&x); err != nil {
		t.Fatal(err)
	}
	return x
}

// Inserts notify only while a relay claims a wait: once per transaction then, never otherwise.
// The migration starts in the old behaviour (always notify) for relays that never claim.
func TestWakeOnDemand(t *testing.T) {
	f := newWakeFixture(t)
	writer, relayA, relayB := f.conn(), f.conn(), f.conn()

	f.expect(writer, 100, 1, "fresh schema (relays that predate the protocol still wake)")
	f.woke(relayA)
	f.expect(writer, 3, 0, "no relay waits")
	f.wait(relayA, time.Minute, nil)
	f.expect(writer, 100, 1, "a relay waits")
	f.expect(writer, 1, 1, "a relay waits, next transaction")
	f.wait(relayB, time.Minute, nil)
	f.woke(relayA)
	f.expect(writer, 1, 1, "relay B still waits after A woke")
	f.woke(relayB)
	f.expect(writer, 1, 0, "both relays woke")

	// A claim expires by itself: a relay that died leaves writers notifying only briefly.
	f.wait(relayA, 200*time.Millisecond, nil)
	f.expect(writer, 1, 1, "within the claim")
	time.Sleep(250 * time.Millisecond) // past the claim's expiry, measured by PostgreSQL's clock
	f.expect(writer, 1, 0, "after the claim expired")
}

// The race the protocol closes: a writer that inserted (and read "nobody waits") before the
// claim, and commits after the relay's fetch. The claim returns its transaction, a renewal keeps
// returning it until it ends; a REPEATABLE READ writer whose snapshot predates the claim still
// sees it (the claim is not read through a snapshot).
func TestWakeClaimWatchesWritersInProgress(t *testing.T) {
	f := newWakeFixture(t)
	writer, rrWriter, relay := f.conn(), f.conn(), f.conn()
	const quiet = 300 * time.Millisecond
	f.woke(relay)

	tx, err := writer.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx)
	if err := f.insertIn(tx, 1); err != nil { // reads "nobody waits": it will not notify
		t.Fatal(err)
	}
	x := xidOf(t, f.ctx, tx)
	rr, err := rrWriter.BeginTx(f.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Rollback(f.ctx)
	if _, err := rr.Exec(f.ctx, "SELECT 1"); err != nil { // its snapshot is taken now, before the claim
		t.Fatal(err)
	}

	watch := f.wait(relay, time.Minute, nil)
	if !slices.Contains(watch, x) {
		t.Fatalf("the claim returned %v: the writer in progress (xid %d) that read no claim is missing", watch, x)
	}
	if again := f.wait(relay, time.Minute, watch); !slices.Contains(again, x) {
		t.Fatalf("renewal returned %v while xid %d is still in progress", again, x)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.notifications(quiet); n != 0 {
		t.Fatalf("the writer that inserted before the claim notified %d times: the watch is what covers it", n)
	}
	if again := f.wait(relay, time.Minute, watch); slices.Contains(again, x) {
		t.Fatalf("renewal returned %v after xid %d committed", again, x)
	}

	if err := f.insertIn(rr, 1); err != nil {
		t.Fatal(err)
	}
	if err := rr.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.notifications(quiet); n != 1 {
		t.Fatalf("a REPEATABLE READ writer whose snapshot predates the claim: %d notifications, want 1", n)
	}
}

// A new claim writes its session's row in a subtransaction, which draws an id after the claim
// took effect (the upper bound of what it watches); a renewal of a live claim writes it in the
// claiming transaction itself and draws no second id (migration 00021). The database says so:
// the row's xmin against the transaction's own id. A renewal after the claim lapsed is a new
// claim again. Each renewal still returns the watched writers in progress.
func TestWakeRenewalDrawsOneID(t *testing.T) {
	f := newWakeFixture(t)
	writer, relay := f.conn(), f.conn()
	tx, err := writer.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx)
	if err := f.insertIn(tx, 1); err != nil {
		t.Fatal(err)
	}
	x := xidOf(t, f.ctx, tx)
	claim := func(d time.Duration, watch []int64) (res []int64, own, rowXmin int64) {
		t.Helper()
		err := pgx.BeginFunc(f.ctx, relay, func(c pgx.Tx) error {
			if err := c.QueryRow(f.ctx, f.sql.Wait, d.Seconds(), watch).Scan(&res); err != nil {
				return err
			}
			return c.QueryRow(f.ctx, `SELECT pg_current_xact_id()::text::int8 & 4294967295,
				(SELECT xmin::text::int8 FROM `+f.tb.Derived("relay_waiting")+` WHERE pid = pg_backend_pid())`).Scan(&own, &rowXmin)
		})
		if err != nil {
			t.Fatal(err)
		}
		return res, own, rowXmin
	}
	watch, own, row := claim(time.Minute, nil)
	if row == own {
		t.Errorf("a new claim wrote its row with the transaction's own id %d: no id drawn after the claim", own)
	}
	if !slices.Contains(watch, x) {
		t.Fatalf("the new claim returned %v without the writer in progress %d", watch, x)
	}
	again, own, row := claim(time.Minute, watch)
	if row != own {
		t.Errorf("a renewal of a live claim wrote its row with id %d, not its transaction's %d: it drew a second id", row, own)
	}
	if !slices.Contains(again, x) {
		t.Fatalf("the renewal returned %v without the writer in progress %d", again, x)
	}
	// A claim that lapsed: its renewal is a new claim.
	_, _, _ = claim(time.Millisecond, again)
	observer := f.conn()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var lapsed bool
		if err := observer.QueryRow(f.ctx, `SELECT until < now() FROM `+f.tb.Derived("relay_waiting")+` WHERE pid = $1`,
			relay.PgConn().PID()).Scan(&lapsed); err != nil {
			t.Fatal(err)
		}
		if lapsed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a claim of a millisecond has not lapsed after 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	if _, own, row := claim(time.Minute, again); row == own {
		t.Errorf("a renewal after the claim lapsed wrote its row with the transaction's own id %d: it was taken for a live claim", own)
	}
}

// An application role with only INSERT on the outbox (and USAGE on its id sequence) appends
// with or without a claim; the trigger's condition reads the claim sequence, which the
// migration lets anyone read.
func TestWakeForAnApplicationRole(t *testing.T) {
	f := newWakeFixture(t)
	admin, relay := f.conn(), f.conn()
	role := fmt.Sprintf("outbox_app_%d", time.Now().UnixNano()%1_000_000)
	if _, err := admin.Exec(f.ctx, fmt.Sprintf(`CREATE ROLE %[1]s LOGIN;
		GRANT USAGE ON SCHEMA public TO %[1]s;
		GRANT INSERT ON %[2]s TO %[1]s;
		GRANT USAGE ON SEQUENCE public.outbox_id_seq TO %[1]s`, role, f.tb.Ident())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE %[1]s`, role))
	})
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	app, err := pgx.Connect(f.ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(f.ctx)
	f.woke(relay)
	f.expect(app, 1, 0, "application role, no claim")
	f.wait(relay, time.Minute, nil)
	f.expect(app, 1, 1, "application role, a relay waits")
}

// A table whose relays poll drops its insert trigger: its writers never notify, even while a
// relay claims a wait. Creating it again restores the wake-ups (a statement trigger lives on the
// partitioned table alone, so partitions created meanwhile need nothing). A change waits for the table's lock at most as long as asked:
// behind an open insert it fails and leaves the table as it was.
func TestSetNotify(t *testing.T) {
	f := newWakeFixture(t)
	db, err := sql.Open("pgx", f.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	writer, relay := f.conn(), f.conn()
	triggers := func() int {
		t.Helper()
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pg_trigger WHERE tgname = 'outbox_notify'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	withTrigger := triggers()
	if on, err := outboxdb.Notifies(f.ctx, db, f.tb); err != nil || !on || withTrigger != 1 {
		t.Fatalf("a new table: notifies %v (%v), %d triggers", on, err, withTrigger)
	}
	if changed, err := outboxdb.SetNotify(f.ctx, db, f.tb, true, time.Second); err != nil || changed {
		t.Fatalf("SetNotify(true) on a table with its trigger: changed %v, %v", changed, err)
	}

	// Behind an open insert (its ROW EXCLUSIVE lock) the change gives up after the wait asked.
	blocker, err := writer.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.insertIn(blocker, 1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := outboxdb.SetNotify(f.ctx, db, f.tb, false, 200*time.Millisecond); err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("SetNotify behind an open insert: %v after %s, want a lock timeout", err, time.Since(start))
	}
	if err := blocker.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if n := triggers(); n != withTrigger {
		t.Fatalf("a failed change left %d triggers, want %d", n, withTrigger)
	}

	if changed, err := outboxdb.SetNotify(f.ctx, db, f.tb, false, time.Second); err != nil || !changed {
		t.Fatalf("SetNotify(false): changed %v, %v", changed, err)
	}
	if on, err := outboxdb.Notifies(f.ctx, db, f.tb); err != nil || on || triggers() != 0 {
		t.Fatalf("after SetNotify(false): notifies %v (%v), %d triggers", on, err, triggers())
	}
	f.wait(relay, time.Minute, nil)
	f.expect(writer, 5, 0, "a relay claims a wait on a table without trigger")

	if changed, err := outboxdb.SetNotify(f.ctx, db, f.tb, true, time.Second); err != nil || !changed {
		t.Fatalf("SetNotify(true): changed %v, %v", changed, err)
	}
	if on, err := outboxdb.Notifies(f.ctx, db, f.tb); err != nil || !on || triggers() != 1 {
		t.Fatalf("after SetNotify(true): notifies %v (%v), %d triggers", on, err, triggers())
	}
	f.expect(writer, 5, 1, "a relay waits, the trigger is back")
}
