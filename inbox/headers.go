package inbox

import (
	"fmt"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// EventIDHeader is the Kafka header in which relays publish the event's id.
const EventIDHeader = contract.HeaderEventID

// KafkaHeader is the shape of a Kafka record header in the common Go clients: kafka-go's
// kafka.Header and franz-go's kgo.RecordHeader are both struct{ Key string; Value []byte }, so
// EventIDFromHeaders takes their slices as they are, without this package importing either.
type KafkaHeader interface {
	~struct {
		Key   string
		Value []byte
	}
}

type header struct {
	Key   string
	Value []byte
}

// EventIDFromHeaders returns the event id from a message's headers: the first event_id header,
// which must hold a UUID, returned in lower case. It returns ErrMissingEventID when there is
// none or it is not a UUID.
//
//	id, err := inbox.EventIDFromHeaders(m.Headers)   // kafka-go: m is a kafka.Message
//	id, err := inbox.EventIDFromHeaders(r.Headers)   // franz-go: r is a *kgo.Record
func EventIDFromHeaders[H KafkaHeader](headers []H) (string, error) {
	return EventIDFromLookup(func(key string) ([]byte, bool) {
		for _, h := range headers {
			if h := header(h); h.Key == key {
				return h.Value, true
			}
		}
		return nil, false
	})
}

// EventIDFromLookup is EventIDFromHeaders for any other header shape: lookup returns the first
// value of a header key, and whether there is one.
func EventIDFromLookup(lookup func(key string) ([]byte, bool)) (string, error) {
	v, ok := lookup(EventIDHeader)
	if !ok {
		return "", ErrMissingEventID
	}
	id, ok := canonicalUUID(string(v))
	if !ok {
		return "", fmt.Errorf("%w: the %s header is not a UUID", ErrMissingEventID, EventIDHeader)
	}
	return id, nil
}
