//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// pluginJSON runs the built kubectl-outbox with the cluster's kubeconfig and -o json, fails the
// test unless it succeeds, and decodes its output into v.
func pluginJSON(t *testing.T, e *env, v any, args ...string) {
	t.Helper()
	args = append(args, "--kubeconfig", os.Getenv("KUBECONFIG"), "-n", appNS, "-o", "json")
	cmd := exec.Command(e.plugin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl outbox %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	if err := json.Unmarshal(out.Bytes(), v); err != nil {
		t.Fatalf("kubectl outbox %s: %v in %s", strings.Join(args, " "), err, out.String())
	}
}

// The parts of the plugin's JSON the test reads, by their names on the wire.
type (
	pluginStatus struct {
		SchemaVersion int64  `json:"schemaVersion"`
		Tracking      string `json:"tracking"`
		Shards        struct {
			Count       int32 `json:"count"`
			HeldBuckets int   `json:"heldBuckets"`
			Relays      []struct {
				Shard   *int32 `json:"shard"`
				Buckets int    `json:"buckets"`
			} `json:"relays"`
		} `json:"shards"`
		Blocked []struct {
			AggregateID  string  `json:"aggregateID"`
			FirstEventID string  `json:"firstEventID"`
			Error        *string `json:"error"`
		} `json:"blocked"`
	}
	pluginEvent struct {
		EventID string `json:"eventID"`
		State   string `json:"state"`
		Skip    *struct {
			SkippedBy string `json:"skippedBy"`
			Reason    string `json:"reason"`
		} `json:"skip"`
	}
)

// operatePlugin walks the kubectl outbox session of docs/operating.md against the running relays
// (2 shards, row tracking): status; an event over the size limit of its topic blocks its
// aggregate until the limit is raised and retry publishes it and the later events at once;
// another poisoned aggregate's first event is dropped with skip and its later events follow;
// published; and a replay of 50 events, which the test's consumer reads again with their
// event_id and the replay header. It returns the number of rows it added to the outbox table.
func operatePlugin(t *testing.T, e *env, ctx context.Context, pool *pgxpool.Pool, ow *outbox.Writer, cons *consumer) int {
	t.Helper()
	who := strings.TrimSpace(kubectl(t, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"))

	eventually(t, time.Minute, "kubectl outbox status: the schema, row tracking, 2 relays holding 256 buckets", func() (bool, string) {
		var s pluginStatus
		pluginJSON(t, e, &s, "status", relayName)
		var shards []int32
		for _, r := range s.Shards.Relays {
			if r.Shard != nil {
				shards = append(shards, *r.Shard)
			}
		}
		slices.Sort(shards)
		return s.SchemaVersion == outboxdb.LatestVersion() && s.Tracking == "row" && s.Shards.Count == 2 && s.Shards.HeldBuckets == 256 &&
			slices.Equal(shards, []int32{0, 1}), fmt.Sprintf("%+v", s)
	})

	// Two aggregates whose first event is over the small topic's limit, each with two later events.
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	limit := "600"
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &limit}, smallTopic); err != nil {
		t.Fatal(err)
	}
	small := newConsumer(t, e.brokers, smallTopic)
	pad := strings.Repeat("x", 700)
	var evs []outbox.Event
	for seq := range 3 {
		for _, agg := range []string{"poison-retry", "poison-drop"} {
			payload := fmt.Sprintf(`{"seq":%d}`, seq)
			if seq == 0 {
				payload = fmt.Sprintf(`{"seq":0,"pad":%q}`, pad)
			}
			evs = append(evs, outbox.Event{AggregateType: "small", AggregateID: agg, EventType: "OrderUpdated", Payload: json.RawMessage(payload)})
		}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	appended, err := ow.AppendBatch(ctx, tx, evs)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	retryFirst, dropFirst := appended[0].EventID, appended[1].EventID
	eventually(t, time.Minute, "both poisoned aggregates blocked by the broker's refusal", func() (bool, string) {
		var s pluginStatus
		pluginJSON(t, e, &s, "status", relayName)
		n := 0
		for _, b := range s.Blocked {
			if (b.AggregateID == "poison-retry" || b.AggregateID == "poison-drop") && b.Error != nil && strings.Contains(*b.Error, "Message Size Too Large") {
				n++
			}
		}
		return n == 2, fmt.Sprintf("blocked %+v", s.Blocked)
	})

	// retry, once the topic takes the event: the aggregate's three events at once.
	raised := "100000"
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &raised}}, smallTopic); err != nil {
		t.Fatal(err)
	}
	var r struct {
		Events          int    `json:"events"`
		RetriedBy       string `json:"retriedBy"`
		RelaysListening int    `json:"relaysListening"`
	}
	pluginJSON(t, e, &r, "retry", relayName, "--aggregate", "poison-retry")
	// 1 failed event; 0 only if the relay's own backoff ended between the raise and the retry.
	if r.Events > 1 || r.RetriedBy != who || r.RelaysListening < 1 {
		t.Errorf("kubectl outbox retry: %+v; want 1 event, retried by %s, relays listening", r, who)
	}
	eventually(t, 10*time.Second, "poison-retry's 3 events on "+smallTopic, func() (bool, string) {
		small.poll(ctx)
		small.mu.Lock()
		defer small.mu.Unlock()
		return len(small.byAgg["poison-retry"]) == 3, fmt.Sprintf("%v", small.byAgg)
	})

	// skip --drop: the aggregate's later events follow; events shows who dropped it and why.
	var sk struct {
		SkippedBy string `json:"skippedBy"`
		Action    string `json:"action"`
	}
	pluginJSON(t, e, &sk, "skip", relayName, "--event", dropFirst, "--drop", "--reason", "e2e")
	if sk.SkippedBy != who || sk.Action != "drop" {
		t.Errorf("kubectl outbox skip: %+v", sk)
	}
	eventually(t, 10*time.Second, "poison-drop's 2 later events on "+smallTopic, func() (bool, string) {
		small.poll(ctx)
		small.mu.Lock()
		defer small.mu.Unlock()
		return len(small.byAgg["poison-drop"]) == 2, fmt.Sprintf("%v", small.byAgg)
	})
	small.check(t, map[string]int{"poison-retry": 3})
	if got := small.byAgg["poison-drop"]; !slices.Equal(got, []int{1, 2}) {
		t.Errorf("poison-drop on %s: %v, want [1 2]", smallTopic, got)
	}
	var pe []pluginEvent
	pluginJSON(t, e, &pe, "events", relayName, "--aggregate", "poison-drop")
	if len(pe) != 3 || pe[0].State != "skipped-dropped" || pe[0].Skip == nil || pe[0].Skip.SkippedBy != who || pe[0].Skip.Reason != "e2e" {
		t.Errorf("kubectl outbox events --aggregate poison-drop: %+v", pe)
	}
	var pub struct {
		Published bool   `json:"published"`
		Topic     string `json:"topic"`
	}
	pluginJSON(t, e, &pub, "published", relayName, "--event", retryFirst)
	if !pub.Published || pub.Topic != smallTopic {
		t.Errorf("kubectl outbox published --event %s: %+v", retryFirst, pub)
	}

	// replay the first 50 events: the consumer reads them again, with their event_id and the
	// replay's id in outbox_replay.
	rows, err := pool.Query(ctx, `SELECT id, event_id::text FROM public.outbox ORDER BY id LIMIT 50`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	var eventIDs []string
	for rows.Next() {
		var id int64
		var eid string
		if err := rows.Scan(&id, &eid); err != nil {
			t.Fatal(err)
		}
		ids, eventIDs = append(ids, id), append(eventIDs, eid)
	}
	if err := rows.Err(); err != nil || len(ids) != 50 {
		t.Fatalf("the first 50 events: %d (%v)", len(ids), err)
	}
	var rp struct {
		ID     int64 `json:"id"`
		Events int64 `json:"events"`
	}
	pluginJSON(t, e, &rp, "replay", relayName, "--from", fmt.Sprint(ids[0]), "--to", fmt.Sprint(ids[len(ids)-1]), "--reason", "e2e")
	if rp.ID == 0 || rp.Events != 50 {
		t.Fatalf("kubectl outbox replay: %+v, want 50 events", rp)
	}
	want := fmt.Sprint(rp.ID)
	eventually(t, time.Minute, "the 50 replayed events at the consumer", func() (bool, string) {
		cons.poll(ctx)
		cons.mu.Lock()
		defer cons.mu.Unlock()
		n := 0
		for _, id := range eventIDs {
			if cons.replay[id] == want {
				n++
			}
		}
		return n == 50, fmt.Sprintf("%d of 50 with %s=%s", n, "outbox_replay", want)
	})
	eventually(t, 30*time.Second, "the replay done", func() (bool, string) {
		var list []struct {
			ID          int64  `json:"id"`
			State       string `json:"state"`
			Replayed    int64  `json:"replayed"`
			RequestedBy string `json:"requestedBy"`
		}
		pluginJSON(t, e, &list, "replay", relayName, "--list")
		return len(list) == 1 && list[0].ID == rp.ID && list[0].State == "done" && list[0].Replayed == 50 && list[0].RequestedBy == who,
			fmt.Sprintf("%+v", list)
	})
	return len(evs)
}
