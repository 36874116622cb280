package relay

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
)

// TestCloudEvents: in binary and in structured mode, every record an independent consumer reads
// is a valid CloudEvent as the CloudEvents Go SDK's Kafka protocol binding decodes it (not our
// parser): id the event id, type the event type, source the configured one, subject the
// aggregate id, time the event's created_at, the payload as data (JSON as it is, bytes as they
// are, with the row's content-type), traceparent and the other row headers with valid attribute
// names as extensions (an invalid name is not one); the relay's own headers stay.
func TestCloudEvents(t *testing.T) {
	for _, mode := range []contract.CloudEvents{contract.CloudEventsBinary, contract.CloudEventsStructured} {
		t.Run(string(mode), func(t *testing.T) {
			url, pool, k, topic := newTopicDB(t, "relay.cloudevents", 2)
			ctx := context.Background()
			const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
			if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, payload_bytes, headers) VALUES
('order', 'o-1', 'OrderPlaced', '{"total": 42}', NULL, jsonb_build_object('traceparent', $1::text, 'tenant', 'acme', 'Not-Valid', 'x')),
('order', 'o-2', 'OrderEncoded', NULL, '\x0a02ff00'::bytea, '{"content-type": "application/x-protobuf"}')`, tp); err != nil {
				t.Fatal(err)
			}
			created := createdAtByEvent(t, pool)
			cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
			cfg.CloudEvents, cfg.CloudEventsSource = mode, "/shop/orders"
			startRelay(t, cfg, "relay")
			c := newCollector(t, k, topic)
			c.waitDistinct(t, 2, time.Minute)
			for _, rec := range c.recs {
				if n := slices.Index(rec.HeaderKeys, "content-type"); n < 0 || slices.Index(rec.HeaderKeys[n+1:], "content-type") >= 0 {
					t.Errorf("%s: headers %q, want one content-type", rec.Key, rec.HeaderKeys)
				}
				ev := decodeCloudEvent(t, rec)
				if err := ev.Validate(); err != nil {
					t.Errorf("%s: not a valid CloudEvent: %v", rec.Key, err)
				}
				at, ok := created[ev.ID()]
				if !ok || ev.ID() != rec.Headers[HeaderEventID] {
					t.Errorf("%s: id %q, event_id header %q", rec.Key, ev.ID(), rec.Headers[HeaderEventID])
				}
				if ev.Source() != "/shop/orders" || ev.Subject() != rec.Key || !ev.Time().Equal(at) || ev.SpecVersion() != "1.0" {
					t.Errorf("%s: source %q subject %q time %s (created %s) specversion %s", rec.Key, ev.Source(), ev.Subject(), ev.Time(), at, ev.SpecVersion())
				}
				switch rec.Key {
				case "o-1":
					if ev.Type() != "OrderPlaced" || string(ev.Data()) != `{"total": 42}` || ev.DataContentType() != "application/json" {
						t.Errorf("o-1: type %q data %q content type %q", ev.Type(), ev.Data(), ev.DataContentType())
					}
					ext := ev.Extensions()
					if ext["traceparent"] != tp || ext["tenant"] != "acme" || len(ext) != 2 {
						t.Errorf("o-1: extensions %v, want traceparent and tenant only", ext)
					}
				case "o-2":
					if ev.Type() != "OrderEncoded" || !bytes.Equal(ev.Data(), []byte{0x0a, 0x02, 0xff, 0x00}) || ev.DataContentType() != "application/x-protobuf" {
						t.Errorf("o-2: type %q data %x content type %q", ev.Type(), ev.Data(), ev.DataContentType())
					}
				}
			}
		})
	}
}

// decodeCloudEvent decodes a record with the SDK's Kafka protocol binding.
func decodeCloudEvent(t *testing.T, rec kafkatest.Record) *event.Event {
	t.Helper()
	hdrs := map[string][]byte{}
	for k, v := range rec.Headers {
		hdrs[k] = []byte(v)
	}
	msg := kafka_sarama.NewMessage(rec.Value, rec.Headers["content-type"], hdrs)
	if msg.ReadEncoding() == binding.EncodingUnknown {
		t.Fatalf("%s: the SDK recognises no CloudEvent (headers %v)", rec.Key, rec.Headers)
	}
	ev, err := binding.ToEvent(context.Background(), msg)
	if err != nil {
		t.Fatalf("%s: the SDK cannot decode it: %v", rec.Key, err)
	}
	return ev
}

// TestStructuredCloudEventTooLarge: a bytes payload within the payload limit whose structured
// CloudEvent (data_base64, a third larger) exceeds what a produce request may carry is poison at
// once, dead-lettered with why, and the events after it are published; the broker is never asked
// to take it.
func TestStructuredCloudEventTooLarge(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.cloudevents.large", 1)
	dlq := topic + ".dlq"
	k.CreateTopic(t, dlq, 1)
	ctx := context.Background()
	big := bytes.Repeat([]byte{0xfe}, 850_000) // within the 900,000-byte payload limit; 1.13 MB as base64
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload_bytes) VALUES ('order', 'o-big', 'OrderScanned', $1)`, big); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o-2', 'OrderPlaced', '{"total": 1}')`); err != nil {
		t.Fatal(err)
	}
	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
	cfg.CloudEvents = contract.CloudEventsStructured
	cfg.PoisonPolicy, cfg.DeadLetterTopic = PoisonDeadLetter, dlq
	startRelay(t, cfg, "relay")
	c := newCollector(t, k, topic, dlq)
	c.waitDistinct(t, 2, time.Minute)
	for _, rec := range c.recs {
		switch rec.Key {
		case "o-big":
			if rec.Topic != dlq || !strings.Contains(rec.Headers[HeaderError], "the CloudEvent of about") {
				t.Errorf("o-big on %s with error %q, want the dead-letter topic and why", rec.Topic, rec.Headers[HeaderError])
			}
		case "o-2":
			if rec.Topic != topic {
				t.Errorf("o-2 on %s", rec.Topic)
			}
		}
	}
}
