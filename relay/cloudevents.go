// CloudEvents: each event published in the Kafka protocol binding of the CloudEvents
// specification (--cloudevents), binary or structured mode.

package relay

import (
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// Header names and values of the Kafka protocol binding.
const (
	ceContentType     = "content-type"
	ceStructuredType  = "application/cloudevents+json"
	ceJSONType        = "application/json"
	ceOctetStreamType = "application/octet-stream"
	ceHeaderPrefix    = "ce_"
	ceSpecVersion     = "1.0"
)

// ceAttributes are the context attributes the relay sets itself; a row header of one of these
// names is not made an extension.
var ceAttributes = map[string]bool{"specversion": true, "id": true, "source": true, "type": true, "subject": true,
	"time": true, "datacontenttype": true, "dataschema": true, "data": true, "data_base64": true}

// ceExtensionName reports whether a row header's name is a valid CloudEvents attribute name
// (lower-case ASCII letters and digits, at most 20 characters) that may become an extension.
func ceExtensionName(k string) bool {
	if len(k) == 0 || len(k) > 20 || ceAttributes[k] {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// cloudEvent renders row's message, whose value is value and whose headers hdrs (the four
// standard ones, then the row's own), as a CloudEvent in the mode --cloudevents says, and returns
// the value and headers to publish: hdrs with, in binary mode, content-type and a ce_ header per
// attribute appended, or in structured mode content-type appended and the whole event as the
// value. The row's headers stay as they are (the inbox library reads event_id); those with a
// valid attribute name are also the event's extensions (traceparent: distributed tracing). A
// tombstone (value nil) keeps a nil value. keys interns the ce_ header names.
func (r *Relay) cloudEvent(b *batch, row *row, value []byte, hdrs []kafka.Header, keys headerKeys) ([]byte, []kafka.Header) {
	mode := r.cfg.CloudEvents
	if mode == contract.CloudEventsNone || mode == "" {
		return value, hdrs
	}
	contentType, rowType := ceJSONType, -1
	for i := min(4, len(hdrs)); i < len(hdrs); i++ {
		if hdrs[i].Key == ceContentType {
			rowType = i
		}
	}
	switch {
	case rowType >= 0:
		contentType = string(hdrs[rowType].Value)
	case row.isBytes:
		contentType = ceOctetStreamType
	}
	at := b.appendBytes([]byte(row.createdAt.UTC().Format(time.RFC3339Nano)))
	if mode == contract.CloudEventsBinary {
		own := hdrs[min(4, len(hdrs)):]
		out := hdrs
		if rowType < 0 && value != nil { // else the row's own says it, once
			out = append(out, kafka.Header{Key: ceContentType, Value: []byte(contentType)})
		}
		out = append(out,
			kafka.Header{Key: "ce_specversion", Value: []byte(ceSpecVersion)},
			kafka.Header{Key: "ce_id", Value: row.eventID},
			kafka.Header{Key: "ce_source", Value: r.ceSource},
			kafka.Header{Key: "ce_type", Value: row.eventType},
			kafka.Header{Key: "ce_subject", Value: row.aggID},
			kafka.Header{Key: "ce_time", Value: at},
		)
		for _, h := range own {
			if ceExtensionName(h.Key) {
				out = append(out, kafka.Header{Key: keys.intern([]byte(ceHeaderPrefix + h.Key)), Value: h.Value})
			}
		}
		return value, out
	}
	// Structured: the event as a JSON object, the payload its data (JSON) or data_base64. A
	// content-type of the row's is the event's datacontenttype: the record's is the envelope's.
	out := hdrs
	if rowType >= 0 {
		out = append(out[:rowType], out[rowType+1:]...)
	}
	out = append(out, kafka.Header{Key: ceContentType, Value: []byte(ceStructuredType)})
	if value == nil {
		return nil, out
	}
	ev := make([]byte, 0, 256+len(value)*4/3)
	ev = append(ev, `{"specversion":"1.0","id":`...)
	ev = appendJSONString(ev, row.eventID)
	ev = append(ev, `,"source":`...)
	ev = appendJSONString(ev, r.ceSource)
	ev = append(ev, `,"type":`...)
	ev = appendJSONString(ev, row.eventType)
	ev = append(ev, `,"subject":`...)
	ev = appendJSONString(ev, row.aggID)
	ev = append(ev, `,"time":`...)
	ev = appendJSONString(ev, at)
	ev = append(ev, `,"datacontenttype":`...)
	ev = appendJSONString(ev, []byte(contentType))
	for _, h := range out[min(4, len(out)):] { // the row's headers (its content-type gone) and the envelope's
		if ceExtensionName(h.Key) {
			ev = append(ev, ',')
			ev = appendJSONString(ev, []byte(h.Key))
			ev = append(ev, ':')
			ev = appendJSONString(ev, h.Value)
		}
	}
	if row.isBytes {
		ev = append(ev, `,"data_base64":"`...)
		ev = base64.StdEncoding.AppendEncode(ev, value)
		ev = append(ev, '"')
	} else {
		ev = append(ev, `,"data":`...)
		ev = append(ev, value...)
	}
	return append(ev, '}'), out
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst, s []byte) []byte {
	q, _ := json.Marshal(string(s))
	return append(dst, q...)
}
