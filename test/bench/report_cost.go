package main

import (
	"fmt"
	"strings"
)

// costMethod says, in the report, how the cost per event is counted.
const costMethod = "Each counter comes from an observer independent of the publisher, never from its own metrics, over the " +
	"latency run's counting window (from the end of the warm-up to the arrival of the last event). **Statements**: the calls " +
	"`pg_stat_statements` records for the publisher's role: the relays and Debezium connect as their own role (`" + publisherRole +
	"`, a superuser as the writers' is), the writers and the bench's observers as `postgres`, so the writers' inserts and the " +
	"observers' reads are not counted; `BEGIN` and `COMMIT` count, as round trips do; Debezium's walsender runs replication " +
	"commands, which `pg_stat_statements` does not record, so its figure is its JDBC connection's. **Transaction ids**: the advance " +
	"of `pg_snapshot_xmax(pg_current_snapshot())` (read by the observer, which draws none) over the window, less the writers' " +
	"transactions committed in it (one per event): the publisher's, plus any autovacuum's `ANALYZE`; the floor's row checks the " +
	"counting (no publisher: about zero). **Record batches**: the batches an independent franz-go consumer read " +
	"(`kgo.HookFetchBatchRead`, one call per batch; read_committed, a transaction's markers left out) that hold measured events, a proxy of the publisher's produce requests per " +
	"partition; events per batch is the measured events they held over their number. **Broker**: the JVM's CPU, and in " +
	"brackets the part of it its JIT compiler threads spent (read per thread from `/proc`, named by `jcmd`): compiling " +
	"what the window's requests made hot, a warm-up that depends on what ran on the broker before and that a production " +
	"broker has long finished; the figure less that part is what serving the window's requests cost."

// brokerCell is the broker's CPU per event with, where its threads were read, its JIT compilers'
// part in brackets.
func brokerCell(c *CPUUsage) string {
	if len(c.KafkaThreads) == 0 {
		return fmt.Sprintf("%.0f", c.Kafka)
	}
	return fmt.Sprintf("%.0f (JIT %.0f)", c.Kafka, c.KafkaJIT())
}

// costCells is one latency run's cost per event: statements / transaction ids / record batches
// (events per batch).
func costCells(c *EventCost) string {
	st, x, eb := costParts(c)
	return st + " / " + x + " / " + eb
}

func costParts(c *EventCost) (statements, xids, batches string) {
	statements, xids, batches = "-", "-", "-"
	if v, ok := c.StatementsPerEvent(); ok {
		statements = fmt.Sprintf("%.2f", v)
	}
	if v, ok := c.XidsPerEvent(); ok {
		xids = fmt.Sprintf("%.3f", v)
	}
	if v, ok := c.EventsPerBatch(); ok {
		batches = fmt.Sprintf("%.3f (%.1f)", 1/v, v)
	}
	return statements, xids, batches
}

// runAt is the latency run at rate among runs, or nil.
func runAt(runs []*LatencyResult, rate float64) *LatencyResult {
	for _, l := range runs {
		if l != nil && l.Rate == rate {
			return l
		}
	}
	return nil
}

// costRow is one line of the cost table: a publisher (or the floor) at one rate.
type costRow struct {
	name string
	run  *LatencyResult
}

// costRows are the cost table's lines at rate: the floor, then each publisher as it runs by
// default, and each relay woken by notifications.
func costRows(d *DebeziumResult, rate float64) []costRow {
	out := []costRow{{"the floor (no publisher)", runAt(d.Floor, rate)}}
	for _, p := range d.Peers {
		if l := runAt(p.Latency, rate); l != nil {
			name := p.Name
			if p.Key != peerDebezium {
				name += ", polling"
			}
			out = append(out, costRow{name, l})
		}
		if l := runAt(p.LatencyNotify, rate); l != nil {
			out = append(out, costRow{p.Name + ", notified", l})
		}
	}
	return out
}

// writeDebeziumCost writes the table of each publisher's cost per event at each steady rate,
// the floor beside each rate.
func writeDebeziumCost(b *strings.Builder, d *DebeziumResult) {
	any := false
	for _, rate := range d.Rates {
		for _, r := range costRows(d, rate) {
			any = any || r.run != nil && r.run.Measured
		}
	}
	if !any {
		return
	}
	fmt.Fprintf(b, "### Cost per event at each steady rate\n\n%s\n\n", costMethod)
	fmt.Fprintf(b, "| rate | publisher | commit to consumer p50 / p99 | the floor p50 / p99 | CPU µs/event publisher / PostgreSQL (its backends) / broker (its JIT compilers) | statements / event | transaction ids / event | record batches / event (events per batch) |\n")
	fmt.Fprintf(b, "|---:|---|---:|---:|---:|---:|---:|---:|\n")
	for _, rate := range d.Rates {
		floor := "-"
		if f := runAt(d.Floor, rate); f != nil && f.Measured {
			floor = fmt.Sprintf("%.1f / %.1f ms", f.P50, f.P99)
		}
		for _, r := range costRows(d, rate) {
			l := r.run
			cells := []string{fmtInt(rate) + "/s", r.name}
			switch {
			case l == nil:
				continue
			case !l.Measured:
				cells = append(cells, "failed: "+firstLine(l.Err, 60), floor, "", "", "", "")
			default:
				cpu := "-"
				if c := perEventCPU(l); c != nil {
					cpu = fmt.Sprintf("%.0f / %.0f (%.0f) / %s", c.Relay, c.Postgres, c.PostgresRelay, brokerCell(c))
				}
				st, x, eb := costParts(l.Cost)
				cells = append(cells, fmt.Sprintf("%.1f / %.1f ms", l.P50, l.P99), floor, cpu, st, x, eb)
			}
			for i := range cells {
				cells[i] = mdEscape(cells[i])
			}
			fmt.Fprintf(b, "| %s |\n", strings.Join(cells, " | "))
		}
	}
	fmt.Fprintln(b)
}
