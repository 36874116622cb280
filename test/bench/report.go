package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Targets the product states (docs/benchmarks.md repeats them next to the numbers).
const (
	targetSingleShardRate = 50_000.0 // events/s
	targetVsTuned         = 5.0      // single-shard relay / tuned baseline
	targetP99Ms           = 20.0     // at 2,000 events/s
	targetRSSMiB          = 64.0
	targetBacklogRatio    = 0.8 // a large backlog or kept sent rows may cost at most 20% (noise)
)

// row is one line of the result table.
type row struct {
	Measurement string
	Value       string
	VsTuned     string
	Target      string
	Verdict     string // "met", "MISSED" or ""
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// resultRows turns the results into the table both the terminal and the document show.
func resultRows(res *Results) []row {
	var rows []row
	tuned := res.drain(keyTuned)
	small := res.drain(keySmall)
	allUp := res.drain(keyShardsUp)
	for _, d := range res.Drains {
		r := row{Measurement: d.Name}
		if !d.Measured {
			r.Value = "not measured"
			if d.Err != "" {
				r.Value = "failed: " + firstLine(d.Err, 60)
			}
			rows = append(rows, r)
			continue
		}
		r.Value = fmtInt(d.Rate) + " events/s"
		vs := math.NaN()
		// Ratios only within one run: not against a tuned baseline a merged run did not measure.
		if tuned != nil && tuned.Measured && sameRun(tuned.MergedRun, d.MergedRun) {
			vs = d.Rate / tuned.Rate
			r.VsTuned = fmt.Sprintf("%.2fx", vs)
		}
		switch d.Key {
		case keyRelay1:
			r.Target = fmt.Sprintf(">= %s/s and >= %.0fx tuned", fmtInt(targetSingleShardRate), targetVsTuned)
			r.Verdict = verdict(d.Rate >= targetSingleShardRate && !math.IsNaN(vs) && vs >= targetVsTuned)
		case keyLarge, keyBurst, keyRetention:
			if small != nil && small.Measured {
				ratio := d.Rate / small.Rate
				r.Target = fmt.Sprintf(">= %.1fx the %s rate (is %.2fx)", targetBacklogRatio, shortName(small), ratio)
				r.Verdict = verdict(ratio >= targetBacklogRatio)
			}
		case keyShardsDown:
			if allUp != nil && allUp.Measured {
				ratio := d.Rate / allUp.Rate
				r.Target = fmt.Sprintf(">= %.1fx the all-up rate (is %.2fx)", targetShardDownRatio, ratio)
				r.Verdict = verdict(ratio >= targetShardDownRatio)
			}
		}
		rows = append(rows, r)
	}
	if l := res.Latency; l != nil {
		r := row{Measurement: fmt.Sprintf("latency p50 / p95 / p99 / max at %s events/s (default settings: polling every %.0f ms)", fmtInt(l.Rate), l.PollMs)}
		if l.Measured {
			r.Value = fmt.Sprintf("%.1f / %.1f / %.1f / %.1f ms", l.P50, l.P95, l.P99, l.Max)
			r.Target = fmt.Sprintf("p99 <= %.0f ms", targetP99Ms)
			r.Verdict = verdict(l.P99 <= targetP99Ms)
		} else {
			r.Value = "failed: " + firstLine(l.Err, 60)
		}
		rows = append(rows, r)
	}
	if a := res.Append; a != nil {
		if a.Measured {
			rows = append(rows,
				row{Measurement: "transaction with outbox.Append vs with a plain INSERT",
					Value: fmt.Sprintf("%.0f us vs %.0f us (%.2fx)", a.AppendUS, a.InsertUS, a.Ratio)},
				row{Measurement: "outbox.Append added to a business transaction",
					Value: fmt.Sprintf("+%.0f us per event (%.0f -> %.0f us)", a.OverheadUS, a.InsertUS, a.BothUS)})
			if a.RowUS > 0 { // runs before this field existed have none
				rows = append(rows, row{Measurement: "of which the event's row itself (inserted by hand, no Append), and its WAL",
					Value: fmt.Sprintf("%.0f us (%.2fx); %.0f vs %.0f WAL bytes per transaction", a.RowUS, a.RowRatio, a.RowWAL, a.InsertWAL)})
			}
		} else {
			rows = append(rows, row{Measurement: "outbox.Append overhead", Value: "failed: " + firstLine(a.Err, 60)})
		}
	}
	rows = append(rows, writePathRows(res)...)
	rows = append(rows, snapshotRows(res)...)
	rows = append(rows, debeziumRows(res)...)
	rows = append(rows, idleShardRows(res)...)
	for _, rs := range []*ReshardResult{res.Reshard, res.ReshardSnapshot} {
		if rs == nil {
			continue
		}
		r := row{Measurement: fmt.Sprintf("reshard publishing pause, largest of %d changes under load, %s tracking", len(reshardSteps), trackingName(rs.Snapshot))}
		if rs.Measured {
			r.Value = fmt.Sprintf("%.0f ms", rs.MaxPauseMs)
			r.Target = fmt.Sprintf("<= %.0f ms", targetReshardPauseMs)
			r.Verdict = verdict(rs.MaxPauseMs <= targetReshardPauseMs)
		} else {
			r.Value = "failed: " + firstLine(rs.Err, 60)
		}
		rows = append(rows, r)
	}
	for _, k := range []struct{ key, what string }{
		{keyRelay1, "relay peak RSS (VmHWM), 1 shard, " + drainSize(res) + " drain"},
		{keyRelay4, "relay peak RSS (VmHWM), 4 shards, largest process"},
		{keyLarge, "relay peak RSS (VmHWM), " + largeSize(res) + " pending drains"},
		{keySnap1, "relay peak RSS (VmHWM), 1 shard, snapshot tracking, " + drainSize(res) + " drain"},
		{keySnap4, "relay peak RSS (VmHWM), 4 shards, snapshot tracking, largest process"},
		{keyLarge + "-snapshot", "relay peak RSS (VmHWM), " + largeSize(res) + " pending drains, snapshot tracking"},
	} {
		d := res.drain(k.key)
		if d == nil || !d.Measured || d.PeakRSS == 0 {
			continue
		}
		peak := d.PeakRSS
		if b := res.drain(strings.Replace(k.key, keyLarge, keyBurst, 1)); strings.HasPrefix(k.key, keyLarge) && b != nil && b.Measured {
			peak = max(peak, b.PeakRSS) // the same process, later: its VmHWM covers both
		}
		mib := float64(peak) / (1 << 20)
		rows = append(rows, row{Measurement: k.what, Value: fmt.Sprintf("%.1f MiB", mib),
			Target: fmt.Sprintf("<= %.0f MiB", targetRSSMiB), Verdict: verdict(mib <= targetRSSMiB)})
	}
	return rows
}

// sameRun reports whether two drains were measured in the same run (MergedRun).
func sameRun(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

func drainSize(res *Results) string { return count(res.Config.backlog) }
func largeSize(res *Results) string { return count(res.Config.largePending) }

func shortName(d *DrainResult) string {
	return strings.TrimPrefix(d.Name, "relay, ")
}

// printTable writes the result table to the terminal.
func printTable(w io.Writer, res *Results) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MEASUREMENT\tRESULT\tVS TUNED\tTARGET\t")
	for _, r := range resultRows(res) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Measurement, r.Value, r.VsTuned, r.Target, r.Verdict)
	}
	_ = tw.Flush()
	if cpu := cpuRows(res); len(cpu) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "CPU (cores busy)\twall s\tmachine\tpublisher\tPostgreSQL\tKafka\tother\tCPU us/event\t")
		for _, c := range cpu {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7])
		}
		_ = tw.Flush()
	}
	for _, n := range res.Notes {
		fmt.Fprintln(w, "note:", n)
	}
}

