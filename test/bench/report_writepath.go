package main

import (
	"fmt"
	"strings"
)

// Targets of the write-path scenario (issue: the write path at scale), as ratios in one run.
const (
	targetWriteTPSRatio = 0.9 // Append transactions vs plain ones, 32 and 64 writers
	targetWriteP99Ratio = 1.2 // p99 transaction latency, Append vs plain
	targetAppendRatio   = 1.3 // one connection: Append transaction vs plain INSERT transaction
	// targetIdlePollPct bounds what an idle polling relay's backends may cost the database, in
	// percent of one core: polling replaced the trigger to spare the application, not to load
	// the database while nothing happens.
	targetIdlePollPct = 2.0
)

// writePathRows are the summary rows of the write-path and durable append measurements.
func writePathRows(res *Results) []row {
	var rows []row
	if l, n := res.Latency, res.LatencyNotify; l != nil && n != nil && l.Measured && n.Measured {
		rows = append(rows, row{
			Measurement: fmt.Sprintf("latency p99 at %s events/s, polling every %.0f ms (the default, no insert trigger) vs woken by notifications", fmtInt(l.Rate), l.PollMs),
			Value:       fmt.Sprintf("%.1f vs %.1f ms (%.2fx)", l.P99, n.P99, l.P99/n.P99),
			Target:      "no worse (<= 1.0x, noise aside)",
			Verdict:     verdict(l.P99 <= n.P99*1.1),
		})
	}
	if n, a := res.LatencyNotify, res.LatencyAlways; n != nil && a != nil && n.Measured && a.Measured {
		rows = append(rows, row{
			Measurement: fmt.Sprintf("latency p99 at %s events/s, notifications: wake-ups on demand vs every insert notifying", fmtInt(n.Rate)),
			Value:       fmt.Sprintf("%.1f vs %.1f ms (%.2fx)", n.P99, a.P99, n.P99/a.P99),
			Target:      "no worse (<= 1.0x, noise aside)",
			Verdict:     verdict(n.P99 <= a.P99*1.1),
		})
	}
	rows = append(rows, idleRows(res)...)
	if a := res.DurableAppend; a != nil && a.Measured {
		rows = append(rows, row{Measurement: "durable server: transaction with outbox.Append vs with a plain INSERT (medians)",
			Value:  fmt.Sprintf("%.0f us vs %.0f us (%.2fx; %.2fx)", a.AppendUS, a.InsertUS, a.Ratio, a.AppendP50/max(a.InsertP50, 1)),
			Target: fmt.Sprintf("<= %.1fx", targetAppendRatio), Verdict: verdict(a.Ratio <= targetAppendRatio)})
	}
	if a := res.Append; a != nil && a.Measured {
		// Without the commit's flush this is CPU alone, not what an application waits for: the
		// target is the durable server's row above.
		rows = append(rows, row{Measurement: "test server (fsync off): transaction with outbox.Append vs with a plain INSERT",
			Value:  fmt.Sprintf("%.0f us vs %.0f us (%.2fx)", a.AppendUS, a.InsertUS, a.Ratio),
			Target: "(CPU only: the target is the durable row)"})
	}
	wp := res.WritePath
	if wp == nil {
		return rows
	}
	if wp.Err != "" {
		return append(rows, row{Measurement: "write path", Value: "failed: " + firstLine(wp.Err, 60)})
	}
	for _, relay := range []string{"poll-snapshot", checksTableState, "poll", "snapshot-idle", "idle", "snapshot-draining", "draining", "none", "always"} {
		for _, n := range []int{32, 64} {
			r := wp.Row(n, relay)
			if r == nil {
				continue
			}
			tps, p99 := r.AppendTPS/r.PlainTPS, r.AppendP99/r.PlainP99
			x := row{
				Measurement: fmt.Sprintf("%d writers, %s: Append tx/s and p99 vs a plain PK-only table", n, relayState(relay)),
				Value:       fmt.Sprintf("%.2fx%s, p99 %.2fx", tps, ratioSpread(r), p99),
			}
			switch relay {
			case "poll-snapshot": // the default configuration: the target
				x.Target = fmt.Sprintf(">= %.1fx, p99 <= %.1fx", targetWriteTPSRatio, targetWriteP99Ratio)
				x.Verdict = verdict(tps >= targetWriteTPSRatio && p99 <= targetWriteP99Ratio)
			case checksTableState:
				x.Target = "(opt-in: the CHECKs refuse a bad plain INSERT)"
			case "poll":
				x.Target = "(row tracking: every index)"
			case "none", "always":
				x.Target = "(opt-in notify: the trigger's cost)"
			default:
				// The relay and the broker publish these events on the writers' two cores; the
				// database's own share is its CPU per transaction.
				x.Value += fmt.Sprintf("; PostgreSQL %.0f vs %.0f µs/tx", r.AppendPGUS, r.PlainPGUS)
				x.Target = "(relay and broker on the same 2 cores)"
			}
			rows = append(rows, x)
		}
	}
	for _, relay := range []string{"poll-snapshot", checksTableState, "poll"} {
		if r := wp.Row(1, relay); r != nil && r.PlainTPS > 0 && r.AppendTPS > 0 {
			rows = append(rows, row{
				Measurement: fmt.Sprintf("one writer, %s: µs per transaction, Append vs plain PK-only table", relayState(relay)),
				Value:       fmt.Sprintf("%.0f vs %.0f µs (%.2fx)", 1e6/r.AppendTPS, 1e6/r.PlainTPS, r.PlainTPS/r.AppendTPS),
				Target:      "(reported)",
			})
		}
	}
	return rows
}

