package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
)

// replayConfig is testConfig with replays looked for every 50 ms.
func replayConfig(url string, brokers []string, topic string, tracking Tracking) Config {
	cfg := testConfig(url, brokers, topic)
	cfg.Tracking = tracking
	cfg.BatchSize = 100
	cfg.ReplayCheckInterval = 50 * time.Millisecond
	return cfg
}

// writeSeq writes n events over aggs aggregates (agg-000..), in transactions of perTx, and returns
// each aggregate's last sequence number.
func writeSeq(t testing.TB, pool *pgxpool.Pool, n, aggs, perTx int) map[string]int {
	t.Helper()
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	seq := map[string]int{}
	for done := 0; done < n; {
		evs := make([]seqEvent, 0, perTx)
		for ; len(evs) < perTx && done < n; done++ {
			a := fmt.Sprintf("agg-%03d", done%aggs)
			seq[a]++
			evs = append(evs, seqEvent{Agg: a, Seq: seq[a]})
		}
		if err := appendSeq(context.Background(), pool, w, "order", evs); err != nil {
			t.Fatal(err)
		}
	}
	return seq
}

// rangeOf returns the event ids of the positions from..to and, per aggregate, the sequence
// numbers before the first and of the last of them (CheckOrder's after and want).
func rangeOf(t testing.TB, pool *pgxpool.Pool, from, to int64, agg string) (ids map[string]bool, after, want map[string]int) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id::text, payload FROM outbox
		WHERE id BETWEEN $1 AND $2 AND ($3 = '' OR aggregate_id = $3) ORDER BY id`, from, to, agg)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ids, after, want = map[string]bool{}, map[string]int{}, map[string]int{}
	for rows.Next() {
		var id string
		var payload []byte
		if err := rows.Scan(&id, &payload); err != nil {
			t.Fatal(err)
		}
		var e seqEvent
		if err := json.Unmarshal(payload, &e); err != nil {
			t.Fatal(err)
		}
		ids[id] = true
		if _, ok := after[e.Agg]; !ok {
			after[e.Agg] = e.Seq - 1
		}
		want[e.Agg] = e.Seq
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids, after, want
}

func positionOf(t testing.TB, pool *pgxpool.Pool, nth int) int64 {
	t.Helper()
	var id int64
	if err := pool.QueryRow(context.Background(), `SELECT id FROM outbox ORDER BY id OFFSET $1 LIMIT 1`, nth).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func waitReplay(t testing.TB, pool *pgxpool.Pool, id int64, want outboxdb.ReplayState, timeout time.Duration) outboxdb.Replay {
	t.Helper()
	var rp outboxdb.Replay
	waitFor(t, timeout, fmt.Sprintf("replay %d %s", id, want), func() bool {
		var err error
		if rp, err = outboxdb.GetReplay(context.Background(), pool, testTable, id); err != nil {
			t.Fatal(err)
		}
		if rp.State == outboxdb.ReplayFailed && want != outboxdb.ReplayFailed {
			t.Fatalf("replay %d failed: %s", id, rp.Error)
		}
		return rp.State == want
	})
	return rp
}

// replayed returns the records of replay id among recs.
func replayed(recs []kafkatest.Record, id int64) []kafkatest.Record {
	var out []kafkatest.Record
	for _, r := range recs {
		if r.Headers[HeaderReplay] == strconv.FormatInt(id, 10) {
			out = append(out, r)
		}
	}
	return out
}

// checkReplayed checks, as an independent consumer sees them, the copies of a replay: exactly the
// events of ids, each with its original event_id, each aggregate's in order; it returns the
// duplicates.
func checkReplayed(t testing.TB, recs []kafkatest.Record, ids map[string]bool, after, want map[string]int) int {
	t.Helper()
	got := map[string]bool{}
	for _, r := range recs {
		if !ids[r.Headers[HeaderEventID]] {
			t.Fatalf("replayed event %s (%s) is not in the range", r.Headers[HeaderEventID], r.Value)
		}
		got[r.Headers[HeaderEventID]] = true
	}
	if len(got) != len(ids) {
		t.Fatalf("replayed %d distinct events (%d records), the range holds %d", len(got), len(recs), len(ids))
	}
	return checkOrderFrom(t, recs, want, after)
}

// TestReplay: 3,000 events of 40 aggregates published; a replay of a middle range to another
// topic publishes exactly the events of the range again, with their event ids, each aggregate's
// in order, once; a replay of one aggregate to its own topic likewise. The dry run counts them
// and writes nothing, in both tracking modes.
func TestReplay(t *testing.T) {
	forEachTracking(t, testReplay)
}

func testReplay(t *testing.T, tracking Tracking) {
	url, pool, k, topic := newTopicDB(t, "relay.replay", 3)
	other := kafkatest.UniqueTopic("relay.replay.to")
	k.CreateTopic(t, other, 4)
	ctx := context.Background()
	rr := startRelay(t, replayConfig(url, k.Brokers, topic, tracking), "relay")
	waitFor(t, 30*time.Second, "relay readiness", rr.Ready)
	const n = 3000
	writeSeq(t, pool, n, 40, 250)
	c := newCollector(t, k, topic, other)
	c.waitDistinct(t, n, time.Minute)
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })

	from, to := positionOf(t, pool, 700), positionOf(t, pool, 2199)
	ids, after, want := rangeOf(t, pool, from, to, "")
	req := outboxdb.ReplayRequest{From: outboxdb.Bound{ID: from}, To: outboxdb.Bound{ID: to}, Topic: other, Reason: "test"}
	plan, err := outboxdb.PlanReplay(ctx, pool, testTable, req)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Events != int64(len(ids)) || plan.ByAggregateType["order"] != plan.Events {
		t.Fatalf("dry run: %+v, want %d events of type order", plan, len(ids))
	}
	if rs, err := outboxdb.ListReplays(ctx, pool, testTable, false, 0); err != nil || len(rs) != 0 {
		t.Fatalf("after the dry run: %v, %v; want nothing recorded", rs, err)
	}
	rp, _, err := outboxdb.RequestReplay(ctx, pool, testTable, req)
	if err != nil {
		t.Fatal(err)
	}
	done := waitReplay(t, pool, rp.ID, outboxdb.ReplayDone, time.Minute)
	if done.Replayed != int64(len(ids)) || done.LastID != to || done.Percent() != 100 {
		t.Fatalf("replay ended %+v, want %d replayed up to %d", done, len(ids), to)
	}
	c.catchUp(t, k, other, 30*time.Second)
	copies := replayed(c.recs, rp.ID)
	if dups := checkReplayed(t, copies, ids, after, want); dups != 0 {
		t.Errorf("%d duplicates without any crash", dups)
	}
	for _, r := range copies {
		if r.Topic != other {
			t.Fatalf("a copy went to %s, want %s", r.Topic, other)
		}
	}

	// One aggregate, to its own topic, from a time.
	var since time.Time
	if err := pool.QueryRow(ctx, `SELECT created_at FROM outbox WHERE id = $1`, from).Scan(&since); err != nil {
		t.Fatal(err)
	}
	first, err := outboxdb.ParseBound(since.Format(time.RFC3339Nano), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rp2, _, err := outboxdb.RequestReplay(ctx, pool, testTable, outboxdb.ReplayRequest{From: first, AggregateID: "agg-007"})
	if err != nil {
		t.Fatal(err)
	}
	done2 := waitReplay(t, pool, rp2.ID, outboxdb.ReplayDone, time.Minute)
	ids2, after2, want2 := rangeOf(t, pool, done2.FromID, done2.ToID, "agg-007")
	c.catchUp(t, k, topic, 30*time.Second)
	copies2 := replayed(c.recs, rp2.ID)
	if dups := checkReplayed(t, copies2, ids2, after2, want2); dups != 0 {
		t.Errorf("%d duplicates without any crash", dups)
	}
	for _, r := range copies2 {
		if r.Topic != topic {
			t.Fatalf("a copy went to %s, want %s", r.Topic, topic)
		}
	}
	if got := metricValue(t, rr.metrics.replayed); got != float64(len(ids)+len(ids2)) {
		t.Errorf("outbox_replay_events_total %v, want %d", got, len(ids)+len(ids2))
	}
	// The copies are not the normal stream's: it published every event once.
	normal := 0
	for _, r := range c.recs {
		if r.Topic == topic && r.Headers[HeaderReplay] == "" {
			normal++
		}
	}
	if normal != n {
		t.Errorf("the normal stream published %d records, want %d", normal, n)
	}
}

// TestReplayThrottle: a replay at 300 events/s publishes at that pace, as the consumer sees it
// (the records' timestamps), not faster.
func TestReplayThrottle(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.replay.rate", 3)
	ctx := context.Background()
	rr := startRelay(t, replayConfig(url, k.Brokers, topic, TrackRow), "relay")
	waitFor(t, 30*time.Second, "relay readiness", rr.Ready)
	const n, rate = 1500, 300
	writeSeq(t, pool, n, 20, 500)
	waitFor(t, time.Minute, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	rp, _, err := outboxdb.RequestReplay(ctx, pool, testTable, outboxdb.ReplayRequest{From: outboxdb.Bound{ID: 1}, Rate: rate})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitReplay(t, pool, rp.ID, outboxdb.ReplayDone, time.Minute)
	wall := time.Since(start)
	c := newCollector(t, k, topic)
	c.catchUp(t, k, topic, 30*time.Second)
	copies := replayed(c.recs, rp.ID)
	if len(copies) != n {
		t.Fatalf("%d copies, want %d", len(copies), n)
	}
	sort.Slice(copies, func(i, j int) bool { return copies[i].Timestamp.Before(copies[j].Timestamp) })
	span := copies[len(copies)-1].Timestamp.Sub(copies[0].Timestamp)
	got := float64(n-1) / span.Seconds()
	t.Logf("%d events at --rate %d: %.0f events/s between the first and the last record's timestamps (%s), %s from request to done",
		n, rate, got, span.Round(time.Millisecond), wall.Round(time.Millisecond))
	// A batch is a tenth of a second's worth: the first goes at once, so the pace over n events
	// is at most rate*n/(n-batch); the timestamps have millisecond precision.
	if got > rate*1.1 || got < rate*0.7 {
		t.Errorf("replayed at %.0f events/s, want about %d", got, rate)
	}
}

// TestReplayResumes: a relay stopped mid-replay (SIGTERM) commits its batch and the next relay
// continues after it: no event lost, none twice. A replay whose session is killed mid-batch
// (the process dies) is continued from its last committed batch: no event lost, at most that
// batch twice (the duplicates are counted and logged). In both tracking modes.
func TestReplayResumes(t *testing.T) {
	forEachTracking(t, testReplayResumes)
}

func testReplayResumes(t *testing.T, tracking Tracking) {
	url, pool, k, topic := newTopicDB(t, "relay.replay.resume", 3)
	ctx := context.Background()
	cfg := replayConfig(url, k.Brokers, topic, tracking)
	first := startRelay(t, cfg, "first")
	waitFor(t, 30*time.Second, "relay readiness", first.Ready)
	const n, rate = 3000, 1000 // batches of 100, 10 a second
	writeSeq(t, pool, n, 30, 500)
	waitFor(t, time.Minute, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	ids, after, want := rangeOf(t, pool, 1, 1<<62, "")
	rp, _, err := outboxdb.RequestReplay(ctx, pool, testTable, outboxdb.ReplayRequest{From: outboxdb.Bound{ID: 1}, Rate: rate})
	if err != nil {
		t.Fatal(err)
	}
	progress := func() outboxdb.Replay {
		r, err := outboxdb.GetReplay(ctx, pool, testTable, rp.ID)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	waitFor(t, 30*time.Second, "a third of the replay", func() bool { return progress().Replayed >= n/3 })
	first.stop(t)
	stopped := progress()
	if stopped.State != outboxdb.ReplayRunning || stopped.Replayed >= n {
		t.Fatalf("after the stop: %+v", stopped)
	}
	t.Logf("stopped at %d of %d", stopped.Replayed, n)

	second := startRelay(t, cfg, "second")
	waitFor(t, 30*time.Second, "two thirds of the replay", func() bool { return progress().Replayed >= 2*n/3 })
	// The process dies: its replay session ends mid-batch.
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name LIKE 'outbox-relay % (replay)'`); err != nil {
		t.Fatal(err)
	}
	killedAt := progress().Replayed
	done := waitReplay(t, pool, rp.ID, outboxdb.ReplayDone, time.Minute)
	t.Logf("session killed at about %d of %d; done with %d replayed", killedAt, n, done.Replayed)
	c := newCollector(t, k, topic)
	c.catchUp(t, k, topic, 30*time.Second)
	copies := replayed(c.recs, rp.ID)
	dups := checkReplayed(t, copies, ids, after, want)
	t.Logf("%d copies of %d events: %d duplicates", len(copies), n, dups)
	if dups > cfg.BatchSize {
		t.Errorf("%d duplicates, want at most one batch (%d): only the batch not committed is published again", dups, cfg.BatchSize)
	}
	// The batch published again is counted once: replayed counts positions committed.
	if done.Replayed != n {
		t.Errorf("the replay counts %d published, want %d", done.Replayed, n)
	}
	second.stop(t)
}

