package relay

import (
	"bytes"
	"context"
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
