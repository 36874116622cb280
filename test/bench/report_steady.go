package main

import (
	"fmt"
	"strings"
)

// The goals of issue 28 at steady rates, each a ratio to Debezium's figure in the same run (lower
// is better for the relay): the relay's publisher side (its process, its PostgreSQL backends and
// the broker) at most half Debezium's CPU per event, its backends at most the walsender's, the
// broker at most what it spends for Debezium, and the p99 below Debezium's.
var steadyGoals = []steadyGoal{
	{what: "publisher side", limit: 0.5, of: func(c *CPUUsage, _ *LatencyResult) float64 { return c.Relay + c.PostgresRelay + c.Kafka }},
	{what: "its PostgreSQL backends", limit: 1, of: func(c *CPUUsage, _ *LatencyResult) float64 { return c.PostgresRelay }},
	{what: "broker", limit: 1, of: func(c *CPUUsage, _ *LatencyResult) float64 { return c.Kafka }},
	{what: "p99", limit: 1, strict: true, of: func(_ *CPUUsage, l *LatencyResult) float64 { return l.P99 }},
}

// steadyGoalRates are the rates the goals name.
var steadyGoalRates = []float64{2000, 500}

type steadyGoal struct {
	what   string
	limit  float64
	strict bool // below the limit, not at most
	of     func(perEvent *CPUUsage, l *LatencyResult) float64
}

func (g steadyGoal) met(ratio float64) bool {
	if g.strict {
		return ratio < g.limit
	}
	return ratio <= g.limit
}

// steadyVariant is one relay as the goals judge it: a peer, polling or notified.
type steadyVariant struct {
	p      *PeerResult
	notify bool
}

func (v steadyVariant) name() string {
	switch {
	case v.notify:
		return v.p.Name + ", notified"
	case v.isDefault():
		return v.p.Name + ", polling (the default)"
	}
	return v.p.Name + ", polling"
}

// isDefault reports whether v is what a new OutboxRelay runs (snapshot tracking, polling): the
// goals are the default settings'; the others are reported beside them.
func (v steadyVariant) isDefault() bool { return v.p.Key == peerRelaySnap && !v.notify }

// windows are v's measured windows at rate, in order: its own run's, then each round's; nil
// where a window failed (so that the i-th pairs with Debezium's i-th).
func windowsAt(own, rounds []*LatencyResult, rate float64) []*LatencyResult {
	var out []*LatencyResult
	for i, l := range append([]*LatencyResult{runAt(own, rate)}, rounds...) {
		switch {
		case i > 0 && l.Rate != rate: // a round at another rate
		case l == nil || !l.Measured || perEventCPU(l) == nil:
			out = append(out, nil) // kept, so that the i-th window pairs with Debezium's i-th
		default:
			out = append(out, l)
		}
	}
	return out
}

// pairedRatios pairs the windows of num and den by index (windowsAt's order), leaving out a pair
// with a window missing or f(den) not positive, and returns f(num)/f(den) of each pair with the
// figures themselves.
func pairedRatios(num, den []*LatencyResult, f func(*LatencyResult) float64) (ratios, nums, dens []float64) {
	for i := range min(len(num), len(den)) {
		if num[i] == nil || den[i] == nil {
			continue
		}
		a, b := f(num[i]), f(den[i])
		if b <= 0 {
			continue
		}
		ratios, nums, dens = append(ratios, a/b), append(nums, a), append(dens, b)
	}
	return ratios, nums, dens
}

func (v steadyVariant) windows(rate float64) []*LatencyResult {
	if v.notify {
		return windowsAt(v.p.LatencyNotify, v.p.RoundsNotify, rate)
	}
	return windowsAt(v.p.Latency, v.p.Rounds, rate)
}

// steadyResult is one goal of one relay at one rate: the ratio in each window paired with
// Debezium's, and their median.
type steadyResult struct {
	goal           steadyGoal
	relay, peer    []float64 // the paired windows' figures
	ratios         []float64
	median         float64
	relayMedian    float64
	debeziumMedian float64
}

// steadyResults judges v at rate against Debezium (z); nil when no window pairs.
func steadyResults(z *PeerResult, v steadyVariant, rate float64) []steadyResult {
	zw, vw := windowsAt(z.Latency, z.Rounds, rate), v.windows(rate)
	var out []steadyResult
	for _, g := range steadyGoals {
		r := steadyResult{goal: g}
		r.ratios, r.relay, r.peer = pairedRatios(vw, zw, func(l *LatencyResult) float64 { return g.of(perEventCPU(l), l) })
		if len(r.ratios) == 0 {
			return nil
		}
		r.median, r.relayMedian, r.debeziumMedian = median(r.ratios), median(r.relay), median(r.peer)
		out = append(out, r)
	}
	return out
}

