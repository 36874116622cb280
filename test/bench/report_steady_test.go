package main

import (
	"strings"
	"testing"
)

// The steady-rate goals pair each relay window with Debezium's of the same round and judge the
// median ratio; a failed window drops its pair, not the pairing of the others.
func TestSteadyGoals(t *testing.T) {
	// run is a window at rate of one second with relay, backends and broker µs per event and p99.
	run := func(rate, relay, backends, broker, p99 float64) *LatencyResult {
		return &LatencyResult{Rate: rate, Achieved: rate, P99: p99, Measured: true,
			CPU: &CPUUsage{Wall: 1, Relay: rate * relay * 1e-6, Postgres: rate * backends * 2e-6, PostgresRelay: rate * backends * 1e-6, Kafka: rate * broker * 1e-6}}
	}
	z := &PeerResult{Key: peerDebezium, Name: "Debezium",
		Latency: []*LatencyResult{run(2000, 150, 50, 50, 19), run(500, 400, 90, 150, 13)},
		Rounds:  []*LatencyResult{run(500, 400, 90, 150, 13), run(500, 400, 90, 150, 13)}}
	snap := &PeerResult{Key: peerRelaySnap, Name: "relay, snapshot tracking",
		Latency: []*LatencyResult{run(2000, 30, 28, 50, 12), run(500, 100, 100, 200, 10)},
		// Round 1 failed; round 2 is cheap: the median of the pairs (own, round 2) is judged.
		Rounds:        []*LatencyResult{{Rate: 500, Err: "boom"}, run(500, 60, 70, 120, 10)},
		LatencyNotify: []*LatencyResult{run(2000, 30, 28, 40, 11)},
	}
	d := &DebeziumResult{Rates: []float64{2000, 500}, Rounds: 2, RoundRates: []float64{500},
		Peers: []*PeerResult{z, {Key: peerRelayRow, Name: "relay, row tracking", Err: "not measured"}, snap}}

	rs := steadyResults(z, steadyVariant{p: snap}, 500)
	if len(rs) != len(steadyGoals) || len(rs[0].ratios) != 2 {
		t.Fatalf("results at 500/s: %+v", rs)
	}
	// publisher side: own 400/640 = 0.625, round 2 250/640 = 0.39: median 0.508.
	if got := rs[0].median; got < 0.50 || got > 0.51 {
		t.Errorf("publisher side median %.3f, want 0.508", got)
	}
	if rs[0].goal.met(rs[0].median) {
		t.Error("0.508x met a goal of at most 0.5x")
	}
	if got := rs[3].median; got != 10.0/13 || !rs[3].goal.met(got) {
		t.Errorf("p99 median %.3f", got)
	}
	if steadyResults(z, steadyVariant{p: snap, notify: true}, 500) != nil {
		t.Error("no notified window at 500/s, yet a result")
	}

	rows := steadyRows(d)
	if len(rows) != 3 {
		t.Fatalf("rows %+v", rows)
	}
	if r := rows[0]; !strings.Contains(r.Measurement, "snapshot tracking, polling (the default) at 2,000 events/s") || r.Value != "0.43x / 0.56x / 1.00x / 0.63x" || r.Verdict != "met" {
		t.Errorf("2,000/s polling: %+v", r)
	}
	if r := rows[1]; !strings.Contains(r.Measurement, "notified at 2,000") || r.Value != "0.39x / 0.56x / 0.80x / 0.58x" || r.Verdict != "" || r.Target != "" {
		t.Errorf("2,000/s notified: %+v", r)
	}
	if r := rows[2]; !strings.Contains(r.Measurement, "median of 2 paired windows") || r.Verdict != "MISSED" {
		t.Errorf("500/s: %+v", r)
	}

	var b strings.Builder
	writeSteadyGoals(&b, d)
	out := b.String()
	for _, want := range []string{
		"2 interleaved rounds at 500 events/s",
		"| 500/s | relay, snapshot tracking, polling (the default) | publisher side | 400 vs 640 (0.62x); 250 vs 640 (0.39x) | 325 vs 640 µs | **0.51x** | at most 0.5x: **missed** |",
		"| 500/s | relay, snapshot tracking, polling (the default) | p99 | 10.0 vs 13.0 (0.77x); 10.0 vs 13.0 (0.77x) | 10.0 vs 13.0 ms | **0.77x** | below 1x: met |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// Exactly-once's p99 goal is judged like the steady-rate goals: on the median of its windows
// paired by round with Debezium's.
func TestEOSRatiosMedian(t *testing.T) {
	win := func(rate, p99 float64) *LatencyResult {
		return &LatencyResult{Rate: rate, Achieved: rate, P99: p99, Measured: true, CPU: &CPUUsage{Wall: 1, Relay: 1, Kafka: 1}}
	}
	d := &DebeziumResult{Peers: []*PeerResult{
		{Key: peerDebezium, Latency: []*LatencyResult{win(2000, 19)}, Rounds: []*LatencyResult{win(2000, 20), win(500, 13), win(2000, 26)}},
		{Key: peerRelaySnap, Latency: []*LatencyResult{win(2000, 11)}},
		// Its own window lost (38 vs 19); the rounds' two won: the median pair wins.
		{Key: peerRelayEOS, Latency: []*LatencyResult{win(2000, 38)}, Rounds: []*LatencyResult{win(2000, 15), win(500, 12), win(2000, 22)}},
	}}
	var got *eosRatio
	for _, r := range eosRatios(d) {
		if r.goal == 1 {
			got = &r
		}
	}
	if got == nil || !strings.Contains(got.what, "medians of 3 paired windows") || got.eos != "22.0 ms" || got.base != "20.0 ms" {
		t.Fatalf("p99 goal: %+v", got)
	}
	if want := 26.0 / 22; got.better != want {
		t.Errorf("median ratio %.3f, want %.3f (the pairs: 0.50, 1.33, 1.18)", got.better, want)
	}
}
