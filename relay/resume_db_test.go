package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestResumeLateRows: under row tracking a fetch reads past the floors of the fetches before it
// (row_resume.go), so the rows that commit below a floor must be found by the watch. Two kinds, each
// open while the relays' floors pass them (checked before they commit, so the test cannot pass
// by a read from the oldest unsent row): a transaction that wrote its event and stayed open (in
// progress at the watch), and one that drew its id from the sequence, let the floors pass, and
// only then inserted and so took its transaction id (past the watch's xmax). Both reach an
// independent consumer within two seconds of their commit, before the next read from the oldest
// unsent row (every 30 s) could have found them, and their aggregates' later events follow them.
func TestResumeLateRows(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	for _, shards := range []int{1, 4} {
		t.Run(fmt.Sprintf("%d shards", shards), func(t *testing.T) { testResumeLateRows(t, k, shards) })
	}
}

func testResumeLateRows(t *testing.T, k *kafkatest.Cluster, shards int) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	topic := kafkatest.UniqueTopic("relay.resume")
	k.CreateTopic(t, topic, 6)
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	relays := make([]*running, shards)
	for i := range shards {
		cfg := testConfig(url, k.Brokers, topic)
		cfg.Notify, cfg.PollInterval = false, 10*time.Millisecond
		if shards > 1 {
			cfg.ShardCount, cfg.ShardIndex = shards, i
		}
		relays[i] = startRelay(t, cfg, fmt.Sprintf("shard %d", i))
	}
	for _, r := range relays {
		waitFor(t, 30*time.Second, "relay readiness", r.Ready)
	}
	c := newCollector(t, k, topic)

	// Open: an event written, the transaction left open.
	open, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	if _, err := w.Append(ctx, open, seqOutboxEvent("order", "late-open", 1)); err != nil {
		t.Fatal(err)
	}
	var openID int64
	if err := open.QueryRow(ctx, `SELECT currval('outbox_id_seq')`).Scan(&openID); err != nil {
		t.Fatal(err)
	}
	// Drawn: an id from the sequence, no transaction id yet.
	drawn, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer drawn.Rollback(ctx)
	var drawnID int64
	if err := drawn.QueryRow(ctx, `SELECT nextval('outbox_id_seq')`).Scan(&drawnID); err != nil {
		t.Fatal(err)
	}
	var xid *string
	if err := drawn.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil || xid != nil {
		t.Fatalf("the drawing transaction holds a transaction id (%v, %v): the case is not the one meant", xid, err)
	}

	// Later events of other aggregates, published while both are open.
	want := map[string]int{}
	for round := range 5 {
		var evs []seqEvent
		for a := range 40 {
			agg := fmt.Sprintf("agg-%d", a)
			want[agg]++
			evs = append(evs, seqEvent{Agg: agg, Seq: want[agg]})
		}
		if err := appendSeq(ctx, pool, w, "order", evs); err != nil {
			t.Fatal(err)
		}
		c.waitDistinct(t, 40*(round+1), 30*time.Second)
	}
	// Every relay's position has passed both ids.
	waitFor(t, 10*time.Second, "every relay's floor past the open rows", func() bool {
		for _, r := range relays {
			if r.mode.(*rowMode).floor.Load() <= max(openID, drawnID) {
				return false
			}
		}
		return true
	})
	for i, r := range relays {
		t.Logf("shard %d: floor %d, past the open event %d and the drawn id %d", i, r.mode.(*rowMode).floor.Load(), openID, drawnID)
	}

	committed := time.Now()
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	p, _ := json.Marshal(seqEvent{Agg: "late-drawn", Seq: 1})
	if _, err := drawn.Exec(ctx, `INSERT INTO outbox (id, event_id, aggregate_type, aggregate_id, event_type, payload)
VALUES ($1, gen_random_uuid(), 'order', 'late-drawn', 'Seq', $2)`, drawnID, p); err != nil {
		t.Fatal(err)
	}
	if err := drawn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want["late-open"], want["late-drawn"] = 1, 1
	deadline := time.Now().Add(2 * time.Second)
	for len(c.byEvent) < 202 && time.Now().Before(deadline) {
		c.poll(t, 100*time.Millisecond)
	}
	if len(c.byEvent) < 202 {
		t.Fatalf("%d of 202 events at the consumer 2s after the late rows committed (pending per the database: %d)", len(c.byEvent), pendingRows(t, pool))
	}
	t.Logf("both late rows at the consumer %s after their commit", time.Since(committed).Round(time.Millisecond))
	// Their aggregates go on, in order.
	if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: "late-open", Seq: 2}, {Agg: "late-drawn", Seq: 2}}); err != nil {
		t.Fatal(err)
	}
	want["late-open"], want["late-drawn"] = 2, 2
	c.waitDistinct(t, 204, 30*time.Second)
	if dups := checkOrder(t, c.recs, want); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	// The relay marks a batch in the round trip after its acknowledgement: the consumer may see
	// the last events a moment before the database does.
	waitFor(t, 10*time.Second, "no row pending", func() bool { return pendingRows(t, pool) == 0 })
}