// steadyVariants are the relays the goals judge: the at-least-once relays, polling and notified.
func steadyVariants(d *DebeziumResult) []steadyVariant {
	var out []steadyVariant
	for _, p := range d.Peers {
		if p.Key == peerRelayRow || p.Key == peerRelaySnap {
			out = append(out, steadyVariant{p: p}, steadyVariant{p: p, notify: true})
		}
	}
	return out
}

// steadyRows are the result table's rows: one per relay and rate, every goal's median ratio.
func steadyRows(d *DebeziumResult) []row {
	z := d.peer(peerDebezium)
	if z == nil {
		return nil
	}
	var rows []row
	for _, rate := range steadyGoalRates {
		for _, v := range steadyVariants(d) {
			rs := steadyResults(z, v, rate)
			if rs == nil {
				continue
			}
			var vals, targets []string
			ok := true
			for _, r := range rs {
				vals = append(vals, fmt.Sprintf("%.2fx", r.median))
				op := "<="
				if r.goal.strict {
					op = "<"
				}
				targets = append(targets, fmt.Sprintf("%s %gx", op, r.goal.limit))
				ok = ok && r.goal.met(r.median)
			}
			x := row{
				Measurement: fmt.Sprintf("%s at %s events/s against Debezium, median of %d paired windows: publisher side / its PostgreSQL backends / broker CPU per event / p99",
					v.name(), fmtInt(rate), len(rs[0].ratios)),
				Value: strings.Join(vals, " / ")}
			if v.isDefault() {
				x.Target, x.Verdict = strings.Join(targets, " / "), verdict(ok)
			}
			rows = append(rows, x)
		}
	}
	return rows
}

// writeSteadyGoals writes the goals at steady rates, each window's figures beside the median.
func writeSteadyGoals(b *strings.Builder, d *DebeziumResult) {
	z := d.peer(peerDebezium)
	if z == nil {
		return
	}
	var lines []string
	for _, rate := range steadyGoalRates {
		for _, v := range steadyVariants(d) {
			for _, r := range steadyResults(z, v, rate) {
				unit, f := "µs", "%.0f"
				if r.goal.what == "p99" {
					unit, f = "ms", "%.1f"
				}
				var each []string
				for i := range r.ratios {
					each = append(each, fmt.Sprintf(f+" vs "+f+" (%.2fx)", r.relay[i], r.peer[i], r.ratios[i]))
				}
				op := "at most"
				if r.goal.strict {
					op = "below"
				}
				judged := fmt.Sprintf("%s %gx: %s", op, r.goal.limit, verdictWord(r.goal.met(r.median)))
				if !v.isDefault() {
					judged = fmt.Sprintf("(%s %gx: %s; not the default)", op, r.goal.limit, map[bool]string{true: "within", false: "outside"}[r.goal.met(r.median)])
				}
				lines = append(lines, fmt.Sprintf("| %s/s | %s | %s | %s | "+f+" vs "+f+" %s | **%.2fx** | %s |",
					fmtInt(rate), mdEscape(v.name()), r.goal.what, mdEscape(strings.Join(each, "; ")),
					r.relayMedian, r.debeziumMedian, unit, r.median, judged))
			}
		}
	}
	if len(lines) == 0 {
		return
	}
	rounds := "each publisher's own run only (no interleaved rounds)"
	if d.Rounds > 0 {
		rounds = fmt.Sprintf("each publisher's own run and %d interleaved rounds at %s events/s (every publisher once per round, "+
			"the order reversed every other round; each relay started for its window; Debezium started once before the rounds, "+
			"and kept running through them, once its walsender had read the WAL written while it was stopped, a probe had reached "+
			"the topic and an unrecorded window at the first rate had warmed it up)", d.Rounds, joinRates(d.RoundRates))
	}
	fmt.Fprintf(b, "### The goals at steady rates (issue 28)\n\n"+
		"Each relay against Debezium, CPU per event by process as in the cost table below (publisher side: the publisher's process, "+
		"its PostgreSQL backends and the broker, JIT included), the goals judged for the default settings (snapshot tracking, polling) and the other relays reported beside them. Windows: %s. Each window's ratio is "+
		"taken against Debezium's window of the same round; the goal is judged on the median of those ratios.\n\n", rounds)
	fmt.Fprintf(b, "| rate | relay | measure | each window, relay vs Debezium (ratio) | medians | median ratio | goal |\n|---:|---|---|---|---:|---:|---|\n")
	fmt.Fprintf(b, "%s\n\n", strings.Join(lines, "\n"))
}

func verdictWord(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

func joinRates(rates []float64) string {
	var s []string
	for _, r := range rates {
		s = append(s, fmtInt(r))
	}
	return strings.Join(s, ", ")
}
