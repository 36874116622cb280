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

// The byte forms of the binding's constant header values, shared by every message.
var (
	ceStructuredValue  = []byte(ceStructuredType)
	ceJSONValue        = []byte(ceJSONType)
	ceOctetStreamValue = []byte(ceOctetStreamType)
	ceSpecVersionValue = []byte(ceSpecVersion)
)

// cloudEvent renders row's message as a CloudEvent in the mode --cloudevents says (none: as it
// is), and returns the value to publish. The message's headers are b.hdrs[hstart:] (the four
// standard ones, then the row's own); it leaves there, in binary mode, those with content-type
// and a ce_ header per attribute appended, or in structured mode those with the envelope's
// content-type (the row's own is the event's datacontenttype) and the whole event as the value.
// The row's headers stay (the inbox library reads event_id); those with a valid attribute name
// are also the event's extensions (traceparent: distributed tracing). A tombstone (value nil)
// keeps a nil value. keys interns the ce_ header names.
func (r *Relay) cloudEvent(b *batch, row *row, value []byte, hstart int, keys headerKeys) []byte {
	mode := r.cfg.CloudEvents
	if mode == contract.CloudEventsNone {
		return value
	}
	hdrs := b.hdrs[hstart:]
	contentType, rowType := ceJSONValue, -1
	for i := min(4, len(hdrs)); i < len(hdrs); i++ {
		if hdrs[i].Key == ceContentType {
			rowType = i
		}
	}
	switch {
	case rowType >= 0:
		contentType = hdrs[rowType].Value
	case row.isBytes:
		contentType = ceOctetStreamValue
	}
	at := len(b.arena)
	b.arena = row.createdAt.UTC().AppendFormat(b.arena, time.RFC3339Nano)
	created := b.arena[at:len(b.arena):len(b.arena)]
	if mode == contract.CloudEventsBinary {
		own := len(hdrs)
		if rowType < 0 && value != nil { // else the row's own says it, once
			b.hdrs = append(b.hdrs, kafka.Header{Key: ceContentType, Value: contentType})
		}
		b.hdrs = append(b.hdrs,
			kafka.Header{Key: "ce_specversion", Value: ceSpecVersionValue},
			kafka.Header{Key: "ce_id", Value: row.eventID},
			kafka.Header{Key: "ce_source", Value: r.ceSource},
			kafka.Header{Key: "ce_type", Value: row.eventType},
			kafka.Header{Key: "ce_subject", Value: row.aggID},
			kafka.Header{Key: "ce_time", Value: created},
		)
		var name [len(ceHeaderPrefix) + 20]byte // the longest extension name, prefixed
		for i := hstart + min(4, own); i < hstart+own; i++ {
			if k := b.hdrs[i].Key; ceExtensionName(k) {
				b.hdrs = append(b.hdrs, kafka.Header{Key: keys.intern(append(append(name[:0], ceHeaderPrefix...), k...)), Value: b.hdrs[i].Value})
			}
		}
		return value
	}
	// Structured: the event as a JSON object, the payload its data (JSON) or data_base64.
	if rowType >= 0 {
		b.hdrs = append(b.hdrs[:hstart+rowType], b.hdrs[hstart+rowType+1:]...)
	}
	b.hdrs = append(b.hdrs, kafka.Header{Key: ceContentType, Value: ceStructuredValue})
	if value == nil {
		return nil
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
	ev = appendJSONString(ev, created)
	ev = append(ev, `,"datacontenttype":`...)
	ev = appendJSONString(ev, contentType)
	for _, h := range b.hdrs[hstart+min(4, len(hdrs)):] { // the row's headers (its content-type gone) and the envelope's
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
	return append(ev, '}')
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst, s []byte) []byte {
	q, _ := json.Marshal(string(s))
	return append(dst, q...)
}
