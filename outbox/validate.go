package outbox

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// Validation errors. Append and AppendBatch return them wrapped in an *InvalidEventError;
// test with errors.Is.
var (
	ErrEmptyAggregateType = errors.New("empty aggregate type")
	ErrEmptyAggregateID   = errors.New("empty aggregate id")
	ErrEmptyEventType     = errors.New("empty event type")
	// ErrInvalidText: a text field holds a NUL byte or invalid UTF-8, which PostgreSQL's text
	// type rejects.
	ErrInvalidText = errors.New("text field is not valid UTF-8 without NUL bytes")
	// ErrInvalidPayload: the payload is not valid JSON, or is JSON that jsonb rejects.
	ErrInvalidPayload = errors.New("invalid payload")
	// ErrPayloadTooLarge: the payload, as the relay will read it, exceeds the writer's limit.
	ErrPayloadTooLarge = errors.New("payload too large")
	// ErrInvalidHeader: an empty or reserved header key, or a key or value that is not valid
	// UTF-8 without NUL bytes.
	ErrInvalidHeader = errors.New("invalid header")
	// ErrInvalidEventID: EventID is set but is not a UUID.
	ErrInvalidEventID = errors.New("invalid event id")
	// ErrMessageTooLarge: the Kafka key (the aggregate id) and headers of the message the relay
	// will publish take more than MaxKeyAndHeadersBytes.
	ErrMessageTooLarge = errors.New("message key and headers too large")
)

// MaxKeyAndHeadersBytes bounds what a message carries besides its payload: the key, the relay's
// four standard headers and the event's own. A relay accepts a message of up to its payload limit
// plus this much (its produce budget), so an event within both limits is never refused as
// oversized by the relay.
const MaxKeyAndHeadersBytes = 100_000

// keyAndHeadersSize is the relay's estimate of a message's size (kafka-go's, per record and per
// header) without the payload.
func keyAndHeadersSize(ev *Event) int {
	n := 32 + len(ev.AggregateID) +
		12 + len(contract.HeaderEventID) + 36 +
		12 + len(contract.HeaderEventType) + len(ev.EventType) +
		12 + len(contract.HeaderAggregateType) + len(ev.AggregateType) +
		12 + len(contract.HeaderAggregateID) + len(ev.AggregateID)
	for k, v := range ev.Headers {
		n += 12 + len(k) + len(v)
	}
	return n
}

// ReservedHeaders are the Kafka headers the relay sets itself: from the row's own columns on
// every message, and error and original_topic on dead-letter messages. An event may not carry
// them in Headers (the relay would drop them; a consumer reading event_id must only ever see the
// relay's).
var ReservedHeaders = slices.Clone(contract.ReservedHeaders)

// InvalidEventError reports an event that failed validation. Index is its position in the
// batch (0 for Append). Nothing was written.
type InvalidEventError struct {
	Index int
	Err   error
}

func (e *InvalidEventError) Error() string {
	return fmt.Sprintf("outbox: event %d: %v", e.Index, e.Err)
}

func (e *InvalidEventError) Unwrap() error { return e.Err }

// prepared is a validated event in the shape the insert sends.
type prepared struct {
	eventID [16]byte // Event.EventID, or a new random one
	payload []byte   // JSON, or where bytes the value (nil for a tombstone)
	bytes   bool     // payload goes to payload_bytes (PayloadBytes, Tombstone)
	headers []byte
}

func (w *Writer) validate(ev *Event) (prepared, error) {
	var p prepared
	if err := checkText(ev.AggregateType, ErrEmptyAggregateType, "aggregate type"); err != nil {
		return p, err
	}
	if err := checkText(ev.AggregateID, ErrEmptyAggregateID, "aggregate id"); err != nil {
		return p, err
	}
	if err := checkText(ev.EventType, ErrEmptyEventType, "event type"); err != nil {
		return p, err
	}
	if ev.EventID != "" {
		id, ok := parseUUID(ev.EventID)
		if !ok {
			return p, fmt.Errorf("%w: %q is not a UUID", ErrInvalidEventID, ev.EventID)
		}
		p.eventID = id
	} else {
		p.eventID = newEventID()
	}
	switch {
	case ev.Tombstone:
		if len(ev.Payload) > 0 || ev.PayloadBytes != nil {
			return p, fmt.Errorf("%w: a tombstone has no Payload or PayloadBytes", ErrInvalidPayload)
		}
		p.bytes = true
	case ev.PayloadBytes != nil:
		if len(ev.Payload) > 0 {
			return p, fmt.Errorf("%w: set Payload or PayloadBytes, not both", ErrInvalidPayload)
		}
		if n := len(ev.PayloadBytes); n > w.maxPayloadBytes {
			return p, fmt.Errorf("%w: %d bytes, limit %d", ErrPayloadTooLarge, n, w.maxPayloadBytes)
		}
		p.payload, p.bytes = ev.PayloadBytes, true
	default:
		if !utf8.Valid(ev.Payload) {
			return p, fmt.Errorf("%w: not valid UTF-8", ErrInvalidPayload)
		}
		if !json.Valid(ev.Payload) {
			return p, errNotJSON
		}
		size, err := StoredPayloadSize(ev.Payload)
		if err != nil {
			return p, err
		}
		if size > w.maxPayloadBytes {
			return p, fmt.Errorf("%w: %d bytes as stored, limit %d", ErrPayloadTooLarge, size, w.maxPayloadBytes)
		}
		p.payload = ev.Payload
	}
	h, err := encodeHeaders(ev.Headers)
	if err != nil {
		return p, err
	}
	p.headers = h
	if n := keyAndHeadersSize(ev); n > MaxKeyAndHeadersBytes {
		return p, fmt.Errorf("%w: about %d bytes, limit %d", ErrMessageTooLarge, n, MaxKeyAndHeadersBytes)
	}
	return p, nil
}

