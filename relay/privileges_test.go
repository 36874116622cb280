package relay

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/roletest"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// TestLeastPrivilegeRelay runs, in both tracking modes, the whole path with each part as a
// PostgreSQL role holding only what outboxdb.GrantSQL grants it (docs/privileges.md): the owner
// migrates and creates the partitions, writers append with outbox.Append as the writer role, and
// a relay runs as the relay role with notifications on, while the topic refuses one aggregate's
// large events (parked under snapshot tracking, blocked with attempts under row tracking) until
// it is reconfigured, so they are retried and published in order. The idle relay is then woken by
// a notification (its poll interval is a minute), runs a replay the owner requested, and finally
// loses one grant at a time: each makes its round trips fail with PostgreSQL's permission error
// (in the relay's log) until the owner runs its grants again, after which it publishes again.
func TestLeastPrivilegeRelay(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	forEachTracking(t, func(t *testing.T, tracking Tracking) { testLeastPrivilegeRelay(t, k, tracking) })
}

// logTee is a relay's log: to the test log, and kept for the test to search.
type logTee struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logTee) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	return len(p), nil
}

func (l *logTee) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.buf.String(), s)
}

func (l *logTee) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Reset()
}

func testLeastPrivilegeRelay(t *testing.T, k *kafkatest.Cluster, tracking Tracking) {
	start := time.Now()
	ctx := context.Background()
	table := outboxdb.MustParseTable("shop.outbox")
	d := roletest.New(t, table, nil)
	d.Migrate(t, 1)
	d.CheckRoles(t)
	admin := d.Pool(t, roletest.Admin)

	topic, bigTopic := kafkatest.UniqueTopic("relay.privileges"), kafkatest.UniqueTopic("relay.privileges.big")
	k.CreateTopic(t, topic, 3)
	createSmallTopic(t, k, bigTopic, 1000)
	replayTopic := kafkatest.UniqueTopic("relay.privileges.replay")
	k.CreateTopic(t, replayTopic, 1)
	c := newCollector(t, k, topic, bigTopic)

	cfg := withTracking(testConfig(d.URL(d.Roles.Relay), k.Brokers, topic), tracking)
	cfg.Table = table
	cfg.TopicMap = map[string]string{"bulky": bigTopic}
	cfg.Notify, cfg.PollInterval = true, time.Minute // woken by notifications, or not within the test
	cfg.BatchSize = 50
	cfg.MaxAttempts = 1000
	cfg.RetryBackoff = Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}
	cfg.ReplayCheckInterval = 200 * time.Millisecond
	logs := &logTee{}
	r, err := New(cfg, WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay Run: %v", err)
		}
		if t.Failed() {
			t.Logf("the relay's log:\n%s", logs.buf.String())
		}
	})
	waitFor(t, 30*time.Second, "the relay's readiness", r.Ready)

	// Writers as the writer role: a load over 40 aggregates, and the "big" aggregate whose events
	// its topic refuses (max.message.bytes 1000).
	writer := d.Pool(t, d.Roles.Writer)
	w, err := outbox.New(table.String())
	if err != nil {
		t.Fatal(err)
	}
	big := 0
	writeBig := func(n, pad int) {
		for range n {
			big++
			p, _ := json.Marshal(seqEvent{Agg: "big", Seq: big, Pad: strings.Repeat("x", pad)})
			if err := seqtest.AppendEvents(ctx, writer, w, []outbox.Event{{AggregateType: "bulky", AggregateID: "big", EventType: "Seq", Payload: p}}); err != nil {
				t.Fatalf("outbox.Append as the writer: %v", err)
			}
		}
	}
	load := seqtest.StartLoad(ctx, writer, w, "order", 40, 4, 10, 5*time.Millisecond)
	writeBig(5, 1500)
	time.Sleep(time.Second)
	want := load.Stop(t)
	others := 0
	for _, n := range want {
		others += n
	}
	waitFor(t, time.Minute, "every other aggregate's events", func() bool {
		c.poll(t, 100*time.Millisecond)
		return len(c.byEvent) >= others
	})
	var held, failed int
	heldSQL := `SELECT count(*), count(*) FILTER (WHERE attempts > 0) FROM shop.outbox WHERE aggregate_id = 'big' AND sent_at IS NULL`
	if tracking == TrackSnapshot {
		heldSQL = `SELECT count(*), count(*) FILTER (WHERE attempts > 0) FROM shop.outbox_parked WHERE aggregate_id = 'big'`
	}
	waitFor(t, 30*time.Second, "the refused events to be held back with attempts", func() bool {
		return admin.QueryRow(ctx, heldSQL).Scan(&held, &failed) == nil && held == big && failed > 0
	})
	for _, rec := range c.recs {
		if rec.Key == "big" {
			t.Fatalf("a refused event was published: %v", rec.Headers)
		}
	}

	// The topic takes them now: retried (from <table>_parked under snapshot tracking), in order.
	k.SetTopicConfig(t, bigTopic, "max.message.bytes", "1000000")
	writeBig(3, 0)
	want["big"] = big
	c.waitDistinct(t, others+big, time.Minute)
	if dups := checkOrder(t, c.recs, want); dups != 0 {
		t.Logf("%d duplicates", dups)
	}
	pending := func() int {
		var n int
		if err := admin.QueryRow(ctx, `SELECT shop.outbox_pending()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pending() == 0 })
	t.Logf("%s: %d events of %d aggregates in order; the refused aggregate's %d held back (%d with attempts), then retried", tracking, others+big, len(want), held, failed)

	// Idle, the relay waits for a notification: its claim is recorded, and an event is published
	// long before the poll interval.
	waitFor(t, 10*time.Second, "the relay's claim", func() bool {
		var n int
		return admin.QueryRow(ctx, `SELECT count(*) FROM shop.outbox_relay_waiting WHERE until > now()`).Scan(&n) == nil && n == 1
	})
	time.Sleep(200 * time.Millisecond)
	appendOne := func(agg string) time.Time {
		t.Helper()
		want[agg]++
		if err := seqtest.Append(ctx, writer, w, "order", []seqEvent{{Agg: agg, Seq: want[agg]}}); err != nil {
			t.Fatalf("outbox.Append as the writer: %v", err)
		}
		return time.Now()
	}
	committed := appendOne("wake")
	c.waitDistinct(t, others+big+1, 10*time.Second)
	latency := time.Since(committed)
	if latency > 5*time.Second {
		t.Errorf("the idle relay took %s to publish (poll interval %s): not woken by the notification", latency, cfg.PollInterval)
	}
	t.Logf("an event appended while the relay waited was published %s after its commit (poll interval %s), %d claims",
		latency.Round(time.Millisecond), cfg.PollInterval, int(metricValue(t, r.metrics.claims)))

	// A replay the owner requests (kubectl outbox replay): run by the relay's role.
	{
		ownerConn, err := pgx.Connect(ctx, d.URL(d.Roles.Owner))
		if err != nil {
			t.Fatal(err)
		}
		defer ownerConn.Close(ctx)
		rep, plan, err := outboxdb.RequestReplay(ctx, ownerConn, table, outboxdb.ReplayRequest{
			From: outboxdb.Bound{ID: 1}, AggregateID: "big", Topic: replayTopic, Reason: "test", RequestedBy: "jane"})
		if err != nil {
			t.Fatalf("RequestReplay as the owner: %v", err)
		}
		copies := k.NewConsumer(t, replayTopic).ReadN(t, int(plan.Events), 30*time.Second)
		waitFor(t, 10*time.Second, "the replay to be done", func() bool {
			var state string
			return admin.QueryRow(ctx, `SELECT state FROM shop.outbox_replays WHERE id = $1`, rep.ID).Scan(&state) == nil && state == "done"
		})
		if len(copies) != big || int(plan.Events) != big {
			t.Errorf("replay: %d copies, plan %d, want %d", len(copies), plan.Events, big)
		}
	}

	// One grant taken away at a time: the relay's round trips fail with the permission error
	// until the owner runs its grants again; then the next event is published.
	relayRole := pgx.Identifier{d.Roles.Relay}.Sanitize()
	// The claim's sequence is written when the relay claims a wait anew: after a full batch (it
	// was busy, so it ended its claim), not after a single event (it keeps its claim).
	type revokeCase struct {
		revoke, denied string
		events         int
	}
	full := cfg.BatchSize + 1 // more than a fetch
	if tracking == TrackSnapshot {
		full = r.snapFetchSize() + 1
	}
	cases := []revokeCase{
		{`REVOKE UPDATE ON SEQUENCE shop.outbox_wake_until FROM ` + relayRole, "permission denied for sequence outbox_wake_until", full},
		{`REVOKE UPDATE (sent_at, attempts, error) ON shop.outbox FROM ` + relayRole, "permission denied for table outbox", 1},
	}
	if tracking == TrackSnapshot {
		cases[1] = revokeCase{`REVOKE UPDATE ON shop.outbox_relay_cursor FROM ` + relayRole, "permission denied for table outbox_relay_cursor", 1}
	}
	for _, cs := range cases {
		logs.reset()
		d.Exec(t, d.Roles.Owner, cs.revoke)
		before := len(c.byEvent)
		var evs []seqEvent
		for range cs.events {
			want["after-revoke"]++
			evs = append(evs, seqEvent{Agg: "after-revoke", Seq: want["after-revoke"]})
		}
		if err := seqtest.Append(ctx, writer, w, "order", evs); err != nil {
			t.Fatalf("outbox.Append as the writer: %v", err)
		}
		committed := time.Now()
		waitFor(t, 20*time.Second, "the relay's log to say "+cs.denied, func() bool { return logs.contains(cs.denied) })
		t.Logf("%s: the relay fails with %q", cs.revoke, cs.denied)
		d.GrantAsOwner(t)
		c.waitDistinct(t, before+cs.events, 30*time.Second)
		t.Logf("published %s after its commit, once the grants were run again", time.Since(committed).Round(time.Millisecond))
	}
	c.catchUp(t, k, topic, 30*time.Second)
	c.catchUp(t, k, bigTopic, 30*time.Second)
	if dups := checkOrder(t, c.recs, want); dups != 0 {
		t.Logf("%d duplicates (batches published again after a failed round trip)", dups)
	}
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pending() == 0 })
	t.Logf("%s: done in %s", tracking, time.Since(start).Round(time.Millisecond))
}
