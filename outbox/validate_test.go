package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// New takes the table name rules of outboxdb.ParseTable (one implementation, internal/tablename).
func TestNewRejectsInvalidTableNames(t *testing.T) {
	for _, name := range []string{"", ".", "outbox.", "Outbox", "a.b.c", "out-box", `"outbox"`, "outbox; DROP TABLE x", strings.Repeat("t", 41)} {
		if _, err := New(name); !errors.Is(err, ErrInvalidTable) || !errors.Is(err, outboxdb.ErrInvalidTable) {
			t.Errorf("New(%q) = %v, want ErrInvalidTable", name, err)
		}
	}
}

func TestNewOptions(t *testing.T) {
	w, err := New("shop.events")
	if err != nil {
		t.Fatal(err)
	}
	if w.Table() != "shop.events" || w.MaxPayloadBytes() != DefaultMaxPayloadBytes {
		t.Errorf("got table %s, limit %d", w.Table(), w.MaxPayloadBytes())
	}
	if w, err = New("outbox", WithMaxPayloadBytes(10)); err != nil || w.MaxPayloadBytes() != 10 || w.Table() != "public.outbox" {
		t.Errorf("WithMaxPayloadBytes(10): %v, %v", w, err)
	}
	if _, err := New("outbox", WithMaxPayloadBytes(0)); err == nil {
		t.Error("WithMaxPayloadBytes(0): no error")
	}
	if _, err := New("Bad.Name"); !errors.Is(err, ErrInvalidTable) {
		t.Errorf("New(Bad.Name): %v", err)
	}
}

// Headers are encoded by hand; they must decode to what was given.
func TestEncodeHeaders(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	alphabet := []rune{'a', '"', '\\', '/', '\n', '\t', '\r', '\b', '\f', 0x01, 0x1f, 0x7f, '<', '&', 'é', '😀', 0x2028, 0xfffd}
	for range 500 {
		h := map[string]string{}
		for range r.IntN(4) {
			var k, v []rune
			for range 1 + r.IntN(6) {
				k = append(k, alphabet[r.IntN(len(alphabet))])
			}
			for range r.IntN(10) {
				v = append(v, alphabet[r.IntN(len(alphabet))])
			}
			h[string(k)] = string(v)
		}
		b, err := encodeHeaders(h)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		if len(h) == 0 {
			h = map[string]string{}
		}
		if !maps.Equal(got, h) {
			t.Fatalf("encoded %q, decoded %q, want %q", b, got, h)
		}
	}
}

func TestParseUUID(t *testing.T) {
	for s, ok := range map[string]bool{
		"0191f0a4-7e5c-7cc1-9a3e-6b9d2f1c0a11":   true,
		"0191F0A4-7E5C-7CC1-9A3E-6B9D2F1C0A11":   true,
		"00000000-0000-0000-0000-000000000000":   true,
		"":                                       false,
		"0191f0a47e5c7cc19a3e6b9d2f1c0a11":       false,
		"{0191f0a4-7e5c-7cc1-9a3e-6b9d2f1c0a11}": false,
		"0191f0a4-7e5c-7cc1-9a3e-6b9d2f1c0a1g":   false,
		"0191f0a4-7e5c-7cc1-9a3e_6b9d2f1c0a11":   false,
		"0191f0a4-7e5c-7cc1-9a3e-6b9d2f1c0a1":    false,
	} {
		if _, got := parseUUID(s); got != ok {
			t.Errorf("parseUUID(%q) = %v, want %v", s, got, ok)
		}
	}
}

// payloadCase is a JSON document and what jsonb makes of it; the sizes are checked against
// PostgreSQL in TestStoredPayloadSizeMatchesPostgres.
type payloadCase struct {
	json    string
	size    int  // octet_length(json::jsonb::text); 0 when rejected
	reject  bool // jsonb rejects it
	atLeast bool // duplicate keys: size is an upper bound
}

