package main

import (
	"fmt"
	"strings"
)

// Exactly-once delivery's targets (issue 31), judged in the side by side: its drain against the
// at-least-once relay's (both snapshot tracking) and its p99 at the top rate against Debezium's
// at-least-once p99, in the same run.
const (
	goalEOSDrainVsALO = 0.7 // the exactly-once drain at least this fraction of the at-least-once one
	eosP99Rate        = 2000
)

// eosRatio is one exactly-once figure against its baseline: better above 1 is better for
// exactly-once (drain: its rate over the baseline's; latency: the baseline's p99 over its).
type eosRatio struct {
	what, eos, base string
	better, goal    float64 // goal 0: reported, not judged
}

func eosRatios(d *DebeziumResult) []eosRatio {
	e, a, z := d.peer(peerRelayEOS), d.peer(peerRelaySnap), d.peer(peerDebezium)
	if e == nil {
		return nil
	}
	var out []eosRatio
	if a != nil && e.Drain != nil && a.Drain != nil && a.Drain.Rate > 0 {
		out = append(out, eosRatio{what: fmt.Sprintf("drain %s, start to last event, against at-least-once", count(d.Backlog)),
			eos: fmtInt(e.Drain.Rate) + "/s", base: fmtInt(a.Drain.Rate) + "/s", better: e.Drain.Rate / a.Drain.Rate, goal: goalEOSDrainVsALO})
	}
	for _, lr := range e.Latency {
		for _, base := range []*PeerResult{z, a} {
			if base == nil {
				continue
			}
			// The windows at this rate, its own run's and the interleaved rounds' (rounds.go),
			// paired by round; judged on the median of the pairs' ratios.
			ew, bw := windowsAt(e.Latency, e.Rounds, lr.Rate), windowsAt(base.Latency, base.Rounds, lr.Rate)
			ratios, bp, ep := pairedRatios(bw, ew, func(l *LatencyResult) float64 { return l.P99 })
			if len(ratios) == 0 {
				continue
			}
			goal := 0.0
			if base == z && lr.Rate == eosP99Rate {
				goal = 1
			}
			what := fmt.Sprintf("latency p99 at %s events/s, against %s", fmtInt(lr.Rate), base.Name)
			if len(ratios) > 1 {
				what += fmt.Sprintf(" (medians of %d paired windows)", len(ratios))
			}
			out = append(out, eosRatio{what: what, eos: fmt.Sprintf("%.1f ms", median(ep)), base: fmt.Sprintf("%.1f ms", median(bp)),
				better: median(ratios), goal: goal})
		}
	}
	return out
}

// eosRows are the result table's rows of exactly-once's targets.
func eosRows(d *DebeziumResult) []row {
	var rows []row
	for _, r := range eosRatios(d) {
		x := row{Measurement: "relay, exactly-once: " + r.what, Value: fmt.Sprintf("%s vs %s: %.2fx", r.eos, r.base, r.better)}
		if r.goal > 0 {
			x.Target = fmt.Sprintf(">= %.1fx", r.goal)
			if r.goal == 1 {
				x.Target = "below the baseline's"
			}
			x.Verdict = verdict(r.better >= r.goal)
		}
		rows = append(rows, x)
	}
	return rows
}

// writeEOSVerdict states exactly-once's targets, met or not, and what a transaction per batch
// costs by process at each rate, against the at-least-once relay.
func writeEOSVerdict(b *strings.Builder, d *DebeziumResult) {
	rs := eosRatios(d)
	if len(rs) == 0 {
		return
	}
	var parts []string
	for _, r := range rs {
		s := fmt.Sprintf("%s %.2fx (%s against %s)", r.what, r.better, r.eos, r.base)
		if r.goal > 0 {
			s += fmt.Sprintf(" (goal %.1fx: %s)", r.goal, map[bool]string{true: "met", false: "**missed**"}[r.better >= r.goal])
		}
		parts = append(parts, s)
	}
	fmt.Fprintf(b, "**Exactly-once against at-least-once and Debezium** (higher is better for exactly-once; each batch one Kafka "+
		"transaction with the shard's cursor record, read by the independent consumers with `isolation.level=read_committed`): %s.",
		strings.Join(parts, "; "))
	e, a := d.peer(peerRelayEOS), d.peer(peerRelaySnap)
	if e != nil && a != nil {
		for i, lr := range e.Latency {
			if i >= len(a.Latency) || lr.CPU == nil || a.Latency[i].CPU == nil || !lr.Measured || !a.Latency[i].Measured {
				continue
			}
			ec, ac := perEventCPU(lr), perEventCPU(a.Latency[i])
			if ec == nil || ac == nil {
				continue
			}
			fmt.Fprintf(b, " At %s events/s, CPU µs per event exactly-once / at-least-once: publisher %.0f / %.0f, its PostgreSQL backends %.0f / %.0f, broker %.0f / %.0f.",
				fmtInt(lr.Rate), ec.Relay, ac.Relay, ec.PostgresRelay, ac.PostgresRelay, ec.Kafka, ac.Kafka)
		}
	}
	fmt.Fprintf(b, "\n\n")
}

// perEventCPU is l's CPU per event, in µs, by process (nil when not measured).
func perEventCPU(l *LatencyResult) *CPUUsage {
	if l.CPU == nil || l.CPU.Wall <= 0 || l.Achieved <= 0 {
		return nil
	}
	n := l.Achieved * l.CPU.Wall / 1e6
	th := map[string]float64{}
	for k, v := range l.CPU.KafkaThreads {
		th[k] = v / n
	}
	return &CPUUsage{Relay: l.CPU.Relay / n, Postgres: l.CPU.Postgres / n, PostgresRelay: l.CPU.PostgresRelay / n, Kafka: l.CPU.Kafka / n, KafkaThreads: th}
}