// TestBlockedTailCost: a poison aggregate under policy block keeps its later events pending, and
// a fetch that read from the oldest unsent row passed them all on every poll (#12: 100,000 of
// them made a fetch cost 15 ms). With the fetch resuming past its floors, what the relay reads
// no longer grows with the tail: PostgreSQL's own count of index entries read
// (pg_stat_user_indexes), over six seconds of polling every 10 ms with other events flowing,
// stays below ten reads of the tail, where one poll from the oldest unsent row (EXPLAIN of the
// relay's own first fetch) reads the whole tail.
func TestBlockedTailCost(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	for _, shards := range []int{1, 4} {
		t.Run(fmt.Sprintf("%d shards", shards), func(t *testing.T) { testBlockedTailCost(t, k, shards) })
	}
}

func testBlockedTailCost(t *testing.T, k *kafkatest.Cluster, shards int) {
	const tail = 20_000
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	topic := kafkatest.UniqueTopic("relay.tail")
	k.CreateTopic(t, topic, 3)
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	// The poison event (its payload over --max-payload-bytes), then its aggregate's tail.
	poison := seqOutboxEvent("order", "p-tail", 1)
	poison.Payload = []byte(`{"agg":"p-tail","seq":1,"pad":"` + strings.Repeat("x", 2000) + `"}`)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.Append(ctx, tx, poison); return err }); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'p-tail', 'Seq', jsonb_build_object('agg', 'p-tail', 'seq', g) FROM generate_series(2, $1::int + 1) AS g`, tail); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	// What one read from the oldest unsent row costs, before any relay runs: the relay's first
	// fetch with the aggregate blocked.
	sql, args, err := FetchSQL(testTable, shards, ShardOf(int(bucketOfAggregate(t, pool, "p-tail")), shards), 1000, nil, []string{"p-tail"})
	if err != nil {
		t.Fatal(err)
	}
	full := indexReads(ctx, t, pool, func() {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		if err := TuneFetchSession(ctx, conn); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
		_ = conn.Close(ctx) // a session reports its statistics when it ends
	})
	if full < tail {
		t.Fatalf("a read from the oldest unsent row read %d index entries, fewer than the tail's %d: the test proves nothing", full, tail)
	}

	relays := make([]*running, shards)
	for i := range shards {
		cfg := testConfig(url, k.Brokers, topic)
		cfg.Notify, cfg.PollInterval = false, 10*time.Millisecond
		cfg.MaxPayloadBytes = 1000
		cfg.PoisonPolicy = PoisonBlock
		cfg.RetryBackoff = Backoff{Min: 50 * time.Millisecond, Max: 5 * time.Minute} // no retry of the poison event in the window
		cfg.StatsInterval = time.Minute                                              // the backlog statement reads the tail too
		if shards > 1 {
			cfg.ShardCount, cfg.ShardIndex = shards, i
		}
		relays[i] = startRelay(t, cfg, fmt.Sprintf("shard %d", i))
	}
	waitFor(t, 30*time.Second, "the poison event recorded", func() bool {
		var attempts int
		_ = pool.QueryRow(ctx, `SELECT attempts FROM outbox WHERE aggregate_id = 'p-tail' ORDER BY id LIMIT 1`).Scan(&attempts)
		return attempts >= 1
	})
	c := newCollector(t, k, topic)
	// Six seconds of polling with other events flowing.
	want := map[string]int{}
	const window = 6 * time.Second
	read := indexReads(ctx, t, pool, func() {
		end := time.Now().Add(window)
		for i := 0; time.Now().Before(end); i++ {
			agg := fmt.Sprintf("good-%d", i%10)
			want[agg]++
			if err := appendSeq(ctx, pool, w, "order", []seqEvent{{Agg: agg, Seq: want[agg]}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	n := 0
	for _, v := range want {
		n += v
	}
	c.waitDistinct(t, n, 30*time.Second)
	polls := int64(window / (10 * time.Millisecond))
	t.Logf("%d shards, a blocked tail of %d: one read from the oldest unsent row reads %d index entries; the relays read %d in %s "+
		"(about %d polls each, %d events published meanwhile)", shards, tail, full, read, window, polls, n)
	if read > 10*full {
		t.Errorf("the relays read %d index entries in %s, more than ten reads of the blocked tail (%d each): their fetches pass it", read, window, full)
	}
	if dups := checkOrder(t, c.recs, want); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	for _, rec := range c.recs {
		if rec.Key == "p-tail" {
			t.Fatalf("an event of the blocked aggregate was published: %s", rec.Value)
		}
	}
}

// indexReads returns how many index entries the outbox's indexes were read for while f ran, by
// PostgreSQL's statistics (flushed by each backend at most once a second: it waits for them).
func indexReads(ctx context.Context, t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, f func()) int64 {
	t.Helper()
	total := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(sum(s.idx_tup_read), 0)::int8 FROM pg_stat_user_indexes s
JOIN pg_inherits h ON h.inhrelid = s.relid WHERE h.inhparent = 'public.outbox'::regclass`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	settle := func() { time.Sleep(1500 * time.Millisecond) }
	settle()
	before := total()
	f()
	settle()
	return total() - before
}

