package outbox

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// WithTraceContext stores the span's context as the traceparent header, in W3C form, and leaves
// the event's own headers (and the caller's map) alone; without a span the event is unchanged.
func TestWithTraceContext(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	own := map[string]string{"correlation_id": "c-1"}
	ev := WithTraceContext(ctx, Event{AggregateType: "order", AggregateID: "o-1", EventType: "Placed", Headers: own})
	if got := ev.Headers["traceparent"]; got != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Errorf("traceparent %q", got)
	}
	if ev.Headers["correlation_id"] != "c-1" || len(own) != 1 {
		t.Errorf("headers %v, the caller's %v", ev.Headers, own)
	}
	if plain := WithTraceContext(context.Background(), Event{Headers: own}); len(plain.Headers) != 1 {
		t.Errorf("without a span: %v", plain.Headers)
	}
}
