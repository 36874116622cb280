package relay

import (
	"context"
	"encoding/hex"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
)

// otlpReceiver is a real OTLP/gRPC trace endpoint, in the test process: it keeps the spans it is
// sent.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (o *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			o.spans = append(o.spans, ss.Spans...)
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (o *otlpReceiver) got() []*tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*tracepb.Span(nil), o.spans...)
}

func startOTLPReceiver(t *testing.T) (*otlpReceiver, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	o := &otlpReceiver{}
	coltracepb.RegisterTraceServiceServer(srv, o)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return o, "http://" + lis.Addr().String()
}

// TestTracing: with --otlp-endpoint the relay exports, to a real OTLP/gRPC receiver, one producer
// span per published event: the child of the traceparent the writer stored (same trace, the
// stored span as parent), a root span for an event without one, with the messaging attributes
// (system, destination, the partition an independent consumer found the record in, the event id
// as message id) and the time from commit to publish; under exactly-once delivery too (the
// records read committed), each span naming its transaction's id. With the endpoint down, every
// event is still published.
func TestTracing(t *testing.T) {
	for _, delivery := range []contract.Delivery{contract.DeliveryAtLeastOnce, contract.DeliveryExactlyOnce} {
		t.Run("exported "+string(delivery), func(t *testing.T) { tracingExported(t, delivery) })
	}
	t.Run("endpoint down", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		endpoint := "http://" + lis.Addr().String()
		lis.Close() // nothing listens there
		url, pool, k, topic := newTopicDB(t, "relay.tracing-down", 3)
		if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'o-' || g, 'OrderPlaced', '{}' FROM generate_series(1, 200) AS g`); err != nil {
			t.Fatal(err)
		}
		cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
		cfg.OTLPEndpoint = endpoint
		startRelay(t, cfg, "relay")
		newCollector(t, k, topic).waitDistinct(t, 200, time.Minute)
	})
}

// tracingExported is TestTracing's "exported" case under delivery (exactly-once: the records
// read committed, and every span names the transaction's id).
func tracingExported(t *testing.T, delivery contract.Delivery) {
	o, endpoint := startOTLPReceiver(t)
	url, pool, k, topic := newTopicDB(t, "relay.tracing", 3)
	ctx := context.Background()
	const traceID, parentID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES
('order', 'o-1', 'OrderPlaced', '{}', jsonb_build_object('traceparent', '00-`+traceID+`-`+parentID+`-01')),
('order', 'o-2', 'OrderPlaced', '{}', '{}')`); err != nil {
		t.Fatal(err)
	}
	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
	cfg.OTLPEndpoint = endpoint
	c := newCollector(t, k, topic)
	if delivery == contract.DeliveryExactlyOnce {
		cursors := kafkatest.UniqueTopic("relay.tracing.cursor")
		compact := "compact"
		k.CreateTopicWithConfig(t, cursors, 1, map[string]*string{"cleanup.policy": &compact})
		cfg.Delivery, cfg.CursorTopic = delivery, cursors
		c = &collector{c: k.NewCommittedConsumer(t, topic), byEvent: map[string]int{}}
	}
	startRelay(t, cfg, "relay")
	c.waitDistinct(t, 2, time.Minute)
	byEvent := map[string]*tracepb.Span{}
	waitFor(t, 30*time.Second, "two spans at the receiver", func() bool {
		for _, s := range o.got() {
			for _, a := range s.Attributes {
				if a.Key == "messaging.message.id" {
					byEvent[a.Value.GetStringValue()] = s
				}
			}
		}
		return len(byEvent) == 2
	})
	for _, rec := range c.recs {
		s := byEvent[rec.Headers[HeaderEventID]]
		if s == nil {
			t.Fatalf("%s: no span", rec.Key)
		}
		attrs := map[string]string{}
		for _, a := range s.Attributes {
			attrs[a.Key] = a.Value.GetStringValue()
			if a.Key == "outbox.commit_to_publish_ms" && a.Value.GetDoubleValue() <= 0 {
				t.Errorf("%s: commit to publish %v ms", rec.Key, a.Value.GetDoubleValue())
			}
		}
		if txnID := attrs["outbox.transactional_id"]; (txnID != "") != (delivery == contract.DeliveryExactlyOnce) {
			t.Errorf("%s: transactional id %q under %s delivery", rec.Key, txnID, delivery)
		}
		if s.Kind != tracepb.Span_SPAN_KIND_PRODUCER || s.Name != "send "+topic || attrs["messaging.system"] != "kafka" ||
			attrs["messaging.destination.name"] != topic || attrs["messaging.destination.partition.id"] != strconv.Itoa(int(rec.Partition)) {
			t.Errorf("%s: span %q kind %v attributes %v; the record is in partition %d", rec.Key, s.Name, s.Kind, attrs, rec.Partition)
		}
		switch rec.Key {
		case "o-1":
			if hex.EncodeToString(s.TraceId) != traceID || hex.EncodeToString(s.ParentSpanId) != parentID {
				t.Errorf("o-1: trace %x parent %x, want the stored traceparent's %s %s", s.TraceId, s.ParentSpanId, traceID, parentID)
			}
		case "o-2":
			if len(s.ParentSpanId) != 0 {
				t.Errorf("o-2: parent %x, want a root span", s.ParentSpanId)
			}
		}
	}
}