// idleRows compare what an idle relay costs the database in each wake-up mode.
func idleRows(res *Results) []row {
	var rows []row
	for _, c := range []struct {
		what         string
		poll, notify *LatencyResult
	}{{"row tracking", res.Latency, res.LatencyNotify}, {"snapshot tracking", res.LatencySnapshot, res.LatencySnapshotNotify}} {
		p, n := c.poll, c.notify
		if p == nil || n == nil || !p.Measured || !n.Measured || p.Idle == nil || n.Idle == nil || p.Idle.Wall == 0 || n.Idle.Wall == 0 {
			continue
		}
		pct := func(u *CPUUsage) float64 { return 100 * u.PostgresRelay / u.Wall }
		rows = append(rows, row{
			Measurement: fmt.Sprintf("idle relay, %s: the relay's PostgreSQL backends, polling every %.0f ms vs waiting for a notification", c.what, p.PollMs),
			Value:       fmt.Sprintf("%.2f%% vs %.2f%% of a core", pct(p.Idle), pct(n.Idle)),
			Target:      fmt.Sprintf("<= %.0f%% of a core", targetIdlePollPct),
			Verdict:     verdict(pct(p.Idle) <= targetIdlePollPct),
		})
	}
	return rows
}

// targetRounds is the rounds of the levels the targets judge (the most any level ran).
func targetRounds(wp *WritePathResult) int {
	n := wp.Rounds
	for _, r := range wp.Rows {
		n = max(n, r.Rounds)
	}
	return n
}

// ratioSpread is the round-to-round spread of a row's Append/plain ratio, " (q1-q3)", or "" for
// runs before it was recorded.
func ratioSpread(r *WritePathRow) string {
	if r.AppendRatioQ1 == 0 {
		return ""
	}
	return fmt.Sprintf(" (%.2f-%.2f)", r.AppendRatioQ1, r.AppendRatioQ3)
}

// appCPU is the load generator's CPU per transaction, plain / Append; runs before it was
// measured have none.
func appCPU(r WritePathRow) string {
	if r.PlainAppUS == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f / %.0f", r.PlainAppUS, r.AppendAppUS)
}

