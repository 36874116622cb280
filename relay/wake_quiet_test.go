package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outbox"
)

// A relay woken by notifications that idles renews its claim to be woken every poll interval
// (the fallback). Under snapshot tracking each renewal is the claim and the quiet check
// (quietSince) in one round trip: while nothing is committed no batch is opened, so the outbox
// table is not read and the cursor not written. The database says so, not the relay: the scans
// of the table's partitions (pg_stat_user_tables), the cursor rows' xmin, and the claim's expiry
// in the claim table, which moves at each renewal.
//
// Then the events a renewal that opens no batch must not miss, each read by an independent
// consumer: one committed by a writer that bypasses the insert trigger
// (session_replication_role = replica: it notifies nobody), which only the renewal's check can
// find; one of such a writer whose transaction stays open across renewals (the check answers
// quiet while it is in progress, and its end makes the next one not quiet); and one through the
// trigger, woken by its notification.
func TestNotifiedIdleRenewsWithoutABatch(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.renew", 3)
	ctx := context.Background()
	notes := countNotifications(t, url)
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
	cfg.PollInterval = 200 * time.Millisecond // the fallback: a renewal every 200 ms
	cfg.StatsInterval = time.Hour             // no other reader of the table
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "relay ready", r.Ready)
	c := newCollector(t, k, topic)
	if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: "a", Seq: 0}}); err != nil {
		t.Fatal(err)
	}
	c.waitDistinct(t, 1, 10*time.Second)

	claims := &claimWatch{pool: pool}
	claims.await(t, 6) // the first event's fetches and cursor write have reached the statistics
	scans0, cursor0 := outboxScans(t, pool), cursorXmins(t, pool)
	claims.await(t, 16) // ten renewals, then six more for their statistics to arrive
	scans, cursor := outboxScans(t, pool)-scans0, cursorXmins(t, pool)
	t.Logf("%d renewals of the claim idle: %d scans of the outbox table, cursor rows' xmin %s then %s", claims.n-6, scans, cursor0, cursor)
	if scans > 1 {
		t.Errorf("%d scans of the outbox table during 10 idle renewals: the relay opened batches", scans)
	}
	if cursor != cursor0 {
		t.Errorf("the cursor rows were written while idle: xmin %s, then %s", cursor0, cursor)
	}

	notified := notes.n.Load()
	bypass := func(agg string, open func()) time.Time {
		t.Helper()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
				return err
			}
			if _, err := w.Append(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: agg, EventType: "Bypass",
				Payload: []byte(`{}`), EventID: newUUID()}); err != nil {
				return err
			}
			open()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	at := bypass("b", func() {})
	c.waitDistinct(t, 2, 10*time.Second)
	t.Logf("a writer that bypassed the trigger: published %s after its commit", time.Since(at).Round(time.Millisecond))

	at = bypass("c", func() { claims.await(t, claims.n+3) }) // open across three renewals
	c.waitDistinct(t, 3, 10*time.Second)
	t.Logf("a writer open across renewals that bypassed the trigger: published %s after its commit", time.Since(at).Round(time.Millisecond))
	if n := notes.n.Load(); n != notified {
		t.Fatalf("%d notifications for writers that bypassed the trigger", n-notified)
	}

	claims.await(t, claims.n+1) // idle again, under a claim
	at = time.Now()
	if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: "d", Seq: 0}}); err != nil {
		t.Fatal(err)
	}
	c.waitDistinct(t, 4, 10*time.Second)
	t.Logf("a writer through the trigger: published %s after its commit", time.Since(at).Round(time.Millisecond))
	waitFor(t, 10*time.Second, "the writer's notification", func() bool { return notes.n.Load() > notified })
	if dups := len(c.recs) - len(c.byEvent); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
}

// claimWatch follows the expiry of the one relay's claim to be woken in the claim table: each
// change after the first one seen is a renewal (n).
type claimWatch struct {
	pool  *pgxpool.Pool
	n     int
	until time.Time
}

// await waits until n renewals were seen since the watch began.
func (cw *claimWatch) await(t *testing.T, n int) {
	t.Helper()
	waitFor(t, 30*time.Second, "renewals of the relay's claim", func() bool {
		var until time.Time
		if err := cw.pool.QueryRow(context.Background(), `SELECT max(until) FROM `+testTable.Derived("relay_waiting")).Scan(&until); err != nil {
			return false
		}
		if !until.Equal(cw.until) {
			if !cw.until.IsZero() {
				cw.n++
			}
			cw.until = until
		}
		return cw.n >= n
	})
}

// outboxScans is the number of sequential and index scans of the outbox table's partitions.
func outboxScans(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(s.seq_scan + coalesce(s.idx_scan, 0)), 0)::int8
		FROM pg_partition_tree($1::regclass) p JOIN pg_stat_user_tables s ON s.relid = p.relid`, testTable.String()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// cursorXmins is the xmin of every cursor row: a write changes it.
func cursorXmins(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(xmin::text, ',' ORDER BY id), '') FROM `+testTable.Derived("relay_cursor")).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}
