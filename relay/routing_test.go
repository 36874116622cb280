package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
)

// TestRouting: --topic-by event_type matches the topic map against the event type; a row's
// --topic-header member names its topic before the map; its --key-header member is the record's
// key, and so picks its partition as a Java producer would (franz-go's partitioner, not the
// relay's, says which); a header naming no valid topic, and an event no rule routes, are poison,
// dead-lettered with the reason. Read by an independent consumer.
func TestRouting(t *testing.T) {
	url, pool, k, byType := newTopicDB(t, "relay.route-type", 3)
	byHeader := kafkatest.UniqueTopic("relay.route-header")
	k.CreateTopic(t, byHeader, 5)
	dlq := kafkatest.UniqueTopic("relay.route-dlq")
	k.CreateTopic(t, dlq, 1)
	ctx := context.Background()
	// 10 Placed events, routed by the map; 10 Shipped events whose headers name their topic and,
	// for the even ones, their key; one naming a topic Kafka would refuse; one routed by nothing.
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
SELECT 'order', 'o-' || g, 'Placed', '{}'::jsonb, '{}'::jsonb FROM generate_series(1, 10) AS g
UNION ALL
SELECT 'order', 'o-' || g, 'Shipped', '{}'::jsonb, jsonb_build_object('dest', $1::text) ||
       CASE WHEN g % 2 = 0 THEN jsonb_build_object('k', 'customer-' || (g % 4)) ELSE '{}' END
FROM generate_series(1, 10) AS g`, byHeader); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES
('order', 'bad-1', 'Shipped', '{}', '{"dest": "no such/topic"}'),
('order', 'none-1', 'Cancelled', '{}', '{}')`); err != nil {
		t.Fatal(err)
	}
	cfg := withTracking(testConfig(url, k.Brokers, ""), TrackSnapshot)
	cfg.TopicMap = map[string]string{"Placed": byType}
	cfg.TopicBy = contract.TopicByEventType
	cfg.TopicHeader, cfg.KeyHeader = "dest", "k"
	cfg.PoisonPolicy, cfg.DeadLetterTopic = PoisonDeadLetter, dlq
	startRelay(t, cfg, "relay")

	c := newCollector(t, k, byType, byHeader, dlq)
	c.waitDistinct(t, 22, time.Minute)
	parts := map[string]int32{byType: 3, byHeader: 5, dlq: 1}
	partitioner := kgo.StickyKeyPartitioner(nil) // Kafka's murmur2, as the Java client hashes keys
	got := map[string]int{}
	for _, rec := range c.recs {
		agg, typ := rec.Headers[HeaderAggregateID], rec.Headers[HeaderEventType]
		wantTopic, wantKey := byType, agg
		switch {
		case agg == "bad-1":
			wantTopic = dlq
			if e := rec.Headers[HeaderError]; !strings.Contains(e, `header dest: "no such/topic" is not a valid Kafka topic name`) {
				t.Errorf("dead letter of bad-1: error %q", e)
			}
		case agg == "none-1":
			wantTopic = dlq
			if e := rec.Headers[HeaderError]; !strings.Contains(e, `no topic for event type "Cancelled" (no header "dest", not in --topic-map`) {
				t.Errorf("dead letter of none-1: error %q", e)
			}
		case typ == "Shipped":
			wantTopic = byHeader
			if k, ok := rec.Headers["k"]; ok {
				wantKey = k
			}
		}
		if rec.Topic != wantTopic || rec.Key != wantKey {
			t.Errorf("%s %s: topic %s key %q, want %s %q", typ, agg, rec.Topic, rec.Key, wantTopic, wantKey)
			continue
		}
		p := int32(partitioner.ForTopic(rec.Topic).Partition(&kgo.Record{Key: []byte(rec.Key)}, int(parts[rec.Topic])))
		if rec.Partition != p {
			t.Errorf("%s %s: key %q in partition %d, a Java producer's %d", typ, agg, rec.Key, rec.Partition, p)
		}
		got[rec.Topic]++
	}
	if got[byType] != 10 || got[byHeader] != 10 || got[dlq] != 2 {
		t.Errorf("records per topic %v, want 10 on %s, 10 on %s, 2 on %s", got, byType, byHeader, dlq)
	}
	t.Logf("records per topic: %v", got)
}