// TestReplayCancel: a cancelled replay stops after its batch in flight.
func TestReplayCancel(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.replay.cancel", 1)
	ctx := context.Background()
	rr := startRelay(t, replayConfig(url, k.Brokers, topic, TrackRow), "relay")
	waitFor(t, 30*time.Second, "relay readiness", rr.Ready)
	writeSeq(t, pool, 1000, 10, 500)
	waitFor(t, time.Minute, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	rp, _, err := outboxdb.RequestReplay(ctx, pool, testTable, outboxdb.ReplayRequest{From: outboxdb.Bound{ID: 1}, Rate: 200})
	if err != nil {
		t.Fatal(err)
	}
	waitReplay(t, pool, rp.ID, outboxdb.ReplayRunning, 30*time.Second)
	time.Sleep(500 * time.Millisecond)
	if err := outboxdb.CancelReplay(ctx, pool, testTable, rp.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	got, err := outboxdb.GetReplay(ctx, pool, testTable, rp.ID)
	if err != nil {
		t.Fatal(err)
	}
	c := newCollector(t, k, topic)
	c.catchUp(t, k, topic, 30*time.Second)
	copies := replayed(c.recs, rp.ID)
	if got.State != outboxdb.ReplayCancelled || len(copies) >= 1000 || int64(len(copies)) > got.Replayed+int64(replayBatch(100, 200)) {
		t.Fatalf("cancelled replay %+v; %d copies published", got, len(copies))
	}
	t.Logf("cancelled after %d of 1000 events (%d copies)", got.Replayed, len(copies))
}

// TestReplayRate measures an unthrottled replay of OUTBOX_REPLAY_RATE_EVENTS events (default
// 20,000) with the default batch size, as the consumer sees it, in both tracking modes.
func TestReplayRate(t *testing.T) {
	forEachTracking(t, testReplayRate)
}

func testReplayRate(t *testing.T, tracking Tracking) {
	n := 20_000
	if s := os.Getenv("OUTBOX_REPLAY_RATE_EVENTS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			t.Fatal(err)
		}
	}
	url, pool, k, topic := newTopicDB(t, "relay.replay.speed", 6)
	ctx := context.Background()
	cfg := replayConfig(url, k.Brokers, topic, tracking)
	cfg.BatchSize = DefaultBatchSize
	rr := startRelay(t, cfg, "relay")
	waitFor(t, 30*time.Second, "relay readiness", rr.Ready)
	writeSeq(t, pool, n, 1000, 5000)
	waitFor(t, 5*time.Minute, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	rp, _, err := outboxdb.RequestReplay(ctx, pool, testTable, outboxdb.ReplayRequest{From: outboxdb.Bound{ID: 1}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done := waitReplay(t, pool, rp.ID, outboxdb.ReplayDone, 10*time.Minute)
	wall := time.Since(start)
	c := newCollector(t, k, topic)
	c.catchUp(t, k, topic, 2*time.Minute)
	copies := replayed(c.recs, rp.ID)
	if len(copies) != n || done.Replayed != int64(n) {
		t.Fatalf("%d copies, %d replayed; want %d", len(copies), done.Replayed, n)
	}
	sort.Slice(copies, func(i, j int) bool { return copies[i].Timestamp.Before(copies[j].Timestamp) })
	span := copies[len(copies)-1].Timestamp.Sub(copies[0].Timestamp)
	t.Logf("REPLAY RATE: %d events (batch %d, tracking %s): %.0f events/s by the records' timestamps (%s), %.0f events/s from request to done (%s)",
		n, cfg.BatchSize, tracking, float64(n-1)/span.Seconds(), span.Round(time.Millisecond), float64(n)/wall.Seconds(), wall.Round(time.Millisecond))
}

// TestReplayAlongsideNewEvents: while a replay runs, the application writes new events of the
// same aggregates; the normal stream publishes them in order, each once, and the copies arrive in
// order beside them, in both tracking modes.
func TestReplayAlongsideNewEvents(t *testing.T) {
	forEachTracking(t, testReplayAlongsideNewEvents)
}

func testReplayAlongsideNewEvents(t *testing.T, tracking Tracking) {
	url, pool, k, topic := newTopicDB(t, "relay.replay.beside", 3)
	ctx := context.Background()
	rr := startRelay(t, replayConfig(url, k.Brokers, topic, tracking), "relay")
	waitFor(t, 30*time.Second, "relay readiness", rr.Ready)
	const n, aggs = 2000, 20
	writeSeq(t, pool, n, aggs, 200)
	waitFor(t, time.Minute, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	ids, after, want := rangeOf(t, pool, 1, 1<<62, "")
	rp, _, err := outboxdb.RequestReplay(ctx, pool, testTable, outboxdb.ReplayRequest{From: outboxdb.Bound{ID: 1}, Rate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	waitReplay(t, pool, rp.ID, outboxdb.ReplayRunning, 30*time.Second)
	// New events continue each aggregate's sequence, in transactions of 50, while the replay runs.
	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	final := map[string]int{}
	for a, s := range want {
		final[a] = s
	}
	for done := 0; done < n; {
		evs := make([]seqEvent, 0, 50)
		for ; len(evs) < 50 && done < n; done++ {
			a := fmt.Sprintf("agg-%03d", done%aggs)
			final[a]++
			evs = append(evs, seqEvent{Agg: a, Seq: final[a]})
		}
		if err := appendSeq(ctx, pool, w, "order", evs); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, _ := outboxdb.GetReplay(ctx, pool, testTable, rp.ID); got.State != outboxdb.ReplayRunning {
		t.Logf("the replay ended (%s) before the new events were all written", got.State)
	}
	waitReplay(t, pool, rp.ID, outboxdb.ReplayDone, time.Minute)
	waitFor(t, time.Minute, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	c := newCollector(t, k, topic)
	c.catchUp(t, k, topic, 30*time.Second)
	var normal []kafkatest.Record
	for _, r := range c.recs {
		if r.Headers[HeaderReplay] == "" {
			normal = append(normal, r)
		}
	}
	if dups := checkOrder(t, normal, final); dups != 0 {
		t.Errorf("the normal stream published %d duplicates", dups)
	}
	if dups := checkReplayed(t, replayed(c.recs, rp.ID), ids, after, want); dups != 0 {
		t.Errorf("%d duplicate copies without any crash", dups)
	}
}

// TestReplayOneRunner: two relays (shards 0 and 1 of 2) look for replays; one runs it, the other
// never opens a replay session while it runs (Open says no while the replay lock is held).
func TestReplayOneRunner(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.replay.one", 3)
	ctx := context.Background()
	relays := make([]*running, 2)
	for i := range relays {
		cfg := replayConfig(url, k.Brokers, topic, TrackRow)
		cfg.ShardCount, cfg.ShardIndex = 2, i
		relays[i] = startRelay(t, cfg, fmt.Sprintf("shard %d", i))
	}
	for _, r := range relays {
		waitFor(t, 30*time.Second, "relay readiness", r.Ready)
	}
	const n = 1500
	writeSeq(t, pool, n, 20, 500)
	waitFor(t, time.Minute, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	ids, after, want := rangeOf(t, pool, 1, 1<<62, "")
	rp, _, err := outboxdb.RequestReplay(ctx, pool, testTable, outboxdb.ReplayRequest{From: outboxdb.Bound{ID: 1}, Rate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	waitReplay(t, pool, rp.ID, outboxdb.ReplayRunning, 30*time.Second)
	open := relays[0].replaySQL.Open
	// A replay session is opened only where Open said to try: both relays may have been told so
	// before either held the lock (the loser's session ends once its try fails, possibly just
	// after the winner claimed the replay), but none is opened while the replay runs: no replay
	// session began after the replay was claimed (started_at).
	var sessions, late, maxSessions, maxLate int
	var mayTry bool
	for {
		got, err := outboxdb.GetReplay(ctx, pool, testTable, rp.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == outboxdb.ReplayDone {
			break
		}
		if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE backend_start > (SELECT started_at FROM `+testTable.Derived("replays")+` WHERE id = $1))
FROM pg_stat_activity WHERE application_name LIKE 'outbox-relay % (replay)'`, rp.ID).Scan(&sessions, &late); err != nil {
			t.Fatal(err)
		}
		maxSessions, maxLate = max(maxSessions, sessions), max(maxLate, late)
		if err := pool.QueryRow(ctx, open, testTable.LockKey()).Scan(&mayTry); err != nil {
			t.Fatal(err)
		}
		if mayTry && got.State == outboxdb.ReplayRunning && sessions == 1 {
			t.Errorf("Open says to try the replay lock while a relay holds it")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if maxLate != 0 || maxSessions == 0 {
		t.Errorf("%d replay sessions opened while the replay ran (at most %d at once), want none besides the runner's", maxLate, maxSessions)
	}
	a, b := metricValue(t, relays[0].metrics.replayed), metricValue(t, relays[1].metrics.replayed)
	if a+b != n || (a != 0 && b != 0) {
		t.Errorf("the relays replayed %v and %v events, want %d by one of them", a, b, n)
	}
	c := newCollector(t, k, topic)
	c.catchUp(t, k, topic, 30*time.Second)
	if dups := checkReplayed(t, replayed(c.recs, rp.ID), ids, after, want); dups != 0 {
		t.Errorf("%d duplicate copies", dups)
	}
	if err := pool.QueryRow(ctx, open, testTable.LockKey()).Scan(&mayTry); err != nil || mayTry {
		t.Errorf("no open replay: Open %v, %v", mayTry, err)
	}
}
