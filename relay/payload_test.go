package relay

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
)

// TestPayloads: an event's value is its payload_bytes where set (bytes that are not UTF-8, not
// JSON), else its JSON payload; an event with neither is a tombstone (a null value) with
// --null-payload tombstone, an empty payload_bytes too, and poison otherwise (dead-lettered with
// the reason), while an empty payload_bytes is then an empty value. Both tracking modes, read by
// an independent consumer that tells a null value from an empty one.
func TestPayloads(t *testing.T) {
	forEachTracking(t, func(t *testing.T, tracking Tracking) {
		for _, np := range []contract.NullPayload{contract.NullPayloadPoison, contract.NullPayloadTombstone} {
			t.Run(string(np), func(t *testing.T) {
				url, pool, k, topic := newTopicDB(t, "relay.payloads", 2)
				dlq := kafkatest.UniqueTopic("relay.payloads-dlq")
				k.CreateTopic(t, dlq, 1)
				ctx := context.Background()
				if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, payload_bytes) VALUES
('order', 'json', 'Placed', '{"total": 42}', NULL),
('order', 'bytes', 'Placed', NULL, '\x00ff10809c'::bytea),
('order', 'empty', 'Placed', NULL, ''::bytea),
('order', 'none', 'Deleted', NULL, NULL)`); err != nil {
					t.Fatal(err)
				}
				cfg := withTracking(testConfig(url, k.Brokers, topic), tracking)
				cfg.NullPayload = np
				cfg.PoisonPolicy, cfg.DeadLetterTopic = PoisonDeadLetter, dlq
				startRelay(t, cfg, "relay")
				c := newCollector(t, k, topic, dlq)
				c.waitDistinct(t, 4, time.Minute)
				tomb := np == contract.NullPayloadTombstone
				want := map[string]struct {
					topic string
					value []byte // nil: a null value
				}{
					"json":  {topic, []byte(`{"total": 42}`)},
					"bytes": {topic, []byte{0x00, 0xff, 0x10, 0x80, 0x9c}},
					"empty": {topic, []byte{}},
					"none":  {dlq, nil},
				}
				if tomb {
					want["empty"] = struct {
						topic string
						value []byte
					}{topic, nil}
					want["none"] = struct {
						topic string
						value []byte
					}{topic, nil}
				}
				for _, rec := range c.recs {
					agg := rec.Key
					w := want[agg]
					if rec.Topic != w.topic || !bytes.Equal(rec.Value, w.value) || (rec.Value == nil) != (w.value == nil) {
						t.Errorf("%s: topic %s value %q (null: %v), want %s %q (null: %v)", agg, rec.Topic, rec.Value, rec.Value == nil, w.topic, w.value, w.value == nil)
					}
					if agg == "none" && !tomb && !strings.Contains(rec.Headers[HeaderError], "no value (payload and payload_bytes are NULL)") {
						t.Errorf("dead letter of none: error %q", rec.Headers[HeaderError])
					}
				}
			})
		}
	})
}

// TestBytesPayloadParked: a bytes payload the broker refuses is parked with its bytes (the
// parked table's payload_bytes) and published intact from there once the broker takes it.
func TestBytesPayloadParked(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.payloads-parked", 1)
	k.SetTopicConfig(t, topic, "max.message.bytes", "1024")
	ctx := context.Background()
	big := bytes.Repeat([]byte{0x00, 0xfe, 0x42}, 1000)
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload_bytes) VALUES ('order', 'o-1', 'Placed', $1)`, big); err != nil {
		t.Fatal(err)
	}
	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
	startRelay(t, cfg, "relay")
	waitFor(t, time.Minute, "the event parked", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM outbox_parked WHERE payload_bytes = $1 AND payload IS NULL`, big).Scan(&n)
		return n == 1
	})
	k.SetTopicConfig(t, topic, "max.message.bytes", "1048576")
	c := newCollector(t, k, topic)
	c.waitDistinct(t, 1, time.Minute)
	if !bytes.Equal(c.recs[0].Value, big) {
		t.Fatalf("published %d bytes, not the %d parked", len(c.recs[0].Value), len(big))
	}
}
