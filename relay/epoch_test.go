package relay

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// epoch1 is the first 64-bit transaction id (xid8) of epoch 1: the 32-bit counter has wrapped.
const epoch1 = int64(1) << 32

// serverCredential is the user the test servers run as: nil when the tests do not run as root,
// the "postgres" system user when they do (initdb, postgres, pg_resetwal and pgbouncer refuse
// root).
func serverCredential(t testing.TB) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("running as root needs a 'postgres' system user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// setNextXid stops srv, sets its next transaction id with pg_resetwal -x and starts it again.
// pg_resetwal's documentation: the commit log (pg_xact) must hold the page of the new id; a
// segment file covers 1,048,576 ids (32 pages of 8 kB, 2 bits an id) and is named by the id's
// number divided by that, in hexadecimal. The test creates the segment, zeroed (no id in it has
// been used). track_commit_timestamp is off, so pg_commit_ts needs nothing (-c).
func setNextXid(t testing.TB, srv *pgtest.Server, xid uint32) {
	t.Helper()
	resetwal := filepath.Join(srv.BinDir, "pg_resetwal")
	if _, err := os.Stat(resetwal); err != nil {
		// The version matrix's servers (hack/pg-versions.sh) ship initdb, pg_ctl and postgres only.
		t.Skipf("no pg_resetwal beside the server (%s): %v", srv.BinDir, err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	cred := serverCredential(t)
	seg := filepath.Join(srv.DataDir, "pg_xact", fmt.Sprintf("%04X", xid/(1<<20)))
	if _, err := os.Stat(seg); os.IsNotExist(err) {
		if err := os.WriteFile(seg, make([]byte, 32*8192), 0o600); err != nil {
			t.Fatal(err)
		}
		if cred != nil {
			if err := os.Chown(seg, int(cred.Uid), int(cred.Gid)); err != nil {
				t.Fatal(err)
			}
		}
	}
	cmd := exec.Command(resetwal, "-x", strconv.FormatUint(uint64(xid), 10), "-D", srv.DataDir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pg_resetwal -x %d: %v: %s", xid, err, out)
	}
	if err := srv.StartAgain(); err != nil {
		t.Fatal(err)
	}
}

// freezeAll runs VACUUM FREEZE in every database of srv (template0 included), so that no row
// keeps a transaction id that a jump of the counter by up to 2^31 would put in the future.
func freezeAll(t testing.TB, srv *pgtest.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `ALTER DATABASE template0 WITH ALLOW_CONNECTIONS true`); err != nil {
		t.Fatal(err)
	}
	for _, db := range []string{"template0", "template1", "postgres"} {
		c, err := pgx.Connect(ctx, srv.URL(db))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Exec(ctx, `VACUUM FREEZE`)
		c.Close(ctx)
		if err != nil {
			t.Fatalf("VACUUM FREEZE in %s: %v", db, err)
		}
	}
	if _, err := conn.Exec(ctx, `ALTER DATABASE template0 WITH ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
}

// TestXidEpochCrossing: a cluster of its own whose transaction-id counter is moved (pg_resetwal
// -x) to 20,000 ids before 2^32, in three jumps of 1.5 billion or less with a VACUUM FREEZE of
// every database after each (a single jump would put the rows initdb left unfrozen in the future,
// and past the distance at which PostgreSQL stops to avoid wraparound). Four outbox tables in
// one database, one per tracking mode and wake-up mode (notify: the insert trigger and claims;
// poll: no trigger), each with its relay, a writer that keeps it busy in bursts (so that the
// notify relays claim waits and the snapshot relays take quiet polls) and a transaction opened
// before the crossing and committed after it. A burner draws transaction ids until the counter
// has wrapped (epoch 1: pg_current_xact_id() and every pg_snapshot value past 4294967296) and
// 20,000 more. The independent consumer must have every event of every table, in order per
// aggregate; the database must show rows written on both sides of the crossing and the snapshot
// cursors in epoch 1.
func TestXidEpochCrossing(t *testing.T) {
	began := time.Now()
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(filepath.Dir(srv.DataDir), "server.log"))
			t.Logf("server log (tail):\n%s", bouncerTail(string(log), 4000))
		}
	})
	// Each jump stays well within 2^31 - 3M of the oldest unfrozen id (PostgreSQL stops accepting
	// commands at that distance: "database is not accepting commands to avoid wraparound data
	// loss"), and everything is frozen before the next one.
	for _, xid := range []uint32{1_500_000_000, 3_000_000_000} {
		setNextXid(t, srv, xid)
		freezeAll(t, srv)
	}
	const before = 20_000
	setNextXid(t, srv, uint32(epoch1-before))
	url := srv.NewDatabase(t)
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 16 // four writers, four transactions held open across the crossing, the burner
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var xid0 int64
	if err := pool.QueryRow(ctx, `SELECT pg_current_xact_id()::text::int8`).Scan(&xid0); err != nil {
		t.Fatal(err)
	}
	if xid0 >= epoch1 || xid0 < epoch1-before-1000 {
		t.Fatalf("the counter is at %d after pg_resetwal, want just below %d", xid0, epoch1)
	}
	t.Logf("transaction ids start at %d, %d before the epoch changes (cluster ready in %s)", xid0, epoch1-xid0, time.Since(began).Round(time.Millisecond))

	k := kafkatest.Start(t, kafkatest.Apache)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	type table struct {
		name     string
		t        outboxdb.Table
		tracking Tracking
		notify   bool
		topic    string
		relay    *running
		c        *collector
		w        *outbox.Writer
		load     *seqtest.Load
		long     pgx.Tx
		claims   float64
		quiet    float64
	}
	var tables []*table
	for _, tr := range trackings {
		for _, notify := range []bool{true, false} {
			wake := "poll"
			if notify {
				wake = "notify"
			}
			name := fmt.Sprintf("public.outbox_%s_%s", tr, wake)
			tb := &table{name: name, t: outboxdb.MustParseTable(name), tracking: tr, notify: notify}
			if err := pgtest.OutboxSchema(ctx, url, tb.t, 1); err != nil {
				t.Fatal(err)
			}
			if !notify {
				if _, err := outboxdb.SetNotify(ctx, db, tb.t, false, 5*time.Second); err != nil {
					t.Fatal(err)
				}
			}
			tb.topic = kafkatest.UniqueTopic("relay.epoch")
			k.CreateTopic(t, tb.topic, 3)
			cfg := withTracking(testConfig(url, k.Brokers, tb.topic), tr)
			cfg.Table = tb.t
			cfg.Notify = notify
			cfg.PollInterval = 20 * time.Millisecond
			if notify {
				cfg.PollInterval = time.Second
			}
			cfg.BatchSize = 100
			tb.relay = startRelay(t, cfg, fmt.Sprintf("%s/%s", tr, wake))
			tb.c = newCollector(t, k, tb.topic)
			if tb.w, err = outbox.New(name); err != nil {
				t.Fatal(err)
			}
			tables = append(tables, tb)
		}
	}
	for _, tb := range tables {
		waitFor(t, 30*time.Second, tb.name+" relay readiness", tb.relay.Ready)
	}
	for _, tb := range tables {
		tb.claims = metricValue(t, tb.relay.metrics.claims)
		tb.quiet = metricValue(t, tb.relay.metrics.quietPolls)
		// In bursts: a writer whose transactions of 5 events come every 3 ms, with the relay idle
		// between some of them.
		tb.load = seqtest.StartLoad(ctx, pool, tb.w, "order", 100, 1, 5, 3*time.Millisecond)
		if tb.long, err = pool.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tb.long.Rollback(ctx) }()
		if err := seqtest.AppendIn(ctx, tb.long, tb.w, "order", []seqEvent{{Agg: "long", Seq: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	var longXid int64
	if err := tables[0].long.QueryRow(ctx, `SELECT pg_current_xact_id()::text::int8`).Scan(&longXid); err != nil {
		t.Fatal(err)
	}
	// Events published in epoch 0 first.
	for _, tb := range tables {
		waitFor(t, 30*time.Second, tb.name+": events published before the crossing", func() bool {
			return metricValue(t, tb.relay.metrics.published) >= 200
		})
	}
	// The burner: transactions of 200 subtransactions that each write, 201 ids a call.
	if _, err := pool.Exec(ctx, `CREATE TABLE burn (x int);
CREATE FUNCTION burn(n int) RETURNS int8 LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..n LOOP
    BEGIN
      INSERT INTO burn VALUES (i);
    EXCEPTION WHEN raise_exception THEN NULL;
    END;
  END LOOP;
  TRUNCATE burn;
  RETURN pg_current_xact_id()::text::int8;
END $$`); err != nil {
		t.Fatal(err)
	}
	// Fast up to 3,000 ids before the crossing; through the 6,000 ids around it one top-level
	// transaction an id, paced (a few seconds, while the relays take their snapshots and claims);
	// fast again to 20,000 past it.
	const zone = 3_000
	var (
		xid                 int64
		zoneStart, zoneTook time.Duration
		claimsIn, quietIn   = map[string]float64{}, map[string]float64{}
	)
	crossStart := time.Now()
	deadline := time.Now().Add(3 * time.Minute)
	for xid < epoch1+before {
		if time.Now().After(deadline) {
			t.Fatalf("the counter reached %d within 3 minutes", xid)
		}
		burn := `SELECT burn(200)`
		inZone := xid >= epoch1-zone && xid < epoch1+zone
		if inZone {
			burn = `SELECT pg_current_xact_id()::text::int8`
			if zoneStart == 0 {
				zoneStart = time.Since(crossStart)
				for _, tb := range tables {
					claimsIn[tb.name] = metricValue(t, tb.relay.metrics.claims)
					quietIn[tb.name] = metricValue(t, tb.relay.metrics.quietPolls)
				}
			}
		} else if zoneStart != 0 && zoneTook == 0 {
			zoneTook = time.Since(crossStart) - zoneStart
			for _, tb := range tables {
				claimsIn[tb.name] = metricValue(t, tb.relay.metrics.claims) - claimsIn[tb.name]
				quietIn[tb.name] = metricValue(t, tb.relay.metrics.quietPolls) - quietIn[tb.name]
			}
		}
		if err := pool.QueryRow(ctx, burn).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		if inZone && xid%10 == 0 {
			time.Sleep(5 * time.Millisecond) // the pace of the zone: about 2,000 ids a second
		}
	}
	t.Logf("the counter went through the %d ids around 2^32 in %s, one transaction each, with the writers and relays at work; now at %d (epoch %d, 32-bit id %d)",
		2*zone, zoneTook.Round(time.Millisecond), xid, xid>>32, xid&(1<<32-1))
	// The transactions opened in epoch 0 commit in epoch 1.
	for _, tb := range tables {
		if err := tb.long.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, tb := range tables {
		written := tb.load.Written()
		waitFor(t, 30*time.Second, tb.name+": more events in epoch 1", func() bool { return tb.load.Written() > written+500 })
	}
	for _, tb := range tables {
		all := tb.load.Stop(t)
		if err := seqtest.Append(ctx, pool, tb.w, "order", []seqEvent{{Agg: "long", Seq: 2}}); err != nil {
			t.Fatal(err)
		}
		all["long"] = 2
		total := tb.load.Written() + 2
		tb.c.waitDistinct(t, total, 2*time.Minute)
		tb.c.poll(t, 200*time.Millisecond)
		if dups := checkOrder(t, tb.c.recs, all); dups != 0 {
			t.Errorf("%s: %d duplicates", tb.name, dups)
		}
		waitFor(t, 30*time.Second, tb.name+": nothing pending", func() bool {
			var n int
			return pool.QueryRow(ctx, `SELECT `+tb.t.Derived("pending")+`()`).Scan(&n) == nil && n == 0
		})
		var below, above int
		var minTxid, maxTxid int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE txid < $1::text::xid8), count(*) FILTER (WHERE txid >= $1::text::xid8),
  min(txid::text::int8), max(txid::text::int8) FROM `+tb.t.Ident(), strconv.FormatInt(epoch1, 10)).Scan(&below, &above, &minTxid, &maxTxid); err != nil {
			t.Fatal(err)
		}
		if below == 0 || above == 0 {
			t.Errorf("%s: %d rows written in epoch 0, %d in epoch 1: the load did not span the crossing", tb.name, below, above)
		}
		detail := ""
		if tb.tracking == TrackSnapshot {
			var snap string
			var xmin int64
			if err := pool.QueryRow(ctx, `SELECT snap::text, pg_snapshot_xmin(snap)::text::int8 FROM `+tb.t.Derived("relay_cursor")).Scan(&snap, &xmin); err != nil {
				t.Fatal(err)
			}
			if xmin < epoch1 {
				t.Errorf("%s: the cursor's snapshot %s is still in epoch 0", tb.name, snap)
			}
			detail = fmt.Sprintf(", cursor at %s", snap)
		}
		t.Logf("%s: %d events (%d written in epoch 0, %d in epoch 1, txids %d..%d), in order; %d claims and %d quiet polls during the test, %d and %d while the counter crossed 2^32%s",
			tb.name, total, below, above, minTxid, maxTxid,
			int(metricValue(t, tb.relay.metrics.claims)-tb.claims), int(metricValue(t, tb.relay.metrics.quietPolls)-tb.quiet),
			int(claimsIn[tb.name]), int(quietIn[tb.name]), detail)
	}
	t.Logf("the long transactions began in epoch 0 (xid8 %d) and committed in epoch 1; test took %s", longXid, time.Since(began).Round(time.Millisecond))
}

// newWrapCluster starts a cluster of its own whose next transaction id is before ids ahead of
// the crossing into epoch 1 (the jumps of TestXidEpochCrossing), with autovacuum off so that
// nothing but the test draws ids (an automatic ANALYZE would), and returns it with a new
// database holding the outbox schema.
func newWrapCluster(t *testing.T, before uint32) (*pgtest.Server, string) {
	t.Helper()
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	for _, xid := range []uint32{1_500_000_000, 3_000_000_000} {
		setNextXid(t, srv, xid)
		freezeAll(t, srv)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ALTER SYSTEM SET autovacuum = off`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	setNextXid(t, srv, uint32(epoch1-int64(before)))
	url := srv.NewDatabase(t)
	if err := pgtest.OutboxSchema(ctx, url, testTable, 1); err != nil {
		t.Fatal(err)
	}
	return srv, url
}

// burnTo draws transaction ids on conn until the next one is next, exactly.
func burnTo(t *testing.T, conn *pgx.Conn, next int64) {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS burn (x int);
CREATE OR REPLACE FUNCTION burn(n int) RETURNS int8 LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..n LOOP
    BEGIN
      INSERT INTO burn VALUES (i);
    EXCEPTION WHEN raise_exception THEN NULL;
    END;
  END LOOP;
  RETURN pg_current_xact_id()::text::int8;
END $$`); err != nil {
		t.Fatal(err)
	}
	var x int64
	if err := conn.QueryRow(ctx, `SELECT pg_current_xact_id()::text::int8`).Scan(&x); err != nil {
		t.Fatal(err)
	}
	for x < next-1 {
		sql, args := `SELECT pg_current_xact_id()::text::int8`, []any{}
		if left := next - 1 - x; left > 100 {
			// burn(n) draws its own id and then n more: x+1 .. x+1+n.
			sql, args = `SELECT burn($1) + $1`, []any{min(left-50, 5000)}
		}
		if err := conn.QueryRow(ctx, sql, args...).Scan(&x); err != nil {
			t.Fatal(err)
		}
	}
	if x != next-1 {
		t.Fatalf("the counter passed %d: at %d", next-1, x)
	}
}

// TestXidWrapEdges checks, on the statements the relays run, the two places where the
// 32-bit counter's wrap meets the relays' 64-bit ids, at the exact id where it wraps (ids
// 2^32 + 0, 1 and 2 are never drawn: the counter goes from 4294967295 to 4294967299):
//
//   - claim: a relay's wait claim (_relay_wait, migration 00015) whose transaction has the last id
//     of epoch 0 and whose subtransaction, drawn after the claim, the first of epoch 1. The claim
//     bounds the writers it watches by that subtransaction's 32-bit xmin, given the epoch: it must
//     watch the writer in progress, list no id that is never drawn, and renewals must drop the
//     writer once it has ended.
//   - snapshot: a snapshot relay's batch opened by a transaction whose id is the first of epoch 1
//     while the raw snapshot's xmax is the last of epoch 0, so that the widened snapshot lists ids
//     on both sides of the wrap (and the three never drawn); the events of the two writers it
//     lists, one from each side, must be in the next batch.
func TestXidWrapEdges(t *testing.T) {
	t.Run("claim", func(t *testing.T) {
		_, url := newWrapCluster(t, 5_000)
		ctx := context.Background()
		pool := newPool(t, url)
		w, err := outbox.New(testTable.String())
		if err != nil {
			t.Fatal(err)
		}
		writer, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = writer.Rollback(ctx) }()
		if err := seqtest.AppendIn(ctx, writer, w, "order", []seqEvent{{Agg: "a", Seq: 1}}); err != nil {
			t.Fatal(err)
		}
		var wxid int64
		if err := writer.QueryRow(ctx, `SELECT pg_current_xact_id()::text::int8`).Scan(&wxid); err != nil {
			t.Fatal(err)
		}
		relayConn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer relayConn.Close(ctx)
		burnTo(t, relayConn, epoch1-1)
		var watch []int64
		var own int64
		if err := relayConn.QueryRow(ctx, `SELECT `+testTable.Derived("relay_wait")+`('10 seconds'::interval, NULL), pg_current_xact_id()::text::int8`).Scan(&watch, &own); err != nil {
			t.Fatalf("the claim at the last id of epoch 0: %v", err)
		}
		var subXmin string
		if err := relayConn.QueryRow(ctx, `SELECT xmin::text FROM `+testTable.Derived("relay_waiting")+` WHERE pid = pg_backend_pid()`).Scan(&subXmin); err != nil {
			t.Fatal(err)
		}
		t.Logf("claim: own %d, its subtransaction's xmin %s, watch %v (the writer: %d)", own, subXmin, watch, wxid)
		if own != epoch1-1 {
			t.Fatalf("precondition: the claim's transaction is %d, want %d", own, epoch1-1)
		}
		if subXmin != "3" {
			t.Fatalf("precondition: the claim's subtransaction is %s, want 3 (the first id of epoch 1)", subXmin)
		}
		found := false
		for _, x := range watch {
			found = found || x == wxid
			if x&(1<<32-1) < 3 || x >= epoch1+3 || x == own {
				t.Errorf("the claim watches %d: an id never drawn, its own, or one drawn after the claim", x)
			}
		}
		if !found {
			t.Errorf("the claim does not watch the writer %d, in progress at it: its event could wait for the poll interval", wxid)
		}
		// A renewal keeps the writer while it is in progress and drops it once it ended.
		var renewed []int64
		if err := relayConn.QueryRow(ctx, `SELECT `+testTable.Derived("relay_wait")+`('10 seconds'::interval, $1)`, watch).Scan(&renewed); err != nil {
			t.Fatal(err)
		}
		if len(renewed) != 1 || renewed[0] != wxid {
			t.Errorf("renewed while the writer is open: watch %v, want [%d]", renewed, wxid)
		}
		if err := writer.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := relayConn.QueryRow(ctx, `SELECT `+testTable.Derived("relay_wait")+`('10 seconds'::interval, $1)`, renewed).Scan(&renewed); err != nil {
			t.Fatal(err)
		}
		if len(renewed) != 0 {
			t.Errorf("renewed after the writer committed: watch %v, want none", renewed)
		}
	})
	t.Run("snapshot", func(t *testing.T) {
		_, url := newWrapCluster(t, 5_000)
		ctx := context.Background()
		pool := newPool(t, url)
		w, err := outbox.New(testTable.String())
		if err != nil {
			t.Fatal(err)
		}
		q := newSnapQueries(testTable, false, 100)
		relayConn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer relayConn.Close(ctx)
		first, _ := openBatch(ctx, t, relayConn, q, unmarked(""))
		if !first.done {
			t.Fatalf("first batch of an empty table not empty: %+v", first)
		}
		insert := func(tx pgx.Tx, agg string) (id, xid int64) {
			if err := seqtest.AppendIn(ctx, tx, w, "order", []seqEvent{{Agg: agg, Seq: 1}}); err != nil {
				t.Fatal(err)
			}
			if err := tx.QueryRow(ctx, `SELECT max(id), max(txid::text::int8) FROM outbox WHERE aggregate_id = $1`, agg).Scan(&id, &xid); err != nil {
				t.Fatal(err)
			}
			return id, xid
		}
		early, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = early.Rollback(ctx) }()
		earlyID, earlyXid := insert(early, "early")
		burner, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer burner.Close(ctx)
		burnTo(t, burner, epoch1-1)
		last, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = last.Rollback(ctx) }()
		lastID, lastXid := insert(last, "last")
		if lastXid != epoch1-1 {
			t.Fatalf("precondition: the second writer's transaction is %d, want %d", lastXid, epoch1-1)
		}
		// The relay's round trip takes its id (the first of epoch 1) before it opens.
		s1, raw := openBatch(ctx, t, relayConn, q, first.to, `SELECT pg_current_xact_id()`)
		rawXmax, _, err := parseSnapshot(raw)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("raw snapshot %s, widened %s; writers %d (id %d) and %d (id %d)", raw, s1.to.text, earlyXid, earlyID, lastXid, lastID)
		if rawXmax != strconv.FormatInt(epoch1-1, 10) {
			t.Fatalf("precondition: the raw snapshot's xmax is %s, want %d", rawXmax, epoch1-1)
		}
		if ids := readBatch(ctx, t, relayConn, q, s1); len(ids) != 0 {
			t.Fatalf("a batch holds events of transactions in progress: %v", ids)
		}
		var quiet bool
		if _, xip, err := parseSnapshot(s1.to.text); err != nil {
			t.Fatal(err)
		} else if err := pool.QueryRow(ctx, q.quiet, s1.to.floor, xip).Scan(&quiet); err != nil {
			t.Fatalf("the quiet check on the widened snapshot: %v", err)
		}
		t.Logf("quiet check on the widened snapshot while both writers are open: %v", quiet)
		if err := early.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := last.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		s2, _ := openBatch(ctx, t, relayConn, q, s1.to)
		ids := readBatch(ctx, t, relayConn, q, s2)
		if len(ids) != 2 || ids[0] != earlyID || ids[1] != lastID {
			t.Fatalf("the batch after the wrap holds %v, want the events %d (epoch 0 writer) and %d (last id of epoch 0)", ids, earlyID, lastID)
		}
	})
}