func relayState(s string) string {
	switch s {
	case "always":
		return "every insert notifying (before)"
	case "none":
		return "notify, no relay waiting"
	case "poll":
		return "row table, no relay (polling: no insert trigger)"
	case "poll-snapshot":
		return "snapshot table, no relay (the default)"
	case checksTableState:
		return "snapshot table with its four CHECKs (`spec.writers.checks: Table`), no relay"
	case "idle":
		return "row table, row relay publishing"
	case "snapshot-idle":
		return "snapshot table, snapshot relay publishing"
	case "draining":
		return "row table, row relay draining a backlog"
	case "snapshot-draining":
		return "snapshot table, snapshot relay draining a backlog"
	}
	return s
}

// writeWritePath writes the write-path section.
func writeWritePath(b *strings.Builder, res *Results) {
	wp := res.WritePath
	if wp == nil || len(wp.Rows) == 0 {
		return
	}
	fmt.Fprintf(b, "## The write path: what appending costs the application's commits\n\n")
	if wp.Started != "" {
		fmt.Fprintf(b, "Measured at %s.\n\n", wp.Started)
	}
	fmt.Fprintf(b, "On a second PostgreSQL server with `%s` (what production runs; the test server's settings would hide "+
		"the commit flush). Each level runs three transaction shapes on N connections for %d rounds of %.0f s each (%d at the levels the targets judge), "+
		"interleaved (the order rotates each round): *plain* is `INSERT` a business row + `INSERT` the same event into "+
		"the table a Debezium user would have, the event's columns and a primary key only (a bigint identity: no partitions, "+
		"checks, other indexes or trigger); *Append* is `INSERT` a business row + `outbox.Append` into the outbox; *no lock* "+
		"is the same with `outbox.WithoutAggregateLock()`. The outbox's relays run one shard, so it has no bucket index (the "+
		"operator drops it under a layout of one shard and builds it back before a layout of several), and it is tracked by "+
		"snapshot (the default: it has no pending index, as the operator leaves it once the relays' cursor has passed its "+
		"first batch) or by row (the pending index too), as the relay column says; one state drops the table's four CHECKs "+
		"(`spec.writers.checks: Relay`, migration 00022: the relays refuse those events instead); with one writer, the µs of one transaction is 1 / tx/s. "+
		"The ratio's parentheses hold the quartiles of the ratio from round to round (each round's shapes run one after the other): "+
		"how far a ratio can be read on this shared machine. Latency is BEGIN to COMMIT returned, as the application sees it. *notifications* are counted by an independent "+
		"`LISTEN` during the Append rounds. *PostgreSQL µs/tx* is the server's CPU per transaction (backends, WAL writer, "+
		"and with a relay its backends too); *application µs/tx* is the load generator's (pgx, and for Append its validation). The relay, the broker and the load generator share the same two cores: with a "+
		"relay running, its publishing competes with the writers for CPU, which a production deployment (relay and broker "+
		"on other machines) would not see; the PostgreSQL column is the cost that stays on the database.\n\n",
		wp.Settings, wp.Rounds, wp.Round, targetRounds(wp))
	fmt.Fprintf(b, "| writers | outbox, relay | plain tx/s | Append tx/s | ratio | no lock | plain p99 ms | Append p99 ms | ratio | notifications / 1k tx | PostgreSQL µs/tx plain / Append | application µs/tx plain / Append |\n")
	fmt.Fprintf(b, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range wp.Rows {
		if r.Relay == insertsState {
			continue
		}
		fmt.Fprintf(b, "| %d | %s | %s | %s | %.2fx%s | %.2fx | %.1f | %.1f | %.2fx | %.1f | %.0f / %.0f | %s |\n",
			r.Writers, relayState(r.Relay), fmtInt(r.PlainTPS), fmtInt(r.AppendTPS), r.AppendTPS/r.PlainTPS, ratioSpread(&r),
			r.NoLockTPS/r.PlainTPS, r.PlainP99, r.AppendP99, r.AppendP99/r.PlainP99,
			r.NotifyPer1k, r.PlainPGUS, r.AppendPGUS, appCPU(r))
	}
	fmt.Fprintln(b)
	writeInserts(b, wp)
	before, notify, poll, snap := wp.Row(64, "always"), wp.Row(64, "none"), wp.Row(64, "poll"), wp.Row(64, "poll-snapshot")
	if before == nil || notify == nil || poll == nil || snap == nil {
		return
	}
	fmt.Fprintf(b, "**What limits it.** Every level is CPU-bound on this 2-core machine, the load generator included. With no relay, "+
		"64 writers reach %.2fx the plain table on a snapshot table and %.2fx on a row table: an Append transaction costs PostgreSQL "+
		"%.0f µs (snapshot) and %.0f µs (row) against %.0f µs for the plain one. The difference is what the outbox's insert "+
		"does that the plain table's does not: the index entry of the (txid, id) index (and of the pending index under row "+
		"tracking; of the bucket index only under a layout of several shards), partition routing, the "+
		"aggregate's advisory lock and the transaction id drawn before the row's id (docs/architecture.md, \"The write path "+
		"per mode\", has each part's cost); a table made before the CHECKs became opt-in (or with `spec.writers.checks: Table`) adds their "+
		"reading and planning (the with-CHECKs rows). With every insert "+
		"notifying (the behaviour before wake-ups on demand) 64 writers reach %.2fx: PostgreSQL's notify queue lock serialises "+
		"their commits; with the insert trigger but no relay waiting, %.2fx. With a relay running, its reads and the broker "+
		"take their CPU from the same two cores.\n\n",
		snap.AppendTPS/snap.PlainTPS, poll.AppendTPS/poll.PlainTPS, snap.AppendPGUS, poll.AppendPGUS, snap.PlainPGUS,
		before.AppendTPS/before.PlainTPS, notify.AppendTPS/notify.PlainTPS)
}

// writeInserts writes the plain INSERTs' table: what a writer in another language pays with a
// plain INSERT into the outbox, and with the lock trigger that keeps such inserts in commit
// order (spec.writers.plainInserts: Locked).
func writeInserts(b *strings.Builder, wp *WritePathResult) {
	var rows []WritePathRow
	for _, r := range wp.Rows {
		if r.Relay == insertsState && r.PlainTPS > 0 {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "**Plain INSERTs** (a writer in any language without the SQL append). The same interleaved rounds, no relay, "+
		"both outbox tables tracked by snapshot: *plain* as above; *INSERT* is `INSERT` a business row + a plain "+
		"`INSERT INTO outbox` (no aggregate lock: commit order per aggregate is not kept when two such transactions overlap); "+
		"*locked INSERT* the same into an outbox whose lock trigger is on (`spec.writers.plainInserts: Locked`, migration "+
		"00019: a `BEFORE INSERT` row trigger takes the aggregate's lock, as `outbox.Append` does, and draws the row's id again "+
		"after it, so such inserts are in commit order too; README, \"Writing from any language\").\n\n")
	fmt.Fprintf(b, "| writers | plain tx/s | INSERT tx/s | ratio | locked INSERT tx/s | ratio | p99 ms plain / INSERT / locked | PostgreSQL µs/tx plain / INSERT / locked |\n")
	fmt.Fprintf(b, "|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(b, "| %d | %s | %s | %.2fx | %s | %.2fx | %.1f / %.1f / %.1f | %.0f / %.0f / %.0f |\n",
			r.Writers, fmtInt(r.PlainTPS), fmtInt(r.InsertTPS), r.InsertTPS/r.PlainTPS, fmtInt(r.LockedInsertTPS),
			r.LockedInsertTPS/r.PlainTPS, r.PlainP99, r.InsertP99, r.LockedInsertP99, r.PlainPGUS, r.InsertPGUS, r.LockedInsertPGUS)
	}
	fmt.Fprintln(b)
}