func checkText(s string, empty error, what string) error {
	if s == "" {
		return empty
	}
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%w: %s", ErrInvalidText, what)
	}
	return nil
}

var emptyObject = []byte("{}")

// encodeHeaders returns the headers as a JSON object with sorted keys.
func encodeHeaders(h map[string]string) ([]byte, error) {
	if len(h) == 0 {
		return emptyObject, nil
	}
	keys := make([]string, 0, len(h))
	for k, v := range h {
		switch {
		case k == "":
			return nil, fmt.Errorf("%w: empty key", ErrInvalidHeader)
		case isReserved(k):
			return nil, fmt.Errorf("%w: key %q is reserved; the relay sets it", ErrInvalidHeader, k)
		case !utf8.ValidString(k) || strings.IndexByte(k, 0) >= 0:
			return nil, fmt.Errorf("%w: key %q is not valid UTF-8 without NUL bytes", ErrInvalidHeader, k)
		case !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0:
			return nil, fmt.Errorf("%w: value of %q is not valid UTF-8 without NUL bytes", ErrInvalidHeader, k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// json.Marshal of a map sorts too; building it by hand saves the reflection.
	b := make([]byte, 0, 64)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		b = appendJSONString(b, h[k])
	}
	return append(b, '}'), nil
}

func isReserved(k string) bool {
	for _, r := range ReservedHeaders {
		if k == r {
			return true
		}
	}
	return false
}

// appendJSONString appends s, valid UTF-8, as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\t':
			b = append(b, '\\', 't')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// newEventID returns a random (version 4, RFC 9562) UUID, as gen_random_uuid() would.
func newEventID() [16]byte {
	var id [16]byte
	_, _ = rand.Read(id[:]) // crypto/rand.Read never returns an error (Go 1.24+); it crashes the program instead
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	return id
}

// parseUUID parses the canonical 8-4-4-4-12 hexadecimal form, either case.
func parseUUID(s string) ([16]byte, bool) {
	var id [16]byte
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return id, false
	}
	j := 0
	for i := 0; i < 36; {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			i++
			continue
		}
		hi, ok1 := unhex(s[i])
		lo, ok2 := unhex(s[i+1])
		if !ok1 || !ok2 {
			return id, false
		}
		id[j] = hi<<4 | lo
		j++
		i += 2
	}
	return id, true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// PostgreSQL numeric limits (NUMERIC_WEIGHT_MAX and NUMERIC_DSCALE_MAX): at most 131072 digits
// before the decimal point and 16383 after it.
const (
	maxNumericIntDigits  = 131072
	maxNumericFracDigits = 16383
)

// StoredPayloadSize returns the length in bytes of payload as PostgreSQL renders it after
// storing it as jsonb (octet_length(payload::text)), which is what a relay reads back and
// publishes. It is exact, except that jsonb keeps only the last of duplicate object keys, in
// which case it is an upper bound. It returns an error wrapping ErrInvalidPayload for JSON that
// jsonb rejects: a \u0000 escape, a lone UTF-16 surrogate, or a number outside numeric's range.
// payload must be valid JSON (json.Valid).
func StoredPayloadSize(payload []byte) (int, error) {
	n := 0
	for i := 0; i < len(payload); {
		switch c := payload[i]; c {
		case ' ', '\t', '\n', '\r':
			i++
		case '{', '}', '[', ']':
			n++
			i++
		case ':', ',': // jsonb writes ": " and ", "
			n += 2
			i++
		case '"':
			l, next, err := storedStringSize(payload, i)
			if err != nil {
				return 0, err
			}
			n += l
			i = next
		case 't', 'n': // true, null
			n += 4
			i += 4
		case 'f': // false
			n += 5
			i += 5
		default: // a number
			j := i
			for j < len(payload) && isNumberByte(payload[j]) {
				j++
			}
			if j == i {
				return 0, errNotJSON
			}
			l, err := storedNumberSize(payload[i:j])
			if err != nil {
				return 0, err
			}
			n += l
			i = j
		}
	}
	return n, nil
}

var errNotJSON = fmt.Errorf("%w: not valid JSON", ErrInvalidPayload)

func isNumberByte(c byte) bool {
	return '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

// storedStringSize returns the rendered size of the JSON string starting at p[i] == '"' and the
// index after its closing quote. jsonb decodes every escape and writes the string back escaping
// only '"', '\\' and control characters.
func storedStringSize(p []byte, i int) (size, next int, err error) {
	n := 2 // the quotes
	j := i + 1
	for j < len(p) {
		c := p[j]
		if c == '"' {
			return n, j + 1, nil
		}
		if c != '\\' {
			n++
			j++
			continue
		}
		if j+1 >= len(p) {
			break
		}
		switch e := p[j+1]; e {
		case '"', '\\', 'b', 'f', 'n', 'r', 't':
			n += 2
			j += 2
		case '/':
			n++
			j += 2
		case 'u':
			cp, ok := hex4(p, j+2)
			if !ok {
				return 0, 0, errNotJSON
			}
			j += 6
			switch {
			case cp == 0:
				return 0, 0, fmt.Errorf(`%w: \u0000 cannot be stored in jsonb`, ErrInvalidPayload)
			case 0xD800 <= cp && cp <= 0xDBFF:
				lo, ok := rune(0), false
				if j+1 < len(p) && p[j] == '\\' && p[j+1] == 'u' {
					lo, ok = hex4(p, j+2)
				}
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return 0, 0, fmt.Errorf("%w: a UTF-16 high surrogate without its low surrogate", ErrInvalidPayload)
				}
				j += 6
				n += 4 // a code point beyond the BMP: four bytes of UTF-8
			case 0xDC00 <= cp && cp <= 0xDFFF:
				return 0, 0, fmt.Errorf("%w: a UTF-16 low surrogate without its high surrogate", ErrInvalidPayload)
			default:
				n += escapedRuneSize(cp)
			}
		default:
			return 0, 0, errNotJSON
		}
	}
	return 0, 0, errNotJSON
}

// escapedRuneSize is how many bytes jsonb's output writes for the code point.
func escapedRuneSize(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20:
		return 6 // \u00XX
	}
	return utf8.RuneLen(r)
}

