// OpenTelemetry: a producer span per published event (--otlp-endpoint), a child of the
// traceparent the writer stored with the event, so that a trace shows the commit and the publish.

package relay

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracing is the relay's tracer, nil when --otlp-endpoint is unset.
type tracing struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
}

// exportErrors counts the exporter's errors (an endpoint that does not answer): the first is
// logged, then one a minute at most.
var (
	exportErrors  atomic.Int64
	lastExportLog atomic.Int64
)

// newTracing starts the exporter (it connects lazily: an endpoint that does not answer costs
// dropped spans, never a publish).
func newTracing(cfg *Config, log *slog.Logger) (*tracing, error) {
	if cfg.OTLPEndpoint == "" {
		return nil, nil
	}
	exp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpointURL(cfg.OTLPEndpoint))
	if err != nil {
		return nil, err
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		n := exportErrors.Add(1)
		now := time.Now().Unix()
		if last := lastExportLog.Load(); n == 1 || now-last >= 60 {
			lastExportLog.Store(now)
			log.Warn("tracing: spans not exported (publishing goes on)", "endpoint", cfg.OTLPEndpoint, "errors", n, "err", err)
		}
	}))
	res := resource.NewSchemaless(
		attribute.String("service.name", "outbox-relay"),
		attribute.String("outbox.table", cfg.Table.String()),
		attribute.Int("outbox.shard", cfg.ShardIndex),
	)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(time.Second)),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.TraceSampleRatio))),
	)
	return &tracing{provider: tp, tracer: tp.Tracer("github.com/outbox-operator/outbox-operator/relay")}, nil
}

// shutdown exports what is buffered, for at most a few seconds.
func (t *tracing) shutdown() {
	if t == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = t.provider.Shutdown(ctx)
}

// headerCarrier reads a message's headers for the W3C trace context propagator.
type headerCarrier []kafka.Header

func (h headerCarrier) Get(key string) string {
	for _, kv := range h {
		if kv.Key == key {
			return string(kv.Value)
		}
	}
	return ""
}
func (h headerCarrier) Set(string, string) {}
func (h headerCarrier) Keys() []string {
	keys := make([]string, len(h))
	for i, kv := range h {
		keys[i] = kv.Key
	}
	return keys
}

var traceContext = propagation.TraceContext{}

// spans records one producer span per message of msgs that was sent or failed (errs), from
// start to now, each the child of the traceparent in its headers (a root span where it has
// none), with the messaging attributes of the OpenTelemetry semantic conventions and the time
// from the event's commit (created_at) to the broker's acknowledgement (exactly-once: to its
// transaction's commit); extra are attributes of every span (the transactional id).
func (t *tracing) spans(msgs []kafka.Message, errs []error, rows []row, msgRows []int, start time.Time, extra ...attribute.KeyValue) {
	if t == nil {
		return
	}
	end := time.Now()
	for k := range msgs {
		if errors.Is(errs[k], errSkipped) {
			continue
		}
		m := &msgs[k]
		ctx := traceContext.Extract(context.Background(), headerCarrier(m.Headers))
		row := &rows[msgRows[k]]
		_, span := t.tracer.Start(ctx, "send "+m.Topic, trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(start),
			trace.WithAttributes(
				attribute.String("messaging.system", "kafka"),
				attribute.String("messaging.operation.name", "send"),
				attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.destination.name", m.Topic),
				attribute.String("messaging.destination.partition.id", strconv.Itoa(m.Partition)),
				attribute.String("messaging.message.id", string(row.eventID)),
				attribute.String("messaging.kafka.message.key", string(m.Key)),
				attribute.String("outbox.aggregate_type", string(row.aggType)),
				attribute.String("outbox.event_type", string(row.eventType)),
				attribute.Float64("outbox.commit_to_publish_ms", float64(end.Sub(row.createdAt).Microseconds())/1000),
			), trace.WithAttributes(extra...))
		if errs[k] != nil {
			span.SetStatus(codes.Error, errs[k].Error())
		}
		span.End(trace.WithTimestamp(end))
	}
}
