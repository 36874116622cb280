package relay

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestPublish is the basic contract on a real PostgreSQL and Apache Kafka: every event arrives
// once, keyed by aggregate id, with the standard and the row's own headers, in order per
// aggregate; every row is marked sent; metrics and probes answer.
func TestPublish(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := newOutboxDB(t, url)
	t0 := time.Now()
	k := kafkatest.Start(t, kafkatest.Apache)
	t.Logf("broker up in %s", time.Since(t0))
	topic := kafkatest.UniqueTopic("relay.publish")
	k.CreateTopic(t, topic, 6)

	cfg := testConfig(url, k.Brokers, "")
	cfg.TopicMap = map[string]string{"order": topic}
	r := startRelay(t, cfg, "relay")
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(srv.Close)
	waitFor(t, 30*time.Second, "readiness", r.Ready)

	w, err := outbox.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const aggs, perAgg = 50, 20
	want := map[string]int{}
	for s := 1; s <= perAgg; s++ {
		var evs []seqEvent
		for a := range aggs {
			agg := fmt.Sprintf("order-%d", a)
			evs = append(evs, seqEvent{Agg: agg, Seq: s})
			want[agg] = s
		}
		if err := appendSeq(ctx, pool, w, "order", evs); err != nil {
			t.Fatal(err)
		}
	}
	c := newCollector(t, k, topic)
	t1 := time.Now()
	c.waitDistinct(t, aggs*perAgg, 60*time.Second)
	t.Logf("consumed in %s", time.Since(t1))
	if dups := checkOrder(t, c.recs, want); dups != 0 {
		t.Errorf("%d duplicates in normal operation", dups)
	}
	waitFor(t, 10*time.Second, "every row marked sent", func() bool { return pendingRows(t, pool) == 0 })

	// Headers: the four standard ones, the row's own, event_id matching the row.
	rec := c.recs[0]
	for _, h := range []string{HeaderEventID, HeaderEventType, HeaderAggregateType, HeaderAggregateID, "traceparent"} {
		if rec.Headers[h] == "" {
			t.Errorf("record lacks header %s: %v", h, rec.Headers)
		}
	}
	if rec.Headers[HeaderEventType] != "Seq" || rec.Headers[HeaderAggregateType] != "order" {
		t.Errorf("headers %v", rec.Headers)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE event_id = $1::uuid AND aggregate_id = $2 AND sent_at IS NOT NULL`,
		rec.Headers[HeaderEventID], rec.Key).Scan(&n); err != nil || n != 1 {
		t.Errorf("event_id header %s does not name a sent row of %s: %d, %v", rec.Headers[HeaderEventID], rec.Key, n, err)
	}

	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	waitFor(t, 10*time.Second, "metrics", func() bool {
		body := scrape(t, srv.URL)
		return strings.Contains(body, `outbox_published_total{shard="0",table="public.outbox"} 1000`) &&
			strings.Contains(body, `outbox_pending{shard="0",table="public.outbox"} 0`) &&
			strings.Contains(body, `outbox_lag_seconds{shard="0",table="public.outbox"} 0`) &&
			strings.Contains(body, `outbox_worker_tick_duration_seconds_count{shard="0",table="public.outbox"}`)
	})

	r.stop(t)
	resp, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz after stop: %d", resp.StatusCode)
	}
}

func scrape(t testing.TB, base string) string {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
