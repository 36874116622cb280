package relay

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/segmentio/kafka-go"
)

func headerMap(hs []kafka.Header) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		if _, dup := m[h.Key]; dup {
			m[h.Key+"#dup"] = string(h.Value)
			continue
		}
		m[h.Key] = string(h.Value)
	}
	return m
}

func TestAppendRowHeaders(t *testing.T) {
	tests := map[string]struct {
		raw  string
		want map[string]string
	}{
		"empty":                 {raw: `{}`, want: map[string]string{}},
		"empty with spaces":     {raw: ` { } `, want: map[string]string{}},
		"as jsonb renders":      {raw: `{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "correlationId": "c-1"}`, want: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "correlationId": "c-1"}},
		"compact":               {raw: `{"a":"1","b":"2"}`, want: map[string]string{"a": "1", "b": "2"}},
		"escapes":               {raw: `{"q\"k": "line\nbreak \"quoted\" \\ \u00e9 \ud83d\ude80"}`, want: map[string]string{`q"k`: "line\nbreak \"quoted\" \\ é 🚀"}},
		"unicode":               {raw: `{"ключ": "значение"}`, want: map[string]string{"ключ": "значение"}},
		"empty value":           {raw: `{"a": ""}`, want: map[string]string{"a": ""}},
		"non-string values":     {raw: `{"n": 3, "f": 1.5e3, "t": true, "o": {"x": [1, "}"]}, "arr": [1, 2]}`, want: map[string]string{"n": "3", "f": "1.5e3", "t": "true", "o": `{"x": [1, "}"]}`, "arr": "[1, 2]"}},
		"null skipped":          {raw: `{"a": null, "b": "x"}`, want: map[string]string{"b": "x"}},
		"reserved keys dropped": {raw: `{"event_id": "forged", "event_type": "x", "aggregate_type": "x", "aggregate_id": "x", "error": "x", "original_topic": "x", "outbox_replay": "7", "ok": "1"}`, want: map[string]string{"ok": "1"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			keys := headerKeys{}
			got, err := appendRowHeaders(nil, []byte(tc.raw), keys)
			if err != nil {
				t.Fatal(err)
			}
			if m := headerMap(got); !reflect.DeepEqual(m, tc.want) {
				t.Errorf("got %q, want %q", m, tc.want)
			}
		})
	}
}

func TestAppendRowHeadersAgreesWithEncodingJSON(t *testing.T) {
	for _, raw := range []string{
		`{"a": "b"}`,
		`{"x": "\t\r\n\b\f\/"}`,
		`{"k1": "v1", "k2": "v,2", "k3": "v}3", "k4": "v:4"}`,
		`{"\u0041": "\u0042"}`,
	} {
		var want map[string]string
		if err := json.Unmarshal([]byte(raw), &want); err != nil {
			t.Fatal(err)
		}
		got, err := appendRowHeaders(nil, []byte(raw), headerKeys{})
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if m := headerMap(got); !reflect.DeepEqual(m, want) {
			t.Errorf("%s: got %q, encoding/json says %q", raw, m, want)
		}
	}
}

func TestAppendRowHeadersMalformed(t *testing.T) {
	for _, raw := range []string{``, `[]`, `"s"`, `{`, `{"a"}`, `{"a": }`, `{"a": "b",}`, `{"a": "b" "c": "d"}`, `{"a": "b"} x`, `{"a": "unterminated}`, `{a: "b"}`} {
		if got, err := appendRowHeaders(nil, []byte(raw), headerKeys{}); err == nil {
			t.Errorf("%q: no error, got %v", raw, got)
		}
	}
}

func TestAppendEventHeaders(t *testing.T) {
	r := &row{
		eventID:   []byte("3f2504e0-4f89-11d3-9a0c-0305e82c3301"),
		eventType: []byte("OrderPlaced"),
		aggType:   []byte("order"),
		aggID:     []byte("o-42"),
		headers:   []byte(`{"traceparent": "00-abc-def-01", "correlationId": "corr-7", "event_id": "forged"}`),
	}
	got, err := appendEventHeaders(nil, r, headerKeys{})
	if err != nil {
		t.Fatal(err)
	}
	want := []kafka.Header{
		{Key: "event_id", Value: []byte("3f2504e0-4f89-11d3-9a0c-0305e82c3301")},
		{Key: "event_type", Value: []byte("OrderPlaced")},
		{Key: "aggregate_type", Value: []byte("order")},
		{Key: "aggregate_id", Value: []byte("o-42")},
		{Key: "traceparent", Value: []byte("00-abc-def-01")},
		{Key: "correlationId", Value: []byte("corr-7")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q\nwant %q", headerMap(got), headerMap(want))
	}
}

func TestHeaderKeysIntern(t *testing.T) {
	keys := headerKeys{}
	a := keys.intern([]byte("traceparent"))
	allocs := testing.AllocsPerRun(100, func() {
		if keys.intern([]byte("traceparent")) != a {
			t.Fatal("interned key changed")
		}
	})
	if allocs != 0 {
		t.Errorf("interning a known key allocates %.0f times", allocs)
	}
}

func TestMessageSizeBoundsKafkaGo(t *testing.T) {
	// messageSize must never be below kafka-go's own count, or a call could be split.
	hs := []kafka.Header{{Key: "event_id", Value: make([]byte, 36)}, {Key: "k", Value: make([]byte, 300)}}
	key, value := make([]byte, 20), make([]byte, 1000)
	kafkaGo := 4 + 1 + 1 + (4 + len(key)) + (4 + len(value)) + 8 // Message.size
	kafkaGo += 5                                                 // varint of the header count, at most
	for _, h := range hs {
		kafkaGo += 5 + len(h.Key) + 5 + len(h.Value)
	}
	if got := messageSize(key, value, hs); got < kafkaGo {
		t.Errorf("messageSize = %d, below kafka-go's %d", got, kafkaGo)
	}
}
