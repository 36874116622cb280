package main

import (
	"fmt"
	"strings"
	"time"
)

// idleTarget states the idle scenario's target in the report.
var idleTarget = fmt.Sprintf("%d idle shards cost PostgreSQL under %.0f statements/s and under %.0f%% of a core in total (issue 28)",
	idleTargetShards, targetIdleStmtsSec, targetIdlePGPct)

// idleScale is the factor from the shards measured to idleTargetShards (1 at full size).
func idleScale(r *IdleResult) float64 {
	if r.relays() <= 0 {
		return 1
	}
	return float64(idleTargetShards) / float64(r.relays())
}

// idleMet says whether an idle window meets the target, scaled to idleTargetShards.
func idleMet(r *IdleResult, c *IdleCost) bool {
	f := idleScale(r)
	return c.StatementsPerSec()*f < targetIdleStmtsSec && c.PostgresPct()*f < targetIdlePGPct
}

// idleScaled is v with, when fewer than idleTargetShards were measured, v scaled to them.
func idleScaled(r *IdleResult, v float64, format string) string {
	s := fmt.Sprintf(format, v)
	if f := idleScale(r); f != 1 {
		s += fmt.Sprintf(" (%s per %d shards)", fmt.Sprintf(format, v*f), idleTargetShards)
	}
	return s
}

// idleShardRows are the result table's lines: each mode's idle cost against the target.
func idleShardRows(res *Results) []row {
	r := res.Idle
	if r == nil {
		return nil
	}
	if r.Err != "" && len(r.Runs) == 0 {
		return []row{{Measurement: "idle shards", Value: "failed: " + firstLine(r.Err, 60)}}
	}
	var rows []row
	for _, run := range r.Runs {
		x := row{Measurement: fmt.Sprintf("%d idle shards, %s: PostgreSQL CPU / the relays' statements", r.relays(), run.Name)}
		if run.Idle == nil {
			x.Value = "failed: " + firstLine(run.Err, 60)
			rows = append(rows, x)
			continue
		}
		f := idleScale(r)
		x.Value = fmt.Sprintf("%.2f%% of a core / %.1f/s", run.Idle.PostgresPct(), run.Idle.StatementsPerSec())
		if f != 1 {
			x.Value += fmt.Sprintf(" (per %d shards %.2f%% / %.0f/s)", idleTargetShards, run.Idle.PostgresPct()*f, run.Idle.StatementsPerSec()*f)
		}
		x.Target = fmt.Sprintf("< %.0f%% / < %.0f/s per %d shards", targetIdlePGPct, targetIdleStmtsSec, idleTargetShards)
		x.Verdict = verdict(idleMet(r, run.Idle))
		rows = append(rows, x)
	}
	return rows
}

