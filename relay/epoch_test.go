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
	cmd := exec.Command(filepath.Join(srv.BinDir, "pg_resetwal"), "-x", strconv.FormatUint(uint64(xid), 10), "-D", srv.DataDir)
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
