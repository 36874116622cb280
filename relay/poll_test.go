package relay

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// Wake-ups by polling (migration 00010): the table has no insert trigger and the relay polls
// every 20 ms without listening. Two cases, each checked by an independent consumer:
//
//   - A writer draws its event's id and stays open while the relay polls: the relay opens a
//     batch (snapshot tracking) or fetches (row tracking) once (the id sequence moved), finds
//     nothing committed, and then polls with the quiet check only while the writer is open (under
//     snapshot tracking no batch, no snapshot, no transaction id; under row tracking one small
//     statement instead of the fetch). The writer then commits, which moves nothing the relay
//     could see but the end of its transaction: the event must still arrive within the bound.
//   - Sporadic single-event transactions at random gaps (seed logged): each arrives within the
//     bound of its commit.
//
// The bound is 2 s, a hundred poll intervals (a relay that slept through an event would wait
// for another writer or, with the default interval, 10 s).
func TestWakeByPolling(t *testing.T) { forEachTracking(t, testWakeByPolling) }

func testWakeByPolling(t *testing.T, tracking Tracking) {
	url, pool, k, topic := newTopicDB(t, "relay.poll", 3)
	ctx := context.Background()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if changed, err := outboxdb.SetNotify(ctx, db, testTable, false, 5*time.Second); err != nil || !changed {
		t.Fatalf("dropping the insert trigger: changed %v, %v", changed, err)
	}
	notes := countNotifications(t, url)
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
	cfg.Notify, cfg.PollInterval = false, 20*time.Millisecond
	r := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "the relay to publish", r.Ready)
	c := newCollector(t, k, topic)
	const bound = 2 * time.Second

	// The writer open across polls.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := w.Append(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "open", EventType: "Late",
		Payload: []byte(`{}`), EventID: newUUID()}); err != nil {
		t.Fatal(err)
	}
	quietBefore := metricValue(t, r.metrics.quietPolls)
	time.Sleep(300 * time.Millisecond) // 15 poll intervals with the writer open, by design
	quietWhileOpen := metricValue(t, r.metrics.quietPolls) - quietBefore
	if quietWhileOpen < 3 {
		t.Fatalf("%.0f quiet polls while the writer was open: the relay fetched on (nearly) every poll", quietWhileOpen)
	}
	committed := time.Now()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitDistinct(t, 1, bound)
	late := time.Since(committed)

	// Sporadic writers.
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)
	const n = 60
	var worst time.Duration
	for i := range n {
		time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond)
		if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: fmt.Sprintf("a-%d", i%7), Seq: i}}); err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		for len(c.byEvent) < 2+i && time.Since(at) < bound {
			c.poll(t, 100*time.Millisecond)
		}
		if len(c.byEvent) < 2+i {
			var id int64
			var published *bool
			var seq int64
			var cursor string
			_ = pool.QueryRow(ctx, `SELECT id, outbox_published(id) FROM outbox ORDER BY id DESC LIMIT 1`).Scan(&id, &published)
			_ = pool.QueryRow(ctx, `SELECT pg_sequence_last_value('outbox_id_seq')`).Scan(&seq)
			_ = pool.QueryRow(ctx, `SELECT string_agg(format('%s floor %s next %s last %s', snap, snap_floor, next_snap, last_id), '; ') FROM outbox_relay_cursor`).Scan(&cursor)
			t.Fatalf("event %d (id %d, seq %d) not at the consumer %s after its commit: published per the database %v; quiet polls %.0f, published %.0f; cursor %s",
				i, id, seq, bound, published, metricValue(t, r.metrics.quietPolls), metricValue(t, r.metrics.published), cursor)
		}
		worst = max(worst, time.Since(at))
	}
	if n := notes.n.Load(); n != 0 {
		t.Errorf("%d notifications from a table without its insert trigger", n)
	}
	t.Logf("%s: the writer open across polls published %s after its commit (%.0f quiet polls while it was open); %d sporadic events, the slowest %s after its commit; %.0f quiet polls in all",
		tracking, late.Round(time.Millisecond), quietWhileOpen, n, worst.Round(time.Millisecond), metricValue(t, r.metrics.quietPolls))
}