func bucketOfAggregate(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, agg string) int16 {
	t.Helper()
	var b int16
	if err := pool.QueryRow(context.Background(), `SELECT `+outboxdb.BucketOf("$1::text"), agg).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

// seqOutboxEvent is the event of sequence number seq of aggregate agg, as appendSeq writes it.
func seqOutboxEvent(aggType, agg string, seq int) outbox.Event {
	p, _ := json.Marshal(seqEvent{Agg: agg, Seq: seq})
	return outbox.Event{AggregateType: aggType, AggregateID: agg, EventType: "Seq", Payload: p}
}

// TestRowIDsNotFromTheSequence: rows whose ids were not drawn from the id sequence (an
// application that sets them, the sequence never used), which the relays do not expect, are
// still published under row tracking: a read from the oldest unsent row reads every bucket,
// whatever the sequence's value says (withPosition). Checked by an independent consumer, one
// shard and two.
func TestRowIDsNotFromTheSequence(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	for _, shards := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d shards", shards), func(t *testing.T) {
			url := pgtest.NewDatabase(t)
			pool := newOutboxDB(t, url)
			topic := kafkatest.UniqueTopic("relay.explicitids")
			k.CreateTopic(t, topic, 3)
			if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
SELECT 1000 + g, 'order', 'agg-' || g, 'Set', '{}' FROM generate_series(1, 20) AS g`); err != nil {
				t.Fatal(err)
			}
			var seq *int64
			if err := pool.QueryRow(context.Background(), `SELECT pg_sequence_last_value('outbox_id_seq')`).Scan(&seq); err != nil || seq != nil {
				t.Fatalf("the id sequence was used (%v, %v): the test proves nothing", seq, err)
			}
			c := newCollector(t, k, topic)
			for i := range shards {
				cfg := testConfig(url, k.Brokers, topic)
				cfg.Notify, cfg.PollInterval = false, 10*time.Millisecond
				if shards > 1 {
					cfg.ShardCount, cfg.ShardIndex = shards, i
				}
				startRelay(t, cfg, fmt.Sprintf("shard %d", i))
			}
			c.waitDistinct(t, 20, 30*time.Second)
		})
	}
}