var payloadCases = []payloadCase{
	{json: `{}`, size: 2},
	{json: `[]`, size: 2},
	{json: `{"a":1}`, size: 8},
	{json: ` {"a" : [1,2,3] , "b":{"c":null}}` + "\n", size: 34},
	{json: `{"x":true,"y":false}`, size: 23},
	{json: `"plain"`, size: 7},
	{json: `123`, size: 3},
	{json: `-0`, size: 1},
	{json: `-0.0`, size: 3},
	{json: `1.50`, size: 4},
	{json: `1e3`, size: 4},
	{json: `1E+3`, size: 4},
	{json: `1.5e-3`, size: 6},
	{json: `-1.25e1`, size: 5},
	{json: `1.50e1`, size: 4},
	{json: `0.001e3`, size: 1},
	{json: `0.00120e2`, size: 5},
	{json: `0e5`, size: 1},
	{json: `0.000e-2`, size: 7},
	{json: `123456789012345678901234567890.5`, size: 32},
	{json: `"\u00e9\/\"\\\b\f\n\r\t\u0001\u001f\u007f\u2028"`, size: 35},
	{json: `"\ud83d\ude00 é😀"`, size: 13},
	{json: `{"a":1,"a":2}`, size: 8, atLeast: true},
	{json: `1e131071`, size: 131072},
	{json: `1e-16383`, size: 16385},
	{json: `-1e-16383`, size: 16386},
	{json: `"\u0000"`, reject: true},
	{json: `{"k":"a\u0000"}`, reject: true},
	{json: `"\ud800"`, reject: true},
	{json: `"\udc00"`, reject: true},
	{json: `"\ud800x"`, reject: true},
	{json: `"\ud800\u0041"`, reject: true},
	{json: `1e131072`, reject: true},
	{json: `1e-16384`, reject: true},
	{json: `0.1e-16383`, reject: true},
	{json: `1e2000000000`, reject: true},
	{json: `1e-2000000000`, reject: true},
}

func TestStoredPayloadSize(t *testing.T) {
	for _, c := range payloadCases {
		name := c.json
		if len(name) > 40 {
			name = name[:40]
		}
		t.Run(name, func(t *testing.T) {
			if !json.Valid([]byte(c.json)) {
				t.Fatalf("test case is not valid JSON")
			}
			got, err := StoredPayloadSize([]byte(c.json))
			if c.reject {
				if !errors.Is(err, ErrInvalidPayload) {
					t.Fatalf("got %d, %v; want ErrInvalidPayload", got, err)
				}
				return
			}
			if err != nil || got != c.size && (!c.atLeast || got <= c.size) {
				t.Fatalf("got %d, %v; want %d", got, err, c.size)
			}
		})
	}
}

// randomPayloads returns JSON documents built from random values, numbers in several notations
// and strings with escapes; seeded, so a failure reproduces.
func randomPayloads(n int) []string {
	r := rand.New(rand.NewPCG(1, 2))
	runes := []rune{'a', 'z', ' ', '"', '\\', '/', '\n', '\t', 0x01, 0x1f, 0x7f, 'é', '€', '😀', 0x2028}
	var value func(depth int) string
	value = func(depth int) string {
		switch k := r.IntN(9); {
		case k == 0 && depth < 4:
			var parts []string
			for i := range r.IntN(5) {
				parts = append(parts, fmt.Sprintf("%q:%s", "k"+strconv.Itoa(i), value(depth+1)))
			}
			return "{" + strings.Join(parts, ",") + "}"
		case k == 1 && depth < 4:
			var parts []string
			for range r.IntN(5) {
				parts = append(parts, value(depth+1))
			}
			return "[" + strings.Join(parts, ", ") + "]"
		case k == 2:
			var b strings.Builder
			for range r.IntN(12) {
				b.WriteRune(runes[r.IntN(len(runes))])
			}
			s, _ := json.Marshal(b.String())
			return string(s)
		case k == 3:
			var b strings.Builder
			for range r.IntN(6) {
				fmt.Fprintf(&b, `\u%04x`, []int{0x41, 0xe9, 0x20ac, 0x2f, 0x22, 0x5c, 0x08, 0x0b, 0x1f}[r.IntN(9)])
			}
			return `"` + b.String() + `"`
		case k == 4:
			f := (r.Float64() - 0.5) * float64(r.IntN(1e6))
			return strconv.FormatFloat(f, 'e', r.IntN(8), 64)
		case k == 5:
			f := (r.Float64() - 0.5) * float64(r.IntN(1e6))
			return strconv.FormatFloat(f, 'f', r.IntN(8), 64)
		case k == 6:
			return fmt.Sprintf("%d.%de%+d", r.IntN(1000), r.IntN(1000), r.IntN(60)-30)
		case k == 7:
			return []string{"true", "false", "null", "0", "-0", "0.0"}[r.IntN(6)]
		default:
			return strconv.Itoa(r.IntN(1e9) - 5e8)
		}
	}
	out := make([]string, n)
	for i := range out {
		out[i] = value(0)
	}
	return out
}
