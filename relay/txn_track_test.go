package relay

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The records of an exactly-once transaction are the messages it carries, in order, each with
// its own key, value, time and headers (held in shared slices: appending to one record's headers
// must not reach the next record's).
func TestKgoRecords(t *testing.T) {
	at := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	msgs := []kafka.Message{
		{Topic: "orders", Key: []byte("a"), Value: []byte("1"), Time: at, Headers: []kafka.Header{{Key: "event_id", Value: []byte("e1")}, {Key: "x", Value: []byte("y")}}},
		{Topic: "orders", Key: []byte("b"), Value: []byte("2"), Time: at},
		{Topic: "audit", Key: []byte("c"), Value: []byte("3"), Time: at.Add(time.Second), Headers: []kafka.Header{{Key: "event_id", Value: []byte("e3")}}},
	}
	recs := kgoRecords(msgs, []int{0, 2})
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	for i, k := range []int{0, 2} {
		r, m := recs[i], msgs[k]
		if r.Topic != m.Topic || string(r.Key) != string(m.Key) || string(r.Value) != string(m.Value) || !r.Timestamp.Equal(m.Time) {
			t.Errorf("record %d = %s %s %s %s, want message %d", i, r.Topic, r.Key, r.Value, r.Timestamp, k)
		}
		if len(r.Headers) != len(m.Headers) {
			t.Fatalf("record %d: %d headers, want %d", i, len(r.Headers), len(m.Headers))
		}
		for j, h := range m.Headers {
			if r.Headers[j].Key != h.Key || string(r.Headers[j].Value) != string(h.Value) {
				t.Errorf("record %d header %d = %s=%s, want %s=%s", i, j, r.Headers[j].Key, r.Headers[j].Value, h.Key, h.Value)
			}
		}
	}
	recs[0].Headers = append(recs[0].Headers, kgo.RecordHeader{Key: "added"})
	if recs[1].Headers[0].Key != "event_id" {
		t.Errorf("appending to the first record's headers changed the next record's: %v", recs[1].Headers)
	}
	if got := kgoRecords(msgs, nil); len(got) != 0 {
		t.Errorf("no index: %d records", len(got))
	}
}