// TestCompression: with each --compression codec, the broker holds the relay's record batches
// compressed with it (as an independent client reads them from the log; the broker keeps the
// producer's codec) and a consumer reads every event's payload back intact.
func TestCompression(t *testing.T) {
	for _, codec := range contract.Compressions {
		t.Run(string(codec), func(t *testing.T) {
			url, pool, k, topic := newTopicDB(t, "relay.compression", 2)
			ctx := context.Background()
			if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'o-' || (g % 7), 'Placed', jsonb_build_object('n', g, 'text', repeat('outbox ', 50))
FROM generate_series(1, 200) AS g`); err != nil {
				t.Fatal(err)
			}
			cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
			cfg.Compression = codec
			startRelay(t, cfg, "relay")
			c := newCollector(t, k, topic)
			c.waitDistinct(t, 200, time.Minute)
			want := map[string][]byte{}
			rows, err := pool.Query(ctx, `SELECT event_id::text, payload::text FROM outbox`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var id, payload string
				if err := rows.Scan(&id, &payload); err != nil {
					t.Fatal(err)
				}
				want[id] = []byte(payload)
			}
			if rows.Err() != nil {
				t.Fatal(rows.Err())
			}
			for _, rec := range c.recs {
				if !bytes.Equal(rec.Value, want[rec.Headers[HeaderEventID]]) {
					t.Fatalf("event %s: value %.60q, want %.60q", rec.Headers[HeaderEventID], rec.Value, want[rec.Headers[HeaderEventID]])
				}
			}
			codecs := k.BatchCodecs(t, topic)
			if len(codecs) != 1 || codecs[string(codec)] == 0 {
				t.Fatalf("record batches by codec %v, want all %s", codecs, codec)
			}
			t.Logf("%d records in %v record batches", len(c.recs), codecs)
		})
	}
}

// TestKeyHeaderHoldsBackTheAggregate: with --key-header, the events a failure holds back within
// a batch are the failed event's aggregate's, whatever their keys. One batch, published by the
// relay's publish to a real broker: aggregate a's first event, refused by the broker (routed by
// its header to a topic that takes at most 4 KB), then 1.5 MB of other events, so that a's second event, keyed otherwise,
// is in a later chunk; it is held back (not sent), while another aggregate's event with the
// first one's key is sent. Read by an independent consumer.
func TestKeyHeaderHoldsBackTheAggregate(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.route-hold")
	k.CreateTopic(t, topic, 3)
	small := kafkatest.UniqueTopic("relay.route-hold-small")
	k.CreateTopic(t, small, 1)
	k.SetTopicConfig(t, small, "max.message.bytes", "4096")
	cfg := testConfig("postgres://unused@127.0.0.1:1/x", k.Brokers, topic)
	cfg.KeyHeader, cfg.TopicHeader = "k", "dest"
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.pub.close()
	b := r.getBatch()
	add := func(agg, typ, key string, payload int, extra string) {
		b.rows = append(b.rows, row{id: int64(len(b.rows) + 1), createdAt: time.Now(), eventID: []byte(fmt.Sprintf("00000000-0000-4000-8000-%012d", len(b.rows)+1)),
			aggType: []byte("order"), aggID: []byte(agg), eventType: []byte(typ),
			payload: []byte(`"` + strings.Repeat("x", payload) + `"`), headers: []byte(`{"k": "` + key + `"` + extra + `}`)})
	}
	add("a", "First", "key-1", 6000, `, "dest": "`+small+`"`)
	for i := range 500 {
		add(fmt.Sprintf("other-%d", i), "Filler", fmt.Sprintf("f-%d", i), 3000, "")
	}
	add("a", "Second", "key-2", 10, "")
	add("b", "Same key as a's first", "key-1", 10, "")
	r.prepare(b, time.Now(), nil, nil)
	if chunk := chunkEnd(b.sizes, 0, r.pub.callBytes()); chunk >= len(b.msgs)-2 {
		t.Fatalf("one chunk of %d holds a's second event too: the test needs two", chunk)
	}
	r.publish(context.Background(), b)
	last := len(b.msgs) - 1
	if b.errs[0] == nil {
		t.Fatal("the broker took a's first event of 6 KB")
	}
	if !errors.Is(b.errs[last-1], errSkipped) {
		t.Errorf("a's second event (another key): %v, want held back", b.errs[last-1])
	}
	if b.errs[last] != nil {
		t.Errorf("b's event, a's first event's key: %v, want sent", b.errs[last])
	}
	c := newCollector(t, k, topic)
	c.waitDistinct(t, 501, time.Minute) // the fillers and b's
	c.poll(t, time.Second)
	for _, rec := range c.recs {
		if rec.Headers[HeaderAggregateID] == "a" {
			t.Errorf("aggregate a's %s reached the topic", rec.Headers[HeaderEventType])
		}
	}
}
