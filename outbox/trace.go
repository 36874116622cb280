package outbox

import (
	"context"
	"maps"

	"go.opentelemetry.io/otel/propagation"
)

// WithTraceContext returns ev with the W3C trace context of ctx's span (traceparent, and
// tracestate where there is one) added to its headers, so that the relays' producer spans
// (OutboxRelay spec.publish.tracing) continue the trace of the transaction that appended the
// event, and CloudEvents consumers get it as the distributed-tracing extension. ev's headers are
// copied, not changed; a ctx without a valid span returns ev as it is.
func WithTraceContext(ctx context.Context, ev Event) Event {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return ev
	}
	h := maps.Clone(ev.Headers)
	if h == nil {
		h = map[string]string{}
	}
	maps.Copy(h, carrier)
	ev.Headers = h
	return ev
}
