package main

import (
	"fmt"
	"image/color"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

var colorSnapshot = color.RGBA{R: 0x9e, G: 0xc5, B: 0xe8, A: 0xff}

// Goals of the side by side with Debezium (issue 14), as ratios measured in the same run.
const (
	goalDrainVsDebezium = 2.0  // relay drain rate >= 2x Debezium's
	goalP99VsDebezium   = 3.0  // relay p99 <= 1/3 of Debezium's
	goalRSSVsDebezium   = 10.0 // relay peak RSS <= 1/10 of Debezium's
)

// peerRatio is one relay figure against Debezium's: times better (higher is better), the goal
// (0: none) and the text of both values.
type peerRatio struct {
	what, short, relay, peer string
	better, goal             float64
}

// peerRatios compares relay peer p with Debezium's figures.
func peerRatios(d *DebeziumResult, p *PeerResult) []peerRatio {
	z := d.peer(peerDebezium)
	if z == nil || p == nil || z.Err != "" && z.Drain == nil || p.Err != "" && p.Drain == nil {
		return nil
	}
	var out []peerRatio
	if z.Drain != nil && p.Drain != nil {
		out = append(out, peerRatio{what: fmt.Sprintf("drain %s, start to last event", count(d.Backlog)),
			relay: fmtInt(p.Drain.Rate) + "/s", peer: fmtInt(z.Drain.Rate) + "/s", better: p.Drain.Rate / z.Drain.Rate, short: "drain, start to last", goal: goalDrainVsDebezium})
		if z.Drain.SteadyRate > 0 && p.Drain.SteadyRate > 0 {
			out = append(out, peerRatio{what: fmt.Sprintf("drain %s, first to last event", count(d.Backlog)),
				relay: fmtInt(p.Drain.SteadyRate) + "/s", peer: fmtInt(z.Drain.SteadyRate) + "/s", short: "drain, first to last", better: p.Drain.SteadyRate / z.Drain.SteadyRate})
		}
	}
	// The relay's latency runs by default, then woken by notifications, each against Debezium's at
	// the same rate; the goal is judged at the first rate.
	for _, set := range []struct {
		suffix string
		runs   []*LatencyResult
	}{{"", p.Latency}, {", notified", p.LatencyNotify}} {
		for i, lr := range set.runs {
			if i >= len(z.Latency) || !lr.Measured || !z.Latency[i].Measured || lr.P99 <= 0 {
				continue
			}
			goal := 0.0
			if i == 0 {
				goal = goalP99VsDebezium
			}
			out = append(out, peerRatio{what: fmt.Sprintf("latency p99 at %s events/s%s", fmtInt(lr.Rate), set.suffix),
				relay: fmt.Sprintf("%.1f ms", lr.P99), peer: fmt.Sprintf("%.1f ms", z.Latency[i].P99),
				short: fmt.Sprintf("p99 at %s/s%s", fmtInt(lr.Rate), set.suffix), better: z.Latency[i].P99 / lr.P99, goal: goal})
		}
	}
	if a, za := p.LatencyAsync, z.LatencyAsync; a != nil && za != nil && a.Measured && za.Measured && a.P99 > 0 {
		out = append(out, peerRatio{what: fmt.Sprintf("latency p99 at %s events/s, synchronous_commit=off", fmtInt(a.Rate)),
			short: "p99, synchronous_commit=off", relay: fmt.Sprintf("%.1f ms", a.P99), peer: fmt.Sprintf("%.1f ms", za.P99), better: za.P99 / a.P99})
	}
	if p.PeakRSS > 0 && z.PeakRSS > 0 {
		out = append(out, peerRatio{what: "peak RSS (VmHWM)", relay: mib(p.PeakRSS), peer: mib(z.PeakRSS),
			short: "peak RSS", better: float64(z.PeakRSS) / float64(p.PeakRSS), goal: goalRSSVsDebezium})
	}
	if p.ColdStartMs > 0 && z.ColdStartMs > 0 {
		out = append(out, peerRatio{what: "cold start to the first event", relay: fmt.Sprintf("%.0f ms", p.ColdStartMs),
			peer: fmt.Sprintf("%.0f ms", z.ColdStartMs), short: "cold start", better: z.ColdStartMs / p.ColdStartMs})
	}
	if pc, zc := drainPerEvent(p), drainPerEvent(z); pc > 0 && zc > 0 {
		out = append(out, peerRatio{what: "CPU per event in the drain (publisher + PostgreSQL + broker)",
			relay: fmt.Sprintf("%.0f µs", pc), peer: fmt.Sprintf("%.0f µs", zc), short: "CPU per event, drain", better: zc / pc})
	}
	return out
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// drainPerEvent is the drain's CPU per event of the publisher, PostgreSQL and the broker, in µs.
func drainPerEvent(p *PeerResult) float64 {
	if p == nil || p.Drain == nil || p.Drain.CPU == nil || p.Drain.Events == 0 {
		return 0
	}
	u := p.Drain.CPU
	return (u.Relay + u.Postgres + u.Kafka) / float64(p.Drain.Events) * 1e6
}

// debeziumRows are the result table's rows: each relay mode against Debezium.
func debeziumRows(res *Results) []row {
	d := res.Debezium
	if d == nil {
		return nil
	}
	z := d.peer(peerDebezium)
	if d.Skipped != "" || z == nil || z.Drain == nil {
		why := d.Skipped
		if why == "" && z != nil {
			why = firstLine(z.Err, 60)
		}
		if why == "" {
			why = firstLine(d.Err, 60)
		}
		return []row{{Measurement: "side by side with Debezium", Value: "not measured: " + why}}
	}
	var rows []row
	for _, p := range d.Peers {
		if p.Key == peerDebezium {
			continue
		}
		for _, r := range peerRatios(d, p) {
			x := row{Measurement: fmt.Sprintf("%s vs Debezium (above 1x the relay is better): %s", p.Name, r.what),
				Value: fmt.Sprintf("%s vs %s: %.2fx", r.relay, r.peer, r.better)}
			if r.goal > 0 {
				x.Target = fmt.Sprintf(">= %.0fx Debezium's", r.goal)
				if strings.HasPrefix(r.what, "latency") || strings.HasPrefix(r.what, "peak") {
					x.Target = fmt.Sprintf("<= 1/%.0f of Debezium's", r.goal)
				}
				x.Verdict = verdict(r.better >= r.goal)
			}
			rows = append(rows, x)
		}
		if p.Err != "" {
			rows = append(rows, row{Measurement: p.Name + " (side by side)", Value: "failed: " + firstLine(p.Err, 60)})
		}
	}
	rows = append(rows, steadyRows(d)...)
	return append(rows, eosRows(d)...)
}

// writeDebezium writes the side-by-side section of docs/benchmarks.md.
func writeDebezium(b *strings.Builder, res *Results) {
	d := res.Debezium
	if d == nil {
		return
	}
	fmt.Fprintf(b, "## Side by side with Debezium\n\n")
	fmt.Fprintf(b, "The peer users would otherwise run: %s, configured as below, against the relay in each of its tracking modes "+
		"(polling, its default wake-up, and woken by notifications), one after the other in this run, on the same PostgreSQL server (%s; `logical_decoding_work_mem` %s), "+
		"the same broker and the same load. Each publisher gets a fresh database and topic. ", d.Version, "`"+strings.ReplaceAll(d.Settings, ", ", "`, `")+"`", orDash(d.WorkMem))
	fmt.Fprintf(b, "**Cold start**: one event is committed while the publisher is stopped (for Debezium, after its first start created the "+
		"replication slot), then the publisher starts; the time runs from the process's start to the broker's append of the event "+
		"(the ratio uses this), and to its arrival at an independent consumer (which, started just before on a fresh topic, "+
		"sometimes adds its own first-fetch delay of about a second: the append time is the publisher's). **Drain**: %s events are committed in transactions of %s while the publisher is stopped (Debezium's slot holds their WAL: "+
		"it streams them, no snapshot), then it starts; the rate is the events over the time from the start to the last arrival, and "+
		"again from the first arrival to the last (start-up excluded). **Latency**: with the publisher running, 8 writers commit one event "+
		"per transaction at each rate for %s (the first %s not counted; a low rate runs longer, until %s events are counted), and once more at the first rate with the writers' "+
		"`synchronous_commit=off` (`ALTER DATABASE`: a logical walsender sends only WAL flushed to disk, which the WAL writer then does every "+
		"`wal_writer_delay`; the headline is PostgreSQL's default, on); for each relay then once more at each rate, restarted with "+
		"`--notify` and the table's insert trigger (the operator's `spec.publish.notify`: woken by notifications instead of polling); commit to arrival, and commit to the broker's append (the topics "+
		"use `message.timestamp.type=LogAppendTime`): the publisher's part. CPU is from `/proc`: the publisher process "+
		"(the Connect JVM or the relay), PostgreSQL (every backend; *of which the publisher's* is Debezium's walsender and connections, "+
		"or the relay's two connections) and the broker. %sFinally every record on the topic is checked against the database.\n\n",
		fmtInt(float64(d.Backlog)), fmtInt(float64(d.Chunk)), res.Config.latencyDuration, res.Config.latencyWarmup, fmtInt(float64(res.Config.latencyEvents)), floorMethod(d))
	if d.Skipped != "" {
		fmt.Fprintf(b, "> Debezium was not measured in this run: %s.\n\n", mdEscape(d.Skipped))
	}
	if d.Err != "" {
		fmt.Fprintf(b, "> The scenario failed: %s\n\n", mdEscape(firstLine(d.Err, 300)))
	}

	fmt.Fprintf(b, "| | ")
	for _, p := range d.Peers {
		fmt.Fprintf(b, "%s | ", p.Name)
	}
	fmt.Fprintf(b, "\n|---|%s\n", strings.Repeat("---:|", len(d.Peers)))
	line := func(what string, f func(p *PeerResult) string) {
		fmt.Fprintf(b, "| %s | ", what)
		for _, p := range d.Peers {
			fmt.Fprintf(b, "%s | ", mdEscape(f(p)))
		}
		fmt.Fprintln(b)
	}
	drain := func(f func(*PeerDrain) string) func(p *PeerResult) string {
		return func(p *PeerResult) string {
			if p.Drain == nil {
				return "-"
			}
			return f(p.Drain)
		}
	}
	line("cold start to the first event appended by the broker / received / ready", func(p *PeerResult) string {
		if p.ColdStartMs == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f / %.0f / %.0f ms", p.ColdStartMs, p.ColdArriveMs, p.ReadyMs)
	})
	line(fmt.Sprintf("drain %s: start to last event", count(d.Backlog)), drain(func(x *PeerDrain) string { return fmtInt(x.Rate) + " events/s" }))
	line("drain: first to last event", drain(func(x *PeerDrain) string { return fmtInt(x.SteadyRate) + " events/s" }))
	line("drain: start to first event", drain(func(x *PeerDrain) string { return fmt.Sprintf("%.0f ms", x.FirstMs) }))
	per := func(f func(u *CPUUsage) float64) func(*PeerDrain) string {
		return func(x *PeerDrain) string {
			if x.CPU == nil {
				return "-"
			}
			return fmt.Sprintf("%.1f", f(x.CPU)/float64(x.Events)*1e6)
		}
	}
	line("drain CPU µs/event: publisher process", drain(per(func(u *CPUUsage) float64 { return u.Relay })))
	line("drain CPU µs/event: PostgreSQL", drain(per(func(u *CPUUsage) float64 { return u.Postgres })))
	line("… of which the publisher's backends (walsender)", drain(per(func(u *CPUUsage) float64 { return u.PostgresRelay })))
	line("drain CPU µs/event: broker", drain(per(func(u *CPUUsage) float64 { return u.Kafka })))
	line("drain CPU µs/event: total", drain(per(func(u *CPUUsage) float64 { return u.Relay + u.Postgres + u.Kafka })))
	// The latency runs: as each publisher runs by default, then the relays woken by notifications.
	for _, set := range []struct {
		first, next string // what the first line of a rate, and the others, say after the rate
		runs        func(p *PeerResult) []*LatencyResult
	}{
		{"", "", func(p *PeerResult) []*LatencyResult { return p.Latency }},
		{", the relay woken by notifications", ", notified", func(p *PeerResult) []*LatencyResult { return p.LatencyNotify }},
	} {
		for i, rate := range d.Rates {
			lat := func(f func(l *LatencyResult) string) func(p *PeerResult) string {
				return func(p *PeerResult) string {
					runs := set.runs(p)
					if i >= len(runs) {
						return "-"
					}
					l := runs[i]
					if !l.Measured {
						return "failed: " + firstLine(l.Err, 40)
					}
					return f(l)
				}
			}
			line(fmt.Sprintf("latency at %s/s%s: p50 / p95 / p99 / max", fmtInt(rate), set.first), lat(func(l *LatencyResult) string {
				return fmt.Sprintf("%.1f / %.1f / %.1f / %.1f ms", l.P50, l.P95, l.P99, l.Max)
			}))
			line(fmt.Sprintf("latency at %s/s%s: commit to the broker's append p50 / p99", fmtInt(rate), set.next), lat(func(l *LatencyResult) string {
				return fmt.Sprintf("%.0f / %.0f ms", l.PickupP50, l.PickupP99)
			}))
			line(fmt.Sprintf("latency at %s/s%s: CPU µs/event publisher / PostgreSQL (its backends) / broker (its JIT compilers)", fmtInt(rate), set.next), lat(func(l *LatencyResult) string {
				c := perEventCPU(l)
				if c == nil {
					return "-"
				}
				return fmt.Sprintf("%.0f / %.0f (%.0f) / %s", c.Relay, c.Postgres, c.PostgresRelay, brokerCell(c))
			}))
			line(fmt.Sprintf("latency at %s/s%s: per event PostgreSQL statements / transaction ids / Kafka record batches", fmtInt(rate), set.next), lat(func(l *LatencyResult) string {
				return costCells(l.Cost)
			}))
		}
	}
	if len(d.Rates) > 0 {
		line(fmt.Sprintf("latency at %s/s, writers with synchronous_commit=off: p50 / p95 / p99 / max", fmtInt(d.Rates[0])), func(p *PeerResult) string {
			l := p.LatencyAsync
			switch {
			case l == nil:
				return "-"
			case !l.Measured:
				return "failed: " + firstLine(l.Err, 40)
			}
			return fmt.Sprintf("%.1f / %.1f / %.1f / %.1f ms", l.P50, l.P95, l.P99, l.Max)
		})
	}
	line("peak RSS (VmHWM) of the publisher process", func(p *PeerResult) string {
		if p.PeakRSS == 0 {
			return "-"
		}
		return mib(p.PeakRSS)
	})
	line("output check", func(p *PeerResult) string {
		switch {
		case p.Check == nil && p.Err != "":
			return "failed: " + firstLine(p.Err, 60)
		case p.Check == nil:
			return "-"
		case p.Check.OK():
			return fmt.Sprintf("every one of %s events once, in order per aggregate", fmtInt(float64(p.Check.Rows)))
		default:
			return firstLine(p.Check.summary(), 200)
		}
	})
	fmt.Fprintln(b)

	writeDebeziumVerdicts(b, d)
	writeEOSVerdict(b, d)
	writeDebeziumFloor(b, d)
	writeSteadyGoals(b, d)
	writeDebeziumCost(b, d)
	writeDebeziumOutput(b, d)

	if d.Conn != "" {
		fmt.Fprintf(b, "### Debezium's configuration as run\n\n")
		fmt.Fprintf(b, "Written by `hack/debezium.sh` (fetched from Maven Central by `hack/debezium.sh fetch`; the Kafka, Jackson, slf4j and "+
			"compression jars the connector's dependency tree pulls in are left out of the plugin directory, as Debezium's own archive does). "+
			"The JVM runs with `connect-standalone.sh`'s flags: `%s`. The publication is created by hand: "+
			"`CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)` (inserts only: the relay's "+
			"marks are updates; through the partitioned root, so the router sees one table).\n\n", d.JVM, debeziumPub, res.Config.scenarioTable())
		fmt.Fprintf(b, "Worker (`worker.properties`):\n\n```properties\n%s\n```\n\nConnector (`connector.properties`):\n\n```properties\n%s\n```\n\n", d.Worker, d.Conn)
		fmt.Fprintf(b, "What was tuned, and why: Kafka Connect **4.3.1**, not 4.4.0 (Debezium 3.6.1 is built against Kafka 4.3; on a 4.4 worker its task fails "+
			"with `NoClassDefFoundError: org/apache/kafka/common/utils/Sanitizer`; the broker stays 4.4.0); `plugin.discovery=service_load` "+
			"(the default scan costs seconds of start-up and hundreds of MiB); `StringConverter` for key and value (the relay publishes the "+
			"row's bytes; `JsonConverter` would quote the payload as a JSON string); `snapshot.mode=no_data` and a hand-made publication; "+
			"`max.batch.size` 8,192 and `max.queue.size` 32,768 (4x the defaults) as Debezium documents for throughput; "+
			"`poll.interval.ms=10` (default 500; it is also how long the streaming loop sleeps when the walsender has nothing) as the "+
			"relay's default poll interval, so both wait the same at most for a new event; `producer.linger.ms=0` as the relay, which sends each "+
			"batch at once (Kafka 4's default waits 5 ms); "+
			"`extended.headers.enabled=false` (no `__debezium.context.*` headers on every message); `acks=all` and idempotence "+
			"as the relay guarantees (Connect's defaults). Everything else is Debezium's and Connect's default.\n\n")
	}
}

// scenarioTable is the outbox table the scenarios use.
func (c config) scenarioTable() string { return "public.outbox" }

// writeDebeziumVerdicts states each goal, met or not, and why where the relay loses.
func writeDebeziumVerdicts(b *strings.Builder, d *DebeziumResult) {
	z := d.peer(peerDebezium)
	if z == nil || z.Drain == nil {
		return
	}
	for _, p := range d.Peers {
		if p.Key == peerDebezium {
			continue
		}
		rs := peerRatios(d, p)
		if len(rs) == 0 {
			continue
		}
		fmt.Fprintf(b, "**%s against Debezium** (higher is better for the relay): ", p.Name)
		var parts []string
		for _, r := range rs {
			s := fmt.Sprintf("%s %.2fx", r.what, r.better)
			if r.goal > 0 {
				if r.better >= r.goal {
					s += fmt.Sprintf(" (goal %.0fx: met)", r.goal)
				} else {
					s += fmt.Sprintf(" (goal %.0fx: **missed**)", r.goal)
				}
			}
			parts = append(parts, s)
		}
		fmt.Fprintf(b, "%s.", strings.Join(parts, "; "))
		for _, why := range lossReasons(z, p, rs) {
			fmt.Fprintf(b, " %s", why)
		}
		fmt.Fprintf(b, "\n\n")
	}
}

// lossReasons explains, from the measurements, the figures where the relay does worse than a goal.
func lossReasons(z, p *PeerResult, rs []peerRatio) []string {
	var out []string
	for _, r := range rs {
		if r.goal == 0 || r.better >= r.goal {
			continue
		}
		switch {
		case strings.HasPrefix(r.what, "drain") && z.Drain.CPU != nil && p.Drain.CPU != nil:
			zu, pu := z.Drain.CPU, p.Drain.CPU
			n := func(v float64, x *PeerDrain) float64 { return v / float64(x.Events) * 1e6 }
			out = append(out, fmt.Sprintf("The drain: per event the relay's PostgreSQL spent %.0f µs against Debezium's %.0f µs (the relay "+
				"fetches and %s; Debezium's walsender only decodes WAL already written), the publisher process %.0f against %.0f µs, the broker "+
				"%.0f against %.0f µs; on %s the machine's cores are shared by all of them.",
				n(pu.Postgres, p.Drain), n(zu.Postgres, z.Drain), trackingWork(p), n(pu.Relay, p.Drain), n(zu.Relay, z.Drain),
				n(pu.Kafka, p.Drain), n(zu.Kafka, z.Drain), "this machine"))
		case strings.HasPrefix(r.what, "latency"):
			l, zl := relayLatency(p, r.what), relayLatency(z, strings.TrimSuffix(r.what, ", notified"))
			if l == nil || zl == nil {
				continue
			}
			wake := "polling, it looks again a millisecond after a fetch that found events and backs off to 10 ms while none come"
			if l.Notify {
				wake = "woken by notifications, it fetches as soon as a writer's commit notifies"
			}
			out = append(out, fmt.Sprintf("Latency at %s events/s (%s): p50 %.1f ms for the relay against %.1f ms for Debezium, p99 %.1f against %.1f ms; "+
				"commit to the broker's append p99 %.0f against %.0f ms. The relay: %s, then fetches and publishes with one batch in "+
				"flight, so an event committed while a publish is held up (a broker pause, a core taken by another process) waits for "+
				"it, a fetch and its own publish. Debezium's streaming loop sleeps `poll.interval.ms` (10 ms) whenever the walsender "+
				"has nothing. On a shared 2-core machine these tails move by 2x between runs: read them with the load average above.",
				fmtInt(l.Rate), map[bool]string{false: "polling", true: "notified"}[l.Notify], l.P50, zl.P50, l.P99, zl.P99, l.PickupP99, zl.PickupP99, wake))
		case strings.HasPrefix(r.what, "peak"):
			out = append(out, fmt.Sprintf("Memory: the relay peaked at %s, Debezium's JVM at %s.", mib(p.PeakRSS), mib(z.PeakRSS)))
		}
	}
	return out
}

// relayLatency is the relay's latency run a ratio named what ("latency p99 at R events/s") compares.
func relayLatency(p *PeerResult, what string) *LatencyResult {
	runs := p.Latency
	if strings.Contains(what, "notified") {
		runs = p.LatencyNotify
	}
	for _, l := range runs {
		if l.Measured && strings.Contains(what, " "+fmtInt(l.Rate)+" ") {
			return l
		}
	}
	return nil
}

func trackingWork(p *PeerResult) string {
	if p.snapshot() {
		return "advances a cursor per batch"
	}
	return "marks every row sent"
}

// writeDebeziumOutput reports how each publisher's messages differ from the relay's contract.
func writeDebeziumOutput(b *strings.Builder, d *DebeziumResult) {
	fmt.Fprintf(b, "**What the independent consumer found.** Each record is matched to its row by its `event_id` header (the router's `id` "+
		"header where that is missing) and compared with what the relay's contract makes of the row: key = aggregate id, value = the "+
		"payload as PostgreSQL renders the jsonb, headers `event_id`, `event_type`, `aggregate_type`, `aggregate_id` and one per member "+
		"of the row's `headers` object.\n\n")
	for _, p := range d.Peers {
		c := p.Check
		if c == nil {
			continue
		}
		fmt.Fprintf(b, "- **%s**: %s.", p.Name, mdEscape(c.summary()))
		if c.Example != "" {
			fmt.Fprintf(b, " First differing value: `%s`.", strings.ReplaceAll(c.Example, "`", "'"))
		}
		for _, h := range c.Headers {
			fmt.Fprintf(b, " *%s* on %s records", mdEscape(h.What), fmtInt(float64(h.Count)))
			if h.Example != "" {
				fmt.Fprintf(b, " (e.g. `%s`)", strings.ReplaceAll(h.Example, "`", "'"))
			}
			fmt.Fprintf(b, ".")
		}
		fmt.Fprintln(b)
	}
	if z := d.peer(peerDebezium); z != nil && z.Check != nil && len(z.Check.Headers) > 0 {
		fmt.Fprintf(b, "\nThe Outbox Event Router always adds the event id as header `id` (the relay names it `event_id`; the router's "+
			"additional field placement adds `event_id` too, as configured here), and it can place the row's `headers` column only as one "+
			"header holding the JSON text: a consumer that reads `traceparent` as its own header, as the relay delivers it, "+
			"would need a custom SMT with Debezium.\n")
	}
	fmt.Fprintln(b)
}

// debeziumPlot draws each relay mode against Debezium as "times better" per figure, with the
// goals; nil when Debezium was not measured.
func debeziumPlot(res *Results) (*plot.Plot, error) {
	d := res.Debezium
	if d == nil || d.peer(peerDebezium) == nil || d.peer(peerDebezium).Drain == nil {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = "Relay vs Debezium in the same run: times better (drain: relay / Debezium; the others: Debezium / relay)"
	keys := []string{peerRelayRow, peerRelaySnap}
	ratios := map[string][]peerRatio{}
	var names []string
	for _, k := range keys {
		ratios[k] = peerRatios(d, d.peer(k))
		if len(ratios[k]) > len(names) {
			names = names[:0]
			for _, r := range ratios[k] {
				n := r.short
				if r.goal > 0 {
					n += fmt.Sprintf(" (goal %.0fx)", r.goal)
				}
				names = append(names, n)
			}
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	// Reverse order: a horizontal chart draws its first bar at the bottom.
	n := len(names)
	rev := make([]string, n)
	for i, s := range names {
		rev[n-1-i] = s
	}
	const width = 9
	var labels plotter.XYLabels
	maxV := 1.0
	for ki, k := range keys {
		vals := make(plotter.Values, n)
		for i, r := range ratios[k] {
			if i < n {
				vals[n-1-i] = r.better
			}
		}
		bars, err := plotter.NewBarChart(vals, vg.Points(width))
		if err != nil {
			return nil, err
		}
		bars.Horizontal = true
		bars.Color = colorRelay
		if k == peerRelaySnap {
			bars.Color = colorSnapshot
		}
		bars.LineStyle.Width = 0
		bars.Offset = vg.Points(width/2 - float64(ki)*width)
		p.Add(bars)
		p.Legend.Add(d.peer(k).Name, bars)
		for i, v := range vals {
			maxV = max(maxV, v)
			labels.XYs = append(labels.XYs, plotter.XY{X: v, Y: float64(i) + 0.22 - float64(ki)*0.44})
			labels.Labels = append(labels.Labels, fmt.Sprintf(" %.2fx", v))
		}
	}
	lb, err := plotter.NewLabels(labels)
	if err != nil {
		return nil, err
	}
	for i := range lb.TextStyle {
		lb.TextStyle[i].YAlign = draw.YCenter
	}
	p.Add(lb)
	even, err := plotter.NewLine(plotter.XYs{{X: 1, Y: -0.5}, {X: 1, Y: float64(n) - 0.5}})
	if err != nil {
		return nil, err
	}
	even.Color = colorTarget
	even.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(even)
	p.Legend.Add("1x: as good as Debezium", even)
	p.Legend.Top = true
	p.NominalY(rev...)
	p.X.Min, p.X.Max = 0, maxV*1.2
	p.Add(plotter.NewGrid())
	return p, nil
}
