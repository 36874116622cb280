package main

import "fmt"

// Targets of snapshot tracking (issue "Publish without updating each row"), as ratios measured
// in the same run.
const (
	targetSnapVsTuned    = 3.0 // snapshot relay, 1 shard, vs the tuned baseline
	targetSnapVsCeiling  = 1.5 // ... vs PostgreSQL alone marking rows (the row-marking bound)
	targetSnapCPURatio   = 0.5 // total CPU per event, snapshot vs row relay (1 shard)
	targetSnapLargeSmall = 0.9 // 2M pending vs 10k pending, snapshot relay
)

// snapshotRows are the summary rows that compare snapshot tracking with row tracking.
func snapshotRows(res *Results) []row {
	var rows []row
	s1, tuned, ceil, r1 := res.drain(keySnap1), res.drain(keyTuned), res.drain(keyCeiling), res.drain(keyRelay1)
	ok := func(ds ...*DrainResult) bool {
		for _, d := range ds {
			if d == nil || !d.Measured {
				return false
			}
		}
		return true
	}
	if ok(s1, tuned) {
		rows = append(rows, row{Measurement: "snapshot tracking, 1 shard: drain vs tuned baseline",
			Value: fmt.Sprintf("%.2fx", s1.Rate/tuned.Rate), Target: fmt.Sprintf(">= %.1fx", targetSnapVsTuned),
			Verdict: verdict(s1.Rate >= targetSnapVsTuned*tuned.Rate)})
	}
	if ok(s1, ceil) {
		rows = append(rows, row{Measurement: "snapshot tracking, 1 shard: drain vs PostgreSQL alone marking rows",
			Value: fmt.Sprintf("%.2fx", s1.Rate/ceil.Rate), Target: fmt.Sprintf(">= %.1fx", targetSnapVsCeiling),
			Verdict: verdict(s1.Rate >= targetSnapVsCeiling*ceil.Rate)})
	}
	if ok(s1, r1) && s1.CPU != nil && r1.CPU != nil {
		per := func(d *DrainResult) float64 {
			return (d.CPU.Relay + d.CPU.Postgres + d.CPU.Kafka) / float64(d.Events) * 1e6
		}
		a, b := per(s1), per(r1)
		rows = append(rows, row{Measurement: "snapshot vs row tracking, 1 shard: CPU us/event (relay + PostgreSQL + Kafka)",
			Value: fmt.Sprintf("%.1f vs %.1f (%.2fx)", a, b, a/b), Target: fmt.Sprintf("<= %.1fx", targetSnapCPURatio),
			Verdict: verdict(a <= targetSnapCPURatio*b)})
	}
	if sm, lg := res.drain(keySmall+"-snapshot"), res.drain(keyLarge+"-snapshot"); ok(sm, lg) {
		rows = append(rows, row{Measurement: "snapshot tracking: large pending backlog vs small",
			Value: fmt.Sprintf("%.2fx", lg.Rate/sm.Rate), Target: fmt.Sprintf(">= %.1fx", targetSnapLargeSmall),
			Verdict: verdict(lg.Rate >= targetSnapLargeSmall*sm.Rate)})
	}
	if x, s := res.drain(keySnap1X), res.drain(keySnap1); ok(x, s) {
		v := fmt.Sprintf("%.2fx", x.Rate/s.Rate)
		if rx, r := res.drain(keyRelay1X), res.drain(keyRelay1); ok(rx, r) {
			v += fmt.Sprintf(" (row tracking: %.2fx)", rx.Rate/r.Rate)
		}
		rows = append(rows, row{Measurement: "snapshot tracking, 1 shard: drain with an xmin held vs without",
			Value: v, Target: ">= 0.9x", Verdict: verdict(x.Rate >= 0.9*s.Rate)})
	}
	if l, s := res.Latency, res.LatencySnapshot; l != nil && s != nil && l.Measured && s.Measured {
		rows = append(rows, row{Measurement: fmt.Sprintf("latency p99 at %s events/s, snapshot vs row tracking", fmtInt(l.Rate)),
			Value: fmt.Sprintf("%.1f vs %.1f ms (%.2fx)", s.P99, l.P99, s.P99/l.P99), Target: "no worse (<= 1.0x, noise aside)",
			Verdict: verdict(s.P99 <= l.P99*1.1)})
	}
	if p, n := res.LatencySnapshot, res.LatencySnapshotNotify; p != nil && n != nil && p.Measured && n.Measured {
		rows = append(rows, row{Measurement: fmt.Sprintf("latency p99 at %s events/s, snapshot tracking: polling every %.0f ms (the default, no insert trigger) vs notified",
			fmtInt(p.Rate), p.PollMs),
			Value: fmt.Sprintf("%.1f vs %.1f ms (%.2fx)", p.P99, n.P99, p.P99/n.P99), Target: "no worse (<= 1.0x, noise aside)",
			Verdict: verdict(p.P99 <= n.P99*1.1)})
	}
	return rows
}