// writeIdle writes the idle scenario's section of docs/benchmarks.md.
func writeIdle(b *strings.Builder, res *Results) {
	r := res.Idle
	if r == nil {
		return
	}
	dur := func(s float64) string { return (time.Duration(s * float64(time.Second))).Round(time.Second).String() }
	fmt.Fprintf(b, "## Idle shards\n\n")
	fmt.Fprintf(b, "**Target**: %s.\n\n", idleTarget)
	fmt.Fprintf(b, "%d outbox tables in one database, each published by %d relay processes (`--shard-count %d --shard-index i`, started directly, "+
		"as %d OutboxRelays of %d shards would run them): %d shards. For each mode in turn, on a server of its own (the test server's settings, "+
		"and `%s`) and a topic of its own: **idle**, the relays running and nothing written, for %s (relays that poll back off while idle, "+
		"waiting a sixteenth of their idle spell between polls up to their idle poll interval, which they reach after sixteen times that: "+
		"for them the idle window begins once they have idled that long, and **the backoff** before it is measured too); then, once the relays have idled "+
		"%s since the last one was ready, **the first event** committed into each table (%s apart), commit to an independent consumer; "+
		"then **fed**: each relay fed about %.0f event/s (one writer, round robin over the tables, on random aggregates) for %s. "+
		"The relays connect as their own role (`%s`), the writer and the observers as `postgres`. PostgreSQL's CPU is every process "+
		"of the server (`/proc`: the postmaster and its children, so the checkpointer and the other background processes too), in %% of one core; "+
		"statements are the calls `pg_stat_statements` records for the relays' role (`BEGIN` and `COMMIT` included); transactions are "+
		"`xact_commit + xact_rollback` of the database in `pg_stat_database` (every session; the writer's taken off; a NOTIFY makes every "+
		"backend that LISTENs in the database, whatever its channel, read the queue in a transaction of its own, which this counts and "+
		"`pg_stat_statements` does not; backends report these counters seconds late, so a short window's figure is approximate); transaction ids "+
		"are the advance of `pg_snapshot_xmax(pg_current_snapshot())`, the writer's taken off. "+
		"To fit every mode's long idle in one run, the modes overlap: a mode starts when the one before has measured its idle window, "+
		"and idles while that one is fed; so a mode's idle window may have an earlier mode's relays running beside it (on their own "+
		"server: the figures are this mode's alone, the machine is shared).\n\n",
		r.Tables, r.ShardsPerTable, r.ShardsPerTable, r.Tables, r.ShardsPerTable, r.relays(), r.Settings, dur(r.WindowSec),
		dur(r.LongIdleSec), "up to 100 ms", r.FedPerRelay, dur(r.FedSec), publisherRole)
	if f := idleScale(r); f != 1 {
		fmt.Fprintf(b, "> This run measured %d shards, not %d: the figures per %d shards scale the measured ones by %.1f (what each shard costs is the same), "+
			"and the verdict is on them; past the machine's cores the extrapolation only says that the target is out of reach.\n\n", r.relays(), idleTargetShards, idleTargetShards, f)
	}
	if r.Err != "" {
		fmt.Fprintf(b, "> The scenario failed: %s\n\n", mdEscape(firstLine(r.Err, 300)))
	}
	if len(r.Runs) == 0 {
		return
	}
	fmt.Fprintf(b, "| | ")
	for _, run := range r.Runs {
		fmt.Fprintf(b, "%s | ", run.Name)
	}
	fmt.Fprintf(b, "\n|---|%s\n", strings.Repeat("---:|", len(r.Runs)))
	line := func(what string, f func(run *IdleRun) string) {
		fmt.Fprintf(b, "| %s | ", what)
		for _, run := range r.Runs {
			fmt.Fprintf(b, "%s | ", mdEscape(f(run)))
		}
		fmt.Fprintln(b)
	}
	cost := func(c func(run *IdleRun) *IdleCost, f func(c *IdleCost) string) func(run *IdleRun) string {
		return func(run *IdleRun) string {
			if x := c(run); x != nil {
				return f(x)
			}
			if run.Err != "" {
				return "failed: " + firstLine(run.Err, 40)
			}
			return "-"
		}
	}
	idle := func(run *IdleRun) *IdleCost { return run.Idle }
	ramp := func(run *IdleRun) *IdleCost { return run.Ramp }
	fed := func(run *IdleRun) *IdleCost { return run.Fed }
	line("poll interval / idle poll interval (the most an idle relay waits)", func(run *IdleRun) string {
		if run.IdlePollMs == 0 {
			return fmt.Sprintf("%.0f ms / -", run.PollMs)
		}
		return fmt.Sprintf("%.0f ms / %.0f ms", run.PollMs, run.IdlePollMs)
	})
	line(fmt.Sprintf("%d relays started, the last ready after", r.relays()), func(run *IdleRun) string {
		if run.ReadyMs == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f s", run.ReadyMs/1000)
	})
	line("other modes' relays running beside the idle window", func(run *IdleRun) string {
		if len(run.Alongside) == 0 {
			return "none"
		}
		return strings.Join(run.Alongside, ", ")
	})
	for _, phase := range []struct {
		what string
		c    func(run *IdleRun) *IdleCost
	}{
		{"idle, the backoff (polling relays, before the idle window)", ramp},
		{fmt.Sprintf("idle %s", dur(r.WindowSec)), idle},
		{fmt.Sprintf("fed %.0f event/s per relay, %s", r.FedPerRelay, dur(r.FedSec)), fed},
	} {
		line(phase.what+": PostgreSQL CPU, % of a core (of which the relays' backends)", cost(phase.c, func(c *IdleCost) string {
			s := fmt.Sprintf("%.2f%% (%.2f%%)", c.PostgresPct(), c.perSec(c.PostgresRelayCPU)*100)
			if f := idleScale(r); f != 1 {
				s += fmt.Sprintf("; per %d shards %.2f%%", idleTargetShards, c.PostgresPct()*f)
				if cpus := res.Machine.CPUs; cpus > 0 && c.PostgresPct()*f > float64(100*cpus) {
					s += fmt.Sprintf(", more than this machine's %d cores", cpus)
				}
			}
			return s
		}))
		line(phase.what+": the relays' statements/s (pg_stat_statements)", cost(phase.c, func(c *IdleCost) string {
			s := idleScaled(r, c.StatementsPerSec(), "%.1f")
			if c.Evicted > 0 {
				s += fmt.Sprintf(", undercounted: %d entries evicted", c.Evicted)
			}
			return s
		}))
		line(phase.what+": transactions/s (pg_stat_database, the writer's off; of which rolled back) / transaction ids/s", cost(phase.c, func(c *IdleCost) string {
			return fmt.Sprintf("%.1f (%.1f) / %.2f", c.XactsPerSec(), c.perSec(float64(c.Rollbacks)), c.XidsPerSec())
		}))
		line(phase.what+": the relay processes' CPU, % of a core (all of them)", cost(phase.c, func(c *IdleCost) string {
			return fmt.Sprintf("%.1f%%", c.RelayPct())
		}))
		line(phase.what+": the machine busy, % of a core (every process, other users' too)", cost(phase.c, func(c *IdleCost) string {
			return fmt.Sprintf("%.0f%%", c.perSec(c.MachineCPU)*100)
		}))
	}
	line("idle: the target ("+idleTarget+")", cost(idle, func(c *IdleCost) string {
		if idleMet(r, c) {
			return "met"
		}
		return "**missed**"
	}))
	line("fed: the relays' statements / transaction ids per event (events committed)", cost(fed, func(c *IdleCost) string {
		if c.Events == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f / %.2f (%s)", float64(c.Statements)/float64(c.Events), float64(c.Xids)/float64(c.Events), fmtInt(float64(c.Events)))
	}))
	line("fed: commit to consumer p50 / p99 / max", func(run *IdleRun) string {
		l := run.FedLatency
		if l == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f / %.1f / %.1f ms", l.P50, l.P99, l.Max)
	})
	line("the first event into each table after the long idle: commit to consumer p50 / max (to the broker's append p50 / max)", func(run *IdleRun) string {
		l := run.First
		if l == nil {
			return "-"
		}
		return fmt.Sprintf("after %s: %.1f / %.1f ms (%.1f / %.1f ms)", dur(run.IdleForSec), l.P50, l.Max, l.PickupP50, l.PickupMax)
	})
	line("peak RSS (VmHWM) of the largest relay", func(run *IdleRun) string {
		if run.PeakRSS == 0 {
			return "-"
		}
		return mib(run.PeakRSS)
	})
	fmt.Fprintln(b)
	for _, run := range r.Runs {
		if run.Err != "" {
			fmt.Fprintf(b, "> %s failed: %s\n\n", run.Name, mdEscape(firstLine(run.Err, 300)))
		}
	}
}