// cpuRows shows, per measured drain or the latency run, how many cores each part kept busy
// on average, and the CPU time our components spent per event.
func cpuRows(res *Results) [][]string {
	var out [][]string
	add := func(name string, u *CPUUsage, events float64, relay bool) {
		if u == nil || u.Wall <= 0 {
			return
		}
		pub := u.Bench
		if relay {
			pub = u.Relay
		}
		cores := func(s float64) string { return fmt.Sprintf("%.2f", s/u.Wall) }
		ours := pub + u.Postgres + u.Kafka
		perEvent := ""
		if events > 0 {
			perEvent = fmt.Sprintf("%.0f", ours/events*1e6)
		}
		out = append(out, []string{name, fmt.Sprintf("%.1f", u.Wall), cores(u.Machine), cores(pub),
			cores(u.Postgres), cores(u.Kafka), cores(u.Other()), perEvent})
	}
	for _, d := range res.Drains {
		if d.Measured && d.CPU != nil {
			add(d.Name, d.CPU, float64(d.Events), strings.HasPrefix(d.Key, "relay"))
		}
	}
	if l := res.Latency; l != nil && l.Measured && l.CPU != nil {
		add(fmt.Sprintf("latency run at %s events/s", fmtInt(l.Rate)), l.CPU, l.Achieved*l.CPU.Wall, true)
	}
	return out
}

