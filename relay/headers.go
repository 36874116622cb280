package relay

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// Header names the relay sets on every message from the row's own columns, and on dead-letter
// messages. A row's headers column cannot override them: its members with these names are
// dropped (outbox.Append refuses them in the first place). Defined once for the writer, the
// relay and the inbox in contract.
const (
	HeaderEventID       = contract.HeaderEventID
	HeaderEventType     = contract.HeaderEventType
	HeaderAggregateType = contract.HeaderAggregateType
	HeaderAggregateID   = contract.HeaderAggregateID
	HeaderError         = contract.HeaderError
	HeaderOriginalTopic = contract.HeaderOriginalTopic
	HeaderReplay        = contract.HeaderReplay
)

func reservedHeader(k []byte) bool {
	switch string(k) {
	case HeaderEventID, HeaderEventType, HeaderAggregateType, HeaderAggregateID, HeaderError, HeaderOriginalTopic, HeaderReplay:
		return true
	}
	return false
}

// headerKeys interns the keys of row headers (traceparent, correlationId, ...), so that the
// steady state allocates no string per message for them.
type headerKeys map[string]string

const maxInternedKeys = 1024

func (h headerKeys) intern(b []byte) string {
	if s, ok := h[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(h) < maxInternedKeys {
		h[s] = s
	}
	return s
}

// appendEventHeaders appends the four standard headers and then the members of the row's
// headers JSON object (see appendRowHeaders).
func appendEventHeaders(dst []kafka.Header, r *row, keys headerKeys) ([]kafka.Header, error) {
	dst = append(dst,
		kafka.Header{Key: HeaderEventID, Value: r.eventID},
		kafka.Header{Key: HeaderEventType, Value: r.eventType},
		kafka.Header{Key: HeaderAggregateType, Value: r.aggType},
		kafka.Header{Key: HeaderAggregateID, Value: r.aggID},
	)
	return appendRowHeaders(dst, r.headers, keys)
}

// appendRowHeaders appends one header per member of raw, a JSON object as PostgreSQL renders a
// jsonb value. String values are unescaped; other values keep their JSON text (a number 3
// becomes "3"); null members and members named like a reserved header are skipped. Values
// alias raw unless they had to be unescaped.
func appendRowHeaders(dst []kafka.Header, raw []byte, keys headerKeys) ([]kafka.Header, error) {
	if len(raw) == 2 && raw[0] == '{' && raw[1] == '}' {
		return dst, nil
	}
	err := eachMember(raw, func(k, v []byte, kEsc, isString, vEsc bool) error {
		if kEsc {
			var s string
			if err := json.Unmarshal(k, &s); err != nil {
				return err
			}
			k = []byte(s)
		} else {
			k = k[1 : len(k)-1]
		}
		if reservedHeader(k) {
			return nil
		}
		switch {
		case isString && vEsc:
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return err
			}
			v = []byte(s)
		case isString:
			v = v[1 : len(v)-1]
		case string(v) == "null":
			return nil
		}
		dst = append(dst, kafka.Header{Key: keys.intern(k), Value: v})
		return nil
	})
	if err != nil {
		return dst, fmt.Errorf("headers column is not a JSON object of strings: %w", err)
	}
	return dst, nil
}

var errJSON = errors.New("malformed JSON")

// eachMember calls fn for each member of the JSON object in b with the raw key (quotes
// included), the raw value, whether the key holds escapes, whether the value is a string and
// whether it holds escapes.
func eachMember(b []byte, fn func(k, v []byte, kEsc, isString, vEsc bool) error) error {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return errJSON
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		if skipSpace(b, i+1) != len(b) {
			return errJSON
		}
		return nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return errJSON
		}
		kEnd, kEsc, ok := scanString(b, i)
		if !ok {
			return errJSON
		}
		key := b[i:kEnd]
		i = skipSpace(b, kEnd)
		if i >= len(b) || b[i] != ':' {
			return errJSON
		}
		i = skipSpace(b, i+1)
		if i >= len(b) {
			return errJSON
		}
		var (
			vEnd     int
			vEsc     bool
			isString = b[i] == '"'
		)
		if isString {
			vEnd, vEsc, ok = scanString(b, i)
		} else {
			vEnd, ok = scanValue(b, i)
		}
		if !ok {
			return errJSON
		}
		if err := fn(key, b[i:vEnd], kEsc, isString, vEsc); err != nil {
			return err
		}
		i = skipSpace(b, vEnd)
		if i >= len(b) {
			return errJSON
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			if skipSpace(b, i+1) != len(b) {
				return errJSON
			}
			return nil
		default:
			return errJSON
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// scanString returns the index just past the string starting at b[i] == '"'.
func scanString(b []byte, i int) (end int, escaped, ok bool) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped, true
		}
	}
	return 0, false, false
}

// scanValue returns the index just past the non-string JSON value starting at b[i]: a number,
// a literal, an object or an array (nested strings are skipped whole).
func scanValue(b []byte, i int) (int, bool) {
	depth := 0
	for j := i; j < len(b); j++ {
		switch c := b[j]; c {
		case '"':
			end, _, ok := scanString(b, j)
			if !ok {
				return 0, false
			}
			j = end - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return j, j > i
			}
			depth--
			if depth == 0 {
				return j + 1, true
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return j, j > i
			}
		}
	}
	return len(b), depth == 0 && len(b) > i
}

// messageSize is an upper bound of the bytes a message takes in a produce request's record batch
// (and of kafka-go's own count, its Message.totalSize), so that a call's messages within the
// byte budget of one call fit one request.
func messageSize(key, value []byte, headers []kafka.Header) int {
	n := 32 + len(key) + len(value)
	for i := range headers {
		n += 12 + len(headers[i].Key) + len(headers[i].Value)
	}
	return n
}