func hex4(p []byte, i int) (rune, bool) {
	if i+4 > len(p) {
		return 0, false
	}
	var r rune
	for _, c := range p[i : i+4] {
		v, ok := unhex(c)
		if !ok {
			return 0, false
		}
		r = r<<4 | rune(v)
	}
	return r, true
}

// storedNumberSize returns the length of numeric's output for a JSON number: plain notation,
// no leading zeros, a scale of the mantissa's fraction digits minus the exponent.
func storedNumberSize(tok []byte) (int, error) {
	invalid := errNotJSON
	neg := false
	if len(tok) > 0 && tok[0] == '-' {
		neg, tok = true, tok[1:]
	}
	mant, expPart := tok, []byte(nil)
	if k := indexAny(tok, 'e', 'E'); k >= 0 {
		mant, expPart = tok[:k], tok[k+1:]
	}
	intPart, fracPart := mant, []byte(nil)
	if k := indexAny(mant, '.'); k >= 0 {
		intPart, fracPart = mant[:k], mant[k+1:]
	}
	if len(intPart) == 0 {
		return 0, invalid
	}
	exp := 0
	if expPart != nil {
		expNeg := false
		if len(expPart) > 0 && (expPart[0] == '+' || expPart[0] == '-') {
			expNeg = expPart[0] == '-'
			expPart = expPart[1:]
		}
		if len(expPart) == 0 {
			return 0, invalid
		}
		for _, c := range expPart {
			if c < '0' || c > '9' {
				return 0, invalid
			}
			if exp < math.MaxInt32 {
				exp = exp*10 + int(c-'0')
			}
		}
		if exp >= math.MaxInt32/2 { // numeric_in rejects the exponent itself
			return 0, fmt.Errorf("%w: number exponent out of range", ErrInvalidPayload)
		}
		if expNeg {
			exp = -exp
		}
	}
	// The first significant digit and where the decimal point falls, counted in the digit
	// string intPart+fracPart.
	first := -1
	for k, c := range intPart {
		if c != '0' {
			first = k
			break
		}
	}
	if first < 0 {
		for k, c := range fracPart {
			if c != '0' {
				first = len(intPart) + k
				break
			}
		}
	}
	intDigits := 0
	if first >= 0 {
		intDigits = max(0, len(intPart)+exp-first)
	}
	scale := max(0, len(fracPart)-exp)
	if intDigits > maxNumericIntDigits || scale > maxNumericFracDigits {
		return 0, fmt.Errorf("%w: number out of PostgreSQL numeric range", ErrInvalidPayload)
	}
	n := max(1, intDigits)
	if scale > 0 {
		n += 1 + scale
	}
	if neg && first >= 0 {
		n++
	}
	return n, nil
}

func indexAny(b []byte, cs ...byte) int {
	for i, c := range b {
		for _, x := range cs {
			if c == x {
				return i
			}
		}
	}
	return -1
}
