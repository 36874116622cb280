package main

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The record batches are matched to the records polled from them, partition by partition, in
// order: a batch counts when it holds a measured event, with the measured events it holds.
func TestCountBatches(t *testing.T) {
	measured := func(seq int) bool { return seq >= 10 }
	cases := map[string]struct {
		sizes, seqs     map[int32][]int
		batches, events int
	}{
		"warm-up batches left out": {
			sizes:   map[int32][]int{0: {2, 3, 1}},
			seqs:    map[int32][]int{0: {1, 2, 10, 11, 12, 13}},
			batches: 2, events: 4,
		},
		"a batch straddling the warm-up counts its measured events": {
			sizes:   map[int32][]int{0: {3}, 1: {1, 1}},
			seqs:    map[int32][]int{0: {8, 9, 10}, 1: {14, 15}},
			batches: 3, events: 3,
		},
		"foreign records and unpolled batches": {
			sizes:   map[int32][]int{2: {2, 4}},
			seqs:    map[int32][]int{2: {-1, 20}},
			batches: 1, events: 1,
		},
		"nothing read": {sizes: map[int32][]int{}, seqs: map[int32][]int{0: {10}}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			b, n := countBatches(c.sizes, c.seqs, measured)
			if b != c.batches || n != c.events {
				t.Fatalf("countBatches = %d batches, %d events; want %d, %d", b, n, c.batches, c.events)
			}
		})
	}
	// The hook and the consumer fill the counter.
	bc := newBatchCounter()
	for _, seq := range []int{9, 10, 11} {
		bc.polled(0, seq)
	}
	for _, n := range []int{1, 0, 2} { // a batch that could not be decoded holds no record
		bc.OnFetchBatchRead(kgo.BrokerMetadata{}, "t", 0, kgo.FetchBatchMetrics{NumRecords: n})
	}
	if b, n := bc.count(measured); b != 1 || n != 2 {
		t.Fatalf("count = %d, %d", b, n)
	}
}

// The counts per event: the writers' transactions are taken off the ids assigned, and what was
// not counted says so.
func TestEventCost(t *testing.T) {
	a := pgCounters{statements: 100, all: 500, xmax: 1000}
	b := pgCounters{statements: 400, all: 2000, xmax: 2150}
	c := costOf(a, b, 1000, 10)
	if c.Statements != 300 || c.Xids != 150 || c.Events != 1000 {
		t.Fatalf("costOf = %+v", c)
	}
	if v, ok := c.StatementsPerEvent(); !ok || v != 0.3 {
		t.Fatalf("statements per event %v %v", v, ok)
	}
	if v, ok := c.XidsPerEvent(); !ok || v != 0.15 {
		t.Fatalf("xids per event %v %v", v, ok)
	}
	c.RecordBatches, c.BatchedEvents = 250, 1000
	if v, ok := c.EventsPerBatch(); !ok || v != 4 {
		t.Fatalf("events per batch %v %v", v, ok)
	}
	if got := costCells(&c); got != "0.30 / 0.150 / 0.250 (4.0)" {
		t.Fatalf("costCells = %q", got)
	}
	// Entries evicted in between: the statements are not known.
	if ev := costOf(pgCounters{statements: 1, dealloc: 1}, pgCounters{statements: 9, dealloc: 2}, 4, 1); ev.Statements != -1 {
		t.Fatalf("evicted: %+v", ev)
	}
	// Without pg_stat_statements, and without an observer.
	none := costOf(pgCounters{statements: -1, xmax: 5}, pgCounters{statements: -1, xmax: 7}, 2, 1)
	if _, ok := none.StatementsPerEvent(); ok || none.Xids != 0 {
		t.Fatalf("without pg_stat_statements: %+v", none)
	}
	unobserved := &EventCost{Statements: -1, Xids: -1}
	if got := costCells(unobserved); got != "- / - / -" {
		t.Fatalf("unobserved: %q", got)
	}
	if got := costCells(nil); got != "- / - / -" {
		t.Fatalf("nil: %q", got)
	}
	if !strings.Contains(c.summary(), "0.30 statements, 0.150 transaction ids per event, 4.0 events per record batch") {
		t.Fatalf("summary %q", c.summary())
	}
}

// A low rate runs long enough for its events; the others run latencyDuration; the count scales.
func TestLatencyRunDuration(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.latencyEvents != 2000 {
		t.Fatalf("latencyEvents %d", c.latencyEvents)
	}
	for rate, want := range map[float64]time.Duration{2000: 25 * time.Second, 500: 25 * time.Second, 50: 43 * time.Second} {
		if got := c.latencyRunDuration(rate); got != want {
			t.Errorf("at %.0f/s: %s, want %s", rate, got, want)
		}
	}
	c, _ = parseFlags([]string{"-scale", "0.2"})
	if c.latencyEvents != 400 || c.latencyRunDuration(50) != 10*time.Second || c.latencyRunDuration(2000) != 6*time.Second {
		t.Fatalf("scale 0.2: %d events, %s at 50/s", c.latencyEvents, c.latencyRunDuration(50))
	}
	c, _ = parseFlags([]string{"-latency-events", "100"})
	if c.latencyRunDuration(50) != 25*time.Second {
		t.Fatalf("-latency-events 100: %s", c.latencyRunDuration(50))
	}
}

// The cost table has the floor beside every rate, and a row per publisher and wake-up.
func TestCostReport(t *testing.T) {
	cost := &EventCost{Events: 100, Statements: 250, Xids: 50, RecordBatches: 20, BatchedEvents: 100}
	run := func(rate float64) *LatencyResult {
		return &LatencyResult{Rate: rate, P50: 3, P99: 9, Measured: true, Cost: cost, Achieved: rate,
			CPU: &CPUUsage{Wall: 1, Relay: rate * 10e-6, Postgres: rate * 20e-6, Kafka: rate * 5e-6}}
	}
	d := &DebeziumResult{Rates: []float64{2000, 50},
		Floor: []*LatencyResult{{Rate: 2000, P50: 1, P99: 4, Measured: true}, {Rate: 50, P50: 1.5, P99: 5, Measured: true}},
		Peers: []*PeerResult{
			{Key: peerDebezium, Name: "Debezium", Latency: []*LatencyResult{run(2000), run(50)}},
			{Key: peerRelayRow, Name: "relay, row tracking", Latency: []*LatencyResult{run(2000), {Rate: 50, Err: "boom"}},
				LatencyNotify: []*LatencyResult{run(2000), run(50)}},
		}}
	var b strings.Builder
	writeDebeziumCost(&b, d)
	out := b.String()
	for _, want := range []string{
		"| 2,000/s | the floor (no publisher) | 1.0 / 4.0 ms | 1.0 / 4.0 ms |",
		"| 50/s | Debezium | 3.0 / 9.0 ms | 1.5 / 5.0 ms | 10 / 20 (0) / 5 | 2.50 | 0.500 | 0.200 (5.0) |",
		"| 50/s | relay, row tracking, polling | failed: boom | 1.5 / 5.0 ms |",
		"| 50/s | relay, row tracking, notified | 3.0 / 9.0 ms |",
		"pg_stat_statements",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	writeDebeziumCost(&b, &DebeziumResult{Rates: []float64{2000}})
	if b.Len() != 0 {
		t.Fatalf("nothing measured, yet: %s", b.String())
	}
}