// writeMarkdown writes docs/benchmarks.md.
func writeMarkdown(path string, res *Results) error {
	var b strings.Builder
	m := res.Machine
	cfg := res.Config
	fmt.Fprintf(&b, "# Benchmarks\n\n")
	fmt.Fprintf(&b, "<!-- Generated by `make bench` (hack/bench.sh, which runs `go run ./test/bench`). Do not edit by hand: run it again. -->\n\n")
	if res.Scale != 1 {
		fmt.Fprintf(&b, "> **Quick run at scale %g**: sizes and durations are %g times the full benchmark's. `make bench` runs the full sizes.\n\n", res.Scale, res.Scale)
	}
	fmt.Fprintf(&b, "The relay against the classic hand-written outbox worker, on a real PostgreSQL server and a real Apache Kafka broker, "+
		"all started by the benchmark on one machine and measured in one run. The machine is shared with other builds and tests, "+
		"so absolute numbers are noisy: read the ratios against the tuned baseline measured in the same run.\n\n")

	var other, wall float64
	for _, d := range res.Drains {
		if d.Measured && d.CPU != nil {
			other, wall = other+d.CPU.Other(), wall+d.CPU.Wall
		}
	}
	if wall > 0 {
		fmt.Fprintf(&b, "> In this run, other work on the machine kept on average %.2f of its %d cores busy during the drain measurements; "+
			"PostgreSQL, Kafka and the publishers competed for the rest.\n\n", other/wall, m.CPUs)
	}
	fmt.Fprintf(&b, "## Machine\n\n| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| CPUs (`nproc`) | %d (%s) |\n", m.CPUs, orDash(m.CPUModel))
	fmt.Fprintf(&b, "| memory | %.1f GiB |\n", m.MemoryGiB)
	fmt.Fprintf(&b, "| kernel | %s |\n", orDash(m.Kernel))
	fmt.Fprintf(&b, "| PostgreSQL | %s, `fsync=off`, `synchronous_commit=off`, `shared_buffers=256MB` (the test server's settings), `track_commit_timestamp=on` |\n", orDash(m.Postgres))
	jvm := "the tests' JVM settings (serial collector, C1 only)"
	if m.KafkaJVM != "" {
		jvm = "JVM `" + m.KafkaJVM + "`"
	}
	fmt.Fprintf(&b, "| Kafka | %s, replication factor 1, %d partitions per topic, %s |\n", orDash(m.Kafka), cfg.partitions, jvm)
	fmt.Fprintf(&b, "| Go | %s |\n", m.Go)
	fmt.Fprintf(&b, "| date | %s, run took %s |\n", m.Date.Format("2006-01-02 15:04 MST"), res.Finished.Sub(res.Started).Round(time.Second))
	fmt.Fprintf(&b, "| load average at start | %s (other work on the machine) |\n", orDash(m.LoadAvg))
	for _, mr := range res.Merged {
		broker := ""
		if mr.KafkaJVM != m.KafkaJVM && mr.KafkaJVM != "" {
			broker = ", broker JVM `" + mr.KafkaJVM + "`"
		}
		fmt.Fprintf(&b, "| merged in | %s, measured %s (took %s, load average at start %s%s): their figures replace this run's |\n",
			strings.Join(mr.Scenarios, ", "), mr.Started.Format("2006-01-02 15:04 MST"), mr.Finished.Sub(mr.Started).Round(time.Second), orDash(mr.LoadAvg), broker)
	}
	fmt.Fprintln(&b)

	fmt.Fprintf(&b, "## Results\n\n")
	fmt.Fprintf(&b, "| measurement | result | vs tuned baseline | target | |\n|---|---:|---:|---|---|\n")
	for _, r := range resultRows(res) {
		v := r.Verdict
		if v == "MISSED" {
			v = "**missed**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", mdEscape(r.Measurement), mdEscape(r.Value), r.VsTuned, mdEscape(r.Target), v)
	}
	fmt.Fprintf(&b, "\n![drain rates and latency percentiles](benchmarks.png)\n\n")
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "> Note: %s\n\n", mdEscape(n))
	}

	if cpu := cpuRows(res); len(cpu) > 0 {
		fmt.Fprintf(&b, "## Where the CPU went\n\n")
		fmt.Fprintf(&b, "Average cores kept busy during each measurement, from `/proc`: *publisher* is the relay processes "+
			"(or, for the baselines, the benchmark process that runs the worker), *other* is every other process on the machine "+
			"(other engineers' work, and PostgreSQL backends that exited during the window). "+
			"*CPU µs/event* is publisher + PostgreSQL + Kafka CPU time per event.\n\n")
		fmt.Fprintf(&b, "| measurement | wall s | machine | publisher | PostgreSQL | Kafka | other | CPU µs/event |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range cpu {
			fmt.Fprintf(&b, "| %s |\n", strings.Join(c, " | "))
		}
		fmt.Fprintln(&b)
	}

	writeWritePath(&b, res)
	writeCompression(&b, res)
	writeEnvelopes(&b, res)
	if res.Reshard != nil || res.ReshardSnapshot != nil {
		fmt.Fprintf(&b, "## Resharding\n\n")
		for _, rs := range []*ReshardResult{res.Reshard, res.ReshardSnapshot} {
			if rs != nil {
				writeReshard(&b, rs)
			}
		}
	}

	writeDebezium(&b, res)
	writeTxnCost(&b, res)
	writeIdle(&b, res)

	fmt.Fprintf(&b, "## What limits these numbers\n\n%s\n", limitsText(res))

	fmt.Fprintf(&b, "## Method\n\n")
	size := "about 150 bytes of JSON and a W3C `traceparent` header"
	if res.PayloadBytes > 0 {
		size = fmt.Sprintf("%.0f bytes of JSON on average and a W3C `traceparent` header (%.0f bytes of headers as stored)", res.PayloadBytes, res.HeaderBytes)
	}
	fmt.Fprintf(&b, "Every generated event is an `order` event with a payload of %s, "+
		"keyed by one of %s aggregate ids, in `public.outbox` with daily partitions (`outboxdb.Apply`, `outboxdb.EnsurePartitions`). "+
		"The end of every drain is the PostgreSQL commit timestamp of the transaction that marked the last row "+
		"(`max(pg_xact_commit_timestamp(xmin))`), so neither the publisher's nor the harness's polling changes the result.\n\n", size, fmtInt(float64(cfg.aggregates)))
	for _, d := range res.Drains {
		fmt.Fprintf(&b, "- **%s**: %s.", mdEscape(d.Name), d.Method)
		if d.Plan != "" {
			fmt.Fprintf(&b, " `EXPLAIN` of the relay's fetch right after the commit (the statement relay.FetchSQL builds, with a batch "+
				"of ids in flight, planned for those values; the relay's prepared statement may later switch to a generic plan): `%s`.", d.Plan)
		}
		if len(d.Rounds) > 1 {
			var rs []string
			for _, r := range d.Rounds {
				rs = append(rs, fmtInt(r))
			}
			fmt.Fprintf(&b, " Rounds: %s events/s.", strings.Join(rs, ", "))
		}
		fmt.Fprintln(&b)
	}
	fmt.Fprintf(&b, "- **Baselines**: the classic worker, every 200 ms `BEGIN; SELECT ... FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED; "+
		"kafka-go WriteMessages; UPDATE ... SET sent_at = now() WHERE id = ANY($1); COMMIT`. *Defaults*: n = 100 and `kafka.Writer{Addr, Topic}` "+
		"(round-robin balancer, BatchSize 100, BatchTimeout 1 s, RequiredAcks none). *Tuned*: n = 1,000, BatchSize 1,000, BatchTimeout 1 ms, "+
		"RequireAll, Murmur2Balancer, no sleep while batches come back full.\n")
	fmt.Fprintf(&b, "- **Relay**: `go build ./cmd/relay`, run as a subprocess exactly as its Deployment runs it "+
		"(`OUTBOX_DATABASE_URL` in the environment, `--table --shard-count --shard-index --brokers --topic-map --http-addr`), default settings")
	if cfg.relayBatch > 0 {
		fmt.Fprintf(&b, " except `--batch-size %d` in the drain scenarios", cfg.relayBatch)
	}
	fmt.Fprintf(&b, ". Peak RSS is `VmHWM` from `/proc/<pid>/status`, read at the end of the drain.\n")
	if l := res.Latency; l != nil {
		fmt.Fprintf(&b, "- **Latency**: %d writers commit one event per transaction on a fixed schedule of %s events/s for %s "+
			"(the first %s are warm-up and not counted); a single-shard relay with default settings (polling every %.0f ms, "+
			"the table without insert trigger) publishes; an independent franz-go consumer records each event's arrival. Latency is "+
			"arrival minus the moment the writer sent COMMIT. It runs again with the relay woken by notifications (`--notify=true`, "+
			"the table with its insert trigger: wake-ups on demand), with every insert notifying as before those (another session "+
			"holds a standing claim), and under snapshot tracking polling and notified. After each run the relay stays idle for %s: "+
			"the CPU of its PostgreSQL backends then is what waiting for the next event costs the database.",
			l.Writers, fmtInt(l.Rate), cfg.latencyDuration, cfg.latencyWarmup, l.PollMs, latencyIdle)
		if l.Measured {
			fmt.Fprintf(&b, " The writers achieved %s events/s; %s events were measured; %d duplicates were received. "+
				"From commit to the record's timestamp (set by the relay when it sends the produce request, in whole milliseconds) "+
				"took p50 %.0f ms and p99 %.0f ms: the relay's share; the rest is the broker's acknowledgement and the consumer's fetch.",
				fmtInt(l.Achieved), fmtInt(float64(l.Events)), l.Duplicates, l.PickupP50, l.PickupP99)
		}
		fmt.Fprintln(&b)
	}
	if a := res.Append; a != nil {
		fmt.Fprintf(&b, "- **Append**: one connection, %s transactions of each shape (`BEGIN; INSERT INTO orders ... RETURNING id; COMMIT`, "+
			"`BEGIN; outbox.Append; COMMIT`, both in one transaction, and the event's row inserted by hand: `BEGIN; INSERT INTO outbox ... VALUES ... RETURNING ...; COMMIT`), "+
			"interleaved transaction by transaction (the order rotating) after a warm-up pass of 1,000 of each alone that also measures "+
			"its WAL bytes; no relay running. "+
			"Append includes its validation, the aggregate's advisory lock and the insert trigger (no relay waits, so it does not notify). "+
			"Measured on the test server (`fsync=off`: the CPU cost) and on the durable one (what a production commit sees).\n", fmtInt(float64(a.N)))
	}
	fmt.Fprintf(&b, "\n## Reproduce\n\n```sh\nmake bench                                   # full sizes, writes docs/benchmarks.md and .png\n"+
		"go run ./test/bench -scale 0.1 -out /tmp/bench  # quick run; -h lists every flag\n"+
		"go run ./test/bench -report-from docs/benchmarks.json  # the report again from the last full run\n"+
		"go run ./test/bench -scenarios debezium -out /tmp/bench  # the side by side with Debezium alone (hack/debezium.sh)\n"+
		"go run ./test/bench -scenarios idle -scale 0.1 -statements 10 -out /tmp/bench  # 10 idle shards, with their most called statements\n"+
		"go run ./test/bench -scenarios drain -drains relay-snapshot-4 -statements 10 -out \"\"  # one drain, with the statements that cost PostgreSQL most\n```\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// limitsText is the honest paragraph: what the measurements say bounds each number.
func limitsText(res *Results) string {
	var p []string
	cpus := res.Machine.CPUs
	p = append(p, fmt.Sprintf("Everything runs on the same %d cores: PostgreSQL, the Kafka broker (a JVM), the publisher and the "+
		"benchmark's own polling, next to whatever else the machine is doing. A drain rate here is therefore the rate at which these "+
		"components together saturate %d cores, not the rate one relay would reach against a separate database server and "+
		"a separate broker, where the relay's own CPU share (the *publisher* column) is what it would need.", cpus, cpus))
	if d := res.drain(keyRelay1); d != nil && d.Measured && d.CPU != nil {
		u := d.CPU
		part, share := dominant(u)
		p = append(p, fmt.Sprintf("During the single-shard drain the machine was %.0f%% busy (%.2f of %d cores); %s took the largest share "+
			"(%.2f cores). The relay itself used %.2f cores, about %.0f µs of CPU per event.",
			100*u.Machine/u.Wall/float64(cpus), u.Machine/u.Wall, cpus, part, share/u.Wall, u.Relay/u.Wall, u.Relay/float64(d.Events)*1e6))
	}
	if d1, tb := res.drain(keyRelay1), res.drain(keyTuned); d1 != nil && tb != nil && d1.Measured && tb.Measured && d1.CPU != nil && tb.CPU != nil {
		per := func(sec float64, n int64) float64 { return sec / float64(n) * 1e6 }
		relayPG, tunedPG := per(d1.CPU.Postgres, d1.Events), per(tb.CPU.Postgres, tb.Events)
		text := fmt.Sprintf("Per event, PostgreSQL spent %.0f µs of CPU for the single-shard relay against %.0f µs for the tuned "+
			"baseline, the broker %.0f against %.0f µs, and the publisher itself %.0f against %.0f µs (the baseline's worker runs in "+
			"the benchmark process).", relayPG, tunedPG,
			per(d1.CPU.Kafka, d1.Events), per(tb.CPU.Kafka, tb.Events),
			per(d1.CPU.Relay, d1.Events), per(tb.CPU.Bench, tb.Events))
		if (relayPG > tunedPG) == (d1.Rate < tb.Rate) {
			text += " With the cores this contended, the publisher that asks less of PostgreSQL per event drains faster."
		}
		p = append(p, text)
	}
	if c, tb, d1 := res.drain(keyCeiling), res.drain(keyTuned), res.drain(keyRelay1); c != nil && tb != nil && c.Measured && tb.Measured {
		text := fmt.Sprintf("PostgreSQL alone, locking, reading and marking the rows in one statement per %s rows and publishing nothing, "+
			"drained %s events/s on one connection, %.2fx the tuned baseline.", fmtInt(ceilingBatch), fmtInt(c.Rate), c.Rate/tb.Rate)
		if c.CPU != nil && c.Events > 0 && c.CPU.Postgres > 0 {
			perEvent := c.CPU.Postgres / float64(c.Events) // seconds of PostgreSQL CPU
			bound := float64(cpus) / perEvent
			text += fmt.Sprintf(" It spent %.0f µs of PostgreSQL CPU per event. Every publisher that marks each row sent, the relay and "+
				"the baselines alike, needs at least that work per event, so on %d cores none can drain more than %s events/s, even with "+
				"a broker and a publisher that cost nothing and PostgreSQL spread over every core.", perEvent*1e6, cpus, fmtInt(bound))
			if want := targetVsTuned * tb.Rate; want > bound {
				text += fmt.Sprintf(" %.0fx the tuned baseline is %s events/s, %.2fx that bound: out of reach on this machine for any "+
					"publisher that marks rows one by one.", targetVsTuned, fmtInt(want), want/bound)
			}
		}
		if d1 != nil && d1.Measured {
			text += fmt.Sprintf(" The single-shard relay drained at %.2fx the rate of PostgreSQL alone.", d1.Rate/c.Rate)
		}
		p = append(p, text)
	}
	if d1, d4 := res.drain(keyRelay1), res.drain(keyRelay4); d1 != nil && d4 != nil && d1.Measured && d4.Measured {
		ratio := d4.Rate / d1.Rate
		if ratio < 1.5 {
			p = append(p, fmt.Sprintf("Four shards drain at %.2fx the rate of one: with %d cores already busy, more relay processes "+
				"add parallel fetches and marks but no CPU to run them; shards pay off when PostgreSQL and Kafka have cores to spare.", ratio, cpus))
		} else {
			p = append(p, fmt.Sprintf("Four shards drain at %.2fx the rate of one.", ratio))
		}
	}
	if sm, l := res.drain(keySmall), res.drain(keyLarge); sm != nil && l != nil && sm.Measured && l.Measured && l.Rate < targetBacklogRatio*sm.Rate {
		p = append(p, fmt.Sprintf("The %s backlog drained at %.2fx the rate of the %s rounds. Marking a row sent leaves its entry in the "+
			"pending index until a vacuum removes it, and the entries of sent rows sit in front of the pending ones: a drain of "+
			"millions of rows lays a growing run of them that every fetch walks over before it reaches a pending row, so a batch "+
			"costs more the further the drain has come, until autovacuum processes the partition. Short rounds never build such a run.",
			count(res.Config.largePending), l.Rate/sm.Rate, count(res.Config.smallPending)))
	}
	if l, bu := res.drain(keyLarge), res.drain(keyBurst); l != nil && bu != nil && l.Measured && bu.Measured && bu.Rate < 0.5*l.Rate {
		p = append(p, fmt.Sprintf("A backlog committed in one burst drains at %.2fx the rate of the same backlog with current statistics. "+
			"The planner meets it with the statistics of a quiet table, in which no row is pending; `EXPLAIN` of the relay's fetch then gives "+
			"`%s` instead of walking the pending index in id order: every batch reads and sorts the whole backlog, so the cost per batch "+
			"grows with the backlog until the partition is analyzed again (autovacuum looks every minute, then has to get to it) and the plan becomes `%s`.",
			bu.Rate/l.Rate, orDash(bu.Plan), orDash(l.Plan)))
	}
	if sm, rt := res.drain(keySmall), res.drain(keyRetention); sm != nil && rt != nil && sm.Measured && rt.Measured && len(sm.Rounds) > 1 && len(rt.Rounds) > 1 {
		overlap := slices.Min(rt.Rounds) <= slices.Max(sm.Rounds) && slices.Min(sm.Rounds) <= slices.Max(rt.Rounds)
		text := fmt.Sprintf("With %s sent rows kept, the small rounds drained at %.2fx the rate without them (rounds %s to %s against %s to %s events/s).",
			count(res.Config.sentRows), rt.Rate/sm.Rate, fmtInt(slices.Min(rt.Rounds)), fmtInt(slices.Max(rt.Rounds)),
			fmtInt(slices.Min(sm.Rounds)), fmtInt(slices.Max(sm.Rounds)))
		if overlap {
			text += " The ranges overlap: on this machine the difference is within the noise of single rounds."
		}
		p = append(p, text)
	}
	p = append(p, "The test PostgreSQL runs with `fsync=off` and `synchronous_commit=off`, and the broker has one replica on the "+
		"loopback interface, so `acks=all` costs one local write: commits and acknowledgements are cheaper than on production "+
		"storage and a network, which favours every publisher alike.")
	if l := res.Latency; l != nil && l.Measured && l.CPU != nil && l.CPU.Wall > 0 {
		u := l.CPU
		c := func(v float64) float64 { return v / u.Wall }
		text := fmt.Sprintf("During the latency run at %s events/s the machine was %.0f%% busy (%.2f of %d cores): PostgreSQL %.2f cores",
			fmtInt(l.Rate), 100*c(u.Machine)/float64(cpus), c(u.Machine), cpus, c(u.Postgres))
		if u.PostgresRelay > 0 {
			text += fmt.Sprintf(", of which the relay's two connections %.2f and the writers' %s single-event transactions a second the other %.2f",
				c(u.PostgresRelay), fmtInt(l.Rate), c(u.Postgres-u.PostgresRelay))
		}
		text += fmt.Sprintf("; the broker %.2f; the benchmark process (writers and consumer) %.2f; the relay process %.2f.",
			c(u.Kafka), c(u.Bench), c(u.Relay))
		if load := c(u.Postgres-u.PostgresRelay) + c(u.Bench); u.PostgresRelay > 0 && load > 0.5*float64(cpus) {
			text += fmt.Sprintf(" Producing the load took %.2f cores by itself, so every process waited for a core, and each step of an event's "+
				"path (the writer's commit, the wake-up, the fetch, the produce, the consumer's fetch) queued behind the others.", load)
		}
		p = append(p, text)
	}
	if l := res.Latency; l != nil && l.Measured {
		p = append(p, fmt.Sprintf("Latency at %s events/s is the relay's poll (every %.0f ms, the default), its fetch, the produce with "+
			"`acks=all`, and the consumer's fetch. Of p50 %.1f ms and p99 %.1f ms from commit to consumer, p50 %.0f ms and p99 %.0f ms "+
			"passed before the relay sent the produce request (the record's timestamp): the time is spent before the broker sees "+
			"the event, while the relay waits for its next poll, fetches on a PostgreSQL that shares the cores, or waits for the batch in flight.",
			fmtInt(l.Rate), l.PollMs, l.P50, l.P99, l.PickupP50, l.PickupP99))
	}
	return strings.Join(p, "\n\n") + "\n"
}

// dominant names the component that used the most CPU during a measurement.
func dominant(u *CPUUsage) (string, float64) {
	name, v := "PostgreSQL", u.Postgres
	if u.Kafka > v {
		name, v = "the Kafka broker", u.Kafka
	}
	if u.Relay > v {
		name, v = "the relay", u.Relay
	}
	if u.Other() > v {
		name, v = "other processes on the machine", u.Other()
	}
	return name, v
}

func fmtInt(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	s := fmt.Sprintf("%d", int64(math.Round(v)))
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

func firstLine(s string, n int) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func trackingName(snapshot bool) string {
	if snapshot {
		return "snapshot"
	}
	return "row"
}

// writeReshard writes the section on the publishing pause of a reshard.
func writeReshard(b *strings.Builder, rs *ReshardResult) {
	fmt.Fprintf(b, "### %s tracking\n\n", strings.ToUpper(trackingName(rs.Snapshot)[:1])+trackingName(rs.Snapshot)[1:])
	fmt.Fprintf(b, "%d relays run with `--shard-count=0` (following the table's shard layout, as the operator runs them) and shard indexes 0 to %d; "+
		"%d writers commit one event per transaction at %s events/s over %s aggregates while `outboxdb.Reshard` moves the layout "+
		"1 -> 4 -> 2 -> 1 shards, %s apart. The pause is measured in PostgreSQL: `released_at` to `resumed_at` of the layout row, "+
		"from the first relay of the old layout releasing its buckets to every bucket held by the new layout.\n\n",
		rs.Relays, rs.Relays-1, reshardWriters, fmtInt(rs.Rate), fmtInt(float64(rs.Aggregates)), reshardDwell)
	if !rs.Measured && len(rs.Changes) == 0 {
		fmt.Fprintf(b, "Not measured: %s\n\n", mdEscape(firstLine(rs.Err, 200)))
		return
	}
	fmt.Fprintf(b, "| change | publishing pause | request to resumed |\n|---|---:|---:|\n")
	for _, c := range rs.Changes {
		fmt.Fprintf(b, "| %d -> %d shards | %.0f ms | %.0f ms |\n", c.From, c.To, c.PauseMs, c.TotalMs)
	}
	v := "met"
	if rs.MaxPauseMs > targetReshardPauseMs {
		v = "**missed**"
	}
	fmt.Fprintf(b, "\nLargest pause: %.0f ms, against a target of at most %.0f ms: %s.", rs.MaxPauseMs, targetReshardPauseMs, v)
	if rs.Measured {
		fmt.Fprintf(b, " The writers achieved %s events/s; the independent consumer received %s of the %s events written "+
			"(%d duplicates, %d out of order within an aggregate).",
			fmtInt(rs.Achieved), fmtInt(float64(rs.Received)), fmtInt(float64(rs.Written)), rs.Duplicates, rs.OutOfOrder)
	} else {
		fmt.Fprintf(b, " The scenario then failed: %s.", mdEscape(firstLine(rs.Err, 200)))
	}
	fmt.Fprintf(b, "\n\n")
}
