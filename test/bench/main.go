// Command bench measures the outbox relay against the classic hand-written polling worker, on
// a real PostgreSQL server and a real Apache Kafka broker that it starts itself, and writes
// docs/benchmarks.md and docs/benchmarks.png.
//
//	go run ./test/bench                 # full sizes (what hack/bench.sh and make bench run)
//	go run ./test/bench -scale 0.1 -out /tmp/bench   # a quick development run
//
// Scenarios (-scenarios, comma separated):
//
//	drain    drain rate of a backlog: tuned baseline, kafka-go-defaults baseline (windowed),
//	         relay with 1 and with 4 shards; relay peak RSS (VmHWM) during the drain
//	backlog  relay drain rate with a small and a large pending backlog, and with millions of sent
//	         rows kept in daily partitions
//	latency  commit-to-consumer latency percentiles at a steady event rate
//	append   outbox.Append's cost in the application's transaction, on one connection (on the test
//	         server and on a durable one: fsync, synchronous_commit and full_page_writes on)
//	writepath  the cost of appending under 1 to 64 concurrent writers on the durable server:
//	         throughput and p99 latency against the same transactions writing a plain table,
//	         with no relay, a relay running and a relay draining
//	reshard  publishing pause of a safe reshard (1 -> 4 -> 2 -> 1 shards) under a steady load
//	sharddown  8 shards with one stopped and its 1M events pending: the other shards' drain rate
//	         against the run where every shard is up
//	debezium Debezium's PostgreSQL connector with its Outbox Event Router on Kafka Connect
//	         (hack/debezium.sh) side by side with the relay in both tracking modes, on a durable
//	         server with wal_level=logical: cold start, drain of a backlog, latency at each
//	         -peer-rates (statements, transaction ids and Kafka record batches per event, counted
//	         by observers independent of the publishers: cost.go), CPU per event by process, peak
//	         RSS, and every event checked on the topic (skipped with a note where Java or Maven is
//	         missing)
//	idle     100 idle shards (50 outbox tables x 2 relays) on one database, polling and notified:
//	         PostgreSQL's CPU and the relays' statements per second idle and fed 1 event/s per
//	         relay, and the first event after a 10-minute idle (idle.go)
//
// The relay runs as a subprocess built from ./cmd/relay (or -relay), configured exactly as its
// Deployment would be. Everything shares the machine, so the report gives ratios against the
// tuned baseline measured in the same run.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
)

// config is what a run measures; the sizes follow -scale unless set explicitly.
type config struct {
	scale             float64
	out               string
	jsonOut           string
	reportFrom        string
	mergeInto         string
	relayBin          string
	scenarios         map[string]bool
	drains            map[string]bool // drain variants to run (nil: all)
	writeStates       map[string]bool // write-path relay states to run (nil: all)
	statements        int             // print this many top statements of each relay drain (pg_stat_statements)
	relayBatch        int
	partitions        int32
	aggregates        int
	backlog           int64
	stuck             int64
	downRounds        int
	smallPending      int64
	largePending      int64
	sentRows          int64
	retentionDays     int
	rounds            int
	burstLimit        time.Duration
	defaultsWindow    time.Duration
	latencyRate       float64
	latencyDuration   time.Duration
	latencyWarmup     time.Duration
	appendN           int
	writeRound        time.Duration
	writeRounds       int
	writeTargetRounds int
	writeBacklog      int64
	peerRates         []float64 // latency rates of the debezium scenario
	// peerRounds more windows of each default-delivery publisher at each of roundRates, in
	// rounds that interleave the publishers, after their own runs (rounds.go).
	peerRounds  int
	roundRates  []float64
	peers       map[string]bool // publishers of the debezium scenario to run (nil: all)
	latencyDump string          // diagnostic: directory for one CSV of per-event times per latency run
	// latencyEvents is the fewest events a latency run commits: a low rate runs longer than
	// latencyDuration (at 50 events/s, 25s would give the percentiles and the counts per event
	// barely a thousand events).
	latencyEvents int
	// The idle scenario: outbox tables (of idleShardsPerTable shards each), its windows, its modes.
	idleTables                    int
	idleWindow, idleLong, idleFed time.Duration
	idleModes                     []string
}

var allScenarios = []string{"drain", "backlog", "latency", "envelopes", "append", "writepath", "reshard", "sharddown", "debezium", "txncost", "idle"}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var c config
	var scenarios string
	fs.Float64Var(&c.scale, "scale", 1, "multiply every size and duration (0.1 for a quick run)")
	fs.StringVar(&c.out, "out", "docs", "directory for benchmarks.md and benchmarks.png (empty: stdout only)")
	fs.StringVar(&c.jsonOut, "json", "", "also write the raw results as JSON to this file")
	fs.StringVar(&c.reportFrom, "report-from", "", "measure nothing: write the report from a -json file of an earlier run (pass that run's sizing flags; with -merge-into, that run's -scenarios)")
	fs.StringVar(&c.mergeInto, "merge-into", "", "put the results of the scenarios run into a -json file of an earlier full run, and report the whole (pass that run's sizing flags; -json FILE writes the merged results)")
	fs.StringVar(&c.relayBin, "relay", "", "relay binary to run (default: go build ./cmd/relay)")
	fs.StringVar(&scenarios, "scenarios", strings.Join(allScenarios, ","), "scenarios to run")
	fs.IntVar(&c.relayBatch, "relay-batch-size", 0, "--batch-size for the relay in the drain scenarios (0: the relay's default)")
	writeStates := fs.String("write-states", "", "write-path relay states to run (e.g. none,poll; empty: all)")
	drains := fs.String("drains", "", "drain variants to run, by key (e.g. relay-snapshot-1,relay-snapshot-4; empty: all; the others are reported as not measured)")
	fs.IntVar(&c.statements, "statements", 0, "diagnostic: print the top N statements by execution time of each relay drain, and of each drain and latency run of the debezium scenario (loads pg_stat_statements), and the idle scenario's most called statements of each mode")
	partitions := fs.Int("partitions", 6, "partitions of each topic")
	fs.IntVar(&c.aggregates, "aggregates", 50_000, "distinct aggregate ids in generated backlogs")
	fs.Int64Var(&c.backlog, "backlog", 0, "drain backlog size (default 1,000,000 x scale)")
	fs.Int64Var(&c.stuck, "stuck", 0, "pending events of the stopped shard in the sharddown scenario (default 1,000,000 x scale)")
	fs.IntVar(&c.downRounds, "sharddown-rounds", 3, "rounds of each kind in the sharddown scenario (the median is reported)")
	fs.Int64Var(&c.smallPending, "small", 0, "small pending backlog (default 10,000 x scale)")
	fs.Int64Var(&c.largePending, "large", 0, "large pending backlog (default 2,000,000 x scale)")
	fs.Int64Var(&c.sentRows, "sent", 0, "sent rows kept for retention (default 5,000,000 x scale)")
	fs.IntVar(&c.retentionDays, "retention-days", 7, "daily partitions the sent rows are spread over")
	fs.IntVar(&c.rounds, "rounds", 5, "rounds of the small backlog (the median is reported)")
	fs.DurationVar(&c.burstLimit, "burst-limit", 3*time.Minute, "longest wait for the burst backlog to drain; its rate is then over what was marked")
	fs.DurationVar(&c.defaultsWindow, "defaults-window", 0, "measurement window of the kafka-go-defaults baseline (default 15s x scale, at least 3s)")
	fs.Float64Var(&c.latencyRate, "latency-rate", 2000, "events/s in the latency scenario")
	fs.DurationVar(&c.latencyDuration, "latency-duration", 0, "duration of the latency scenario (default 25s x scale, at least 6s)")
	fs.IntVar(&c.appendN, "append-n", 0, "transactions per shape in the append scenario (default 20,000 x scale)")
	fs.DurationVar(&c.writeRound, "write-round", 0, "length of one round of one shape in the writepath scenario (default 1s x scale, at least 1s)")
	fs.IntVar(&c.writeRounds, "write-rounds", 10, "rounds per shape and level in the writepath scenario")
	fs.IntVar(&c.writeTargetRounds, "write-target-rounds", 40, "rounds per shape of the writepath levels the targets judge (several writers, the default table and the one without CHECKs): a round's ratio varies by about 0.1 on the shared machine, 40 rounds put the run's figure within about 0.02")
	fs.Int64Var(&c.writeBacklog, "write-backlog", 0, "pending events the relay drains during each draining level of the writepath scenario (default 600,000 x scale)")
	fs.IntVar(&c.latencyEvents, "latency-events", 0, "fewest events of a latency run: a low rate runs longer than -latency-duration (default 2,000 x scale, at least 200)")
	peerRates := fs.String("peer-rates", "2000,500,50", "events/s of the latency runs in the debezium scenario")
	roundRates := fs.String("round-rates", "2000,500", "debezium scenario: the rates of the interleaved rounds (-peer-rounds)")
	fs.IntVar(&c.peerRounds, "peer-rounds", 2, "debezium scenario: rounds of one more window per publisher (Debezium, the at-least-once relays polling and notified, the exactly-once relay) at each -round-rates rate, interleaved, after every publisher's own run; the goals at steady rates are judged on the median of all windows at a rate")
	peers := fs.String("peers", "", "publishers of the debezium scenario to run, by key (debezium, relay-row, relay-snapshot, relay-snapshot-eos; empty: all; the others are reported as not measured)")
	fs.IntVar(&c.idleTables, "idle-tables", 0, "outbox tables of the idle scenario, 2 shards (relays) each (default 50 x scale, at least 5)")
	fs.DurationVar(&c.idleWindow, "idle-window", 0, "idle scenario: how long the idle shards' cost is measured (default 2m x scale, at least 10s); fed, 1m x scale (at least 10s)")
	fs.DurationVar(&c.idleLong, "idle-long", 0, "idle scenario: how long the shards idle before their first events, the idle window included (default 10m x scale, at least the idle window + 10s)")
	idleModes := fs.String("idle-modes", "poll-snapshot,notify-snapshot", "idle scenario: the relays' modes, in turn, the default tracking (snapshot) unless told (poll and notify: row tracking; "+strings.Join(idleModeKeys, ", ")+")")
	fs.StringVar(&c.latencyDump, "latency-dump", "", "diagnostic: write each latency run's per-event times (commit sent, commit returned, broker append, receipt) as CSV into this directory")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	var err error
	if c.peerRates, err = parseRates("-peer-rates", *peerRates); err != nil {
		return c, err
	}
	if c.roundRates, err = parseRates("-round-rates", *roundRates); err != nil {
		return c, err
	}
	if c.peerRounds < 0 {
		return c, errors.New("-peer-rounds must not be negative")
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if c.scale <= 0 {
		return c, errors.New("-scale must be positive")
	}
	c.partitions = int32(*partitions)
	scaled := func(v *int64, full float64, least int64) {
		if *v == 0 {
			*v = max(least, int64(full*c.scale))
		}
	}
	scaled(&c.backlog, 1_000_000, 10_000)
	scaled(&c.stuck, 1_000_000, 10_000)
	scaled(&c.smallPending, 10_000, 1_000)
	scaled(&c.largePending, 2_000_000, 20_000)
	scaled(&c.sentRows, 5_000_000, 50_000)
	scaled(&c.writeBacklog, 600_000, 20_000)
	if c.writeRound == 0 {
		c.writeRound = max(time.Second, time.Duration(c.scale*float64(time.Second)).Round(100*time.Millisecond))
	}
	if c.defaultsWindow == 0 {
		c.defaultsWindow = max(3*time.Second, time.Duration(15*c.scale*float64(time.Second)).Round(time.Second))
	}
	if c.latencyDuration == 0 {
		c.latencyDuration = max(6*time.Second, time.Duration(25*c.scale*float64(time.Second)).Round(time.Second))
	}
	c.latencyWarmup = min(3*time.Second, c.latencyDuration/4)
	if c.idleTables == 0 {
		c.idleTables = min(50, max(5, int(math.Round(50*c.scale))))
	}
	if c.idleWindow == 0 {
		c.idleWindow = max(10*time.Second, time.Duration(2*c.scale*float64(time.Minute)).Round(time.Second))
	}
	// Fed, the relays' cost per event settles within a minute (6,000 events at full size).
	c.idleFed = max(10*time.Second, time.Duration(c.scale*float64(time.Minute)).Round(time.Second))
	if c.idleLong == 0 {
		c.idleLong = time.Duration(10 * c.scale * float64(time.Minute)).Round(time.Second)
	}
	c.idleLong = max(c.idleLong, c.idleWindow+10*time.Second)
	for _, k := range strings.Split(*idleModes, ",") {
		if k = strings.TrimSpace(k); k == "" {
			continue
		}
		if !slices.Contains(idleModeKeys, k) {
			return c, fmt.Errorf("-idle-modes: unknown mode %q (want %s)", k, strings.Join(idleModeKeys, ", "))
		}
		c.idleModes = append(c.idleModes, k)
	}
	if c.latencyEvents == 0 {
		c.latencyEvents = max(200, int(2000*c.scale))
	}
	if c.appendN == 0 {
		c.appendN = max(2000, int(20_000*c.scale))
	}
	c.scenarios = map[string]bool{}
	for _, s := range strings.Split(scenarios, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		known := false
		for _, k := range allScenarios {
			known = known || k == s
		}
		if !known {
			return c, fmt.Errorf("unknown scenario %q (want %s)", s, strings.Join(allScenarios, ","))
		}
		c.scenarios[s] = true
	}
	for _, k := range strings.Split(*writeStates, ",") {
		if k = strings.TrimSpace(k); k != "" {
			if c.writeStates == nil {
				c.writeStates = map[string]bool{}
			}
			c.writeStates[k] = true
		}
	}
	for _, k := range strings.Split(*peers, ",") {
		if k = strings.TrimSpace(k); k != "" {
			if c.peers == nil {
				c.peers = map[string]bool{}
			}
			c.peers[k] = true
		}
	}
	for _, k := range strings.Split(*drains, ",") {
		if k = strings.TrimSpace(k); k != "" {
			if c.drains == nil {
				c.drains = map[string]bool{}
			}
			c.drains[k] = true
		}
	}
	switch {
	case c.rounds < 1:
		return c, errors.New("-rounds must be at least 1")
	case c.latencyRate <= 0:
		return c, errors.New("-latency-rate must be positive")
	case c.partitions < 1:
		return c, errors.New("-partitions must be at least 1")
	case c.downRounds < 1:
		return c, errors.New("-sharddown-rounds must be at least 1")
	case c.aggregates < 1:
		return c, errors.New("-aggregates must be at least 1")
	case c.retentionDays < 1:
		return c, errors.New("-retention-days must be at least 1")
	case c.idleTables < 1:
		return c, errors.New("-idle-tables must be at least 1")
	case c.scenarios["idle"] && len(c.idleModes) == 0:
		return c, errors.New("-idle-modes: no mode")
	}
	return c, nil
}

var started = time.Now()

// progress reports on stderr; stdout carries the result table only.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[bench %6s] %s\n", time.Since(started).Round(time.Second), fmt.Sprintf(format, args...))
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var res *Results
	if cfg.reportFrom != "" {
		res, err = loadResults(cfg)
	} else {
		res, err = run(ctx, cfg)
	}
	// A run measured now, or one saved earlier (-report-from a partial run's -json), goes into a
	// full run's results.
	if res != nil && err == nil && cfg.mergeInto != "" {
		var names []string
		for _, s := range allScenarios {
			if cfg.scenarios[s] {
				names = append(names, s)
			}
		}
		res, err = mergeInto(cfg.mergeInto, res, names)
	}
	switch {
	case res != nil && err != nil && cfg.mergeInto != "":
		// An interrupted or failed run merged nothing: its partial results would replace the
		// full run's outputs (-json, -out: docs/ as make bench's merges name them).
		printTable(os.Stdout, res)
		progress("nothing merged into %s, and the outputs are left as they were", cfg.mergeInto)
	case res != nil:
		printTable(os.Stdout, res)
		if werr := writeOutputs(cfg, res); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run sets up the components, runs the selected scenarios and tears everything down. A failed
// scenario is recorded in the results and does not stop the others.
func run(ctx context.Context, cfg config) (*Results, error) {
	if _, err := os.Stat("go.mod"); err != nil {
		return nil, errors.New("run from the repository root (go run ./test/bench)")
	}
	e := &env{cfg: cfg, table: outboxdb.MustParseTable("public.outbox")}
	res := &Results{Started: time.Now().UTC(), Scale: cfg.scale, Config: cfg, Machine: describeMachine()}
	var err error
	e.tmp, err = os.MkdirTemp("", "outbox-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(e.tmp)

	needRelay := cfg.scenarios["drain"] || cfg.scenarios["backlog"] || cfg.scenarios["latency"] || cfg.scenarios["envelopes"] || cfg.scenarios["reshard"] ||
		cfg.scenarios["writepath"] || cfg.scenarios["sharddown"] || cfg.scenarios["debezium"] || cfg.scenarios["idle"]
	switch {
	case !needRelay:
	case cfg.relayBin != "":
		e.relayBin, err = filepath.Abs(cfg.relayBin)
		if err != nil {
			return nil, err
		}
	default:
		progress("building ./cmd/relay")
		e.relayBin, e.relayErr = buildRelay(ctx, e.tmp)
		if e.relayErr != nil {
			res.note("relay not measured: %v", e.relayErr)
		}
	}

	progress("starting PostgreSQL")
	e.pg, err = startPostgres(ctx, cfg.statements > 0)
	if err != nil {
		return nil, err
	}
	defer e.pg.Close()
	res.Machine.Postgres = "PostgreSQL " + e.pg.Version
	progress("starting Apache Kafka")
	if os.Getenv("KAFKA_JVM_OPTS") == "" {
		// The tests' broker JVM (serial collector, C1 only) pauses 12-17 ms in every young
		// collection, about once a second under load: a floor under every latency measured
		// through it, whoever publishes. The benchmark runs the broker as Kafka's own start
		// script does.
		if err := os.Setenv("KAFKA_JVM_OPTS", benchKafkaJVM); err != nil {
			return nil, err
		}
	}
	res.Machine.KafkaJVM = os.Getenv("KAFKA_JVM_OPTS")
	e.kafka, err = kafkatest.StartApache()
	if err != nil {
		return nil, fmt.Errorf("start Apache Kafka: %w", err)
	}
	defer e.kafka.Close()
	res.Machine.Kafka = e.kafka.Version + " (single node, KRaft)"
	e.kafkaPid = findKafkaPid(e.kafka.Brokers)
	e.kcl, err = kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers...))
	if err != nil {
		return nil, err
	}
	defer e.kcl.Close()
	e.admin = kadm.NewClient(e.kcl)
	progress("PostgreSQL %s on port %d, %s at %s", e.pg.Version, e.pg.Port, e.kafka.Version, strings.Join(e.kafka.Brokers, ","))
	if err := e.warmBroker(ctx); err != nil {
		return nil, err
	}

	if cfg.scenarios["drain"] {
		e.scenarioDrain(ctx, res)
	}
	if cfg.scenarios["backlog"] {
		e.scenarioBacklog(ctx, res)
	}
	if cfg.scenarios["latency"] {
		e.scenarioLatency(ctx, res)
	}
	if cfg.scenarios["envelopes"] {
		e.scenarioEnvelopes(ctx, res)
	}
	if cfg.scenarios["append"] || cfg.scenarios["writepath"] {
		progress("starting the durable PostgreSQL (%s)", durableSettings)
		e.durable, err = startDurablePostgres(ctx)
		if err != nil {
			return nil, err
		}
		defer e.durable.Close()
	}
	if cfg.scenarios["append"] {
		e.scenarioAppend(ctx, res)
	}
	if cfg.scenarios["writepath"] {
		e.scenarioWritePath(ctx, res)
	}
	if cfg.scenarios["reshard"] {
		e.scenarioReshard(ctx, res)
	}
	if cfg.scenarios["sharddown"] {
		e.scenarioShardDown(ctx, res)
	}
	if cfg.scenarios["debezium"] {
		e.scenarioDebezium(ctx, res)
	}
	if cfg.scenarios["txncost"] {
		e.scenarioTxnCost(ctx, res)
	}
	if cfg.scenarios["idle"] {
		e.scenarioIdle(ctx, res)
	}
	res.Finished = time.Now().UTC()
	progress("done in %s", res.Finished.Sub(res.Started).Round(time.Second))
	return res, ctx.Err()
}

// latencyRunDuration is how long a latency run at rate commits events: latencyDuration, or
// longer at a low rate, so that the run commits at least latencyEvents after its warm-up.
func (c config) latencyRunDuration(rate float64) time.Duration {
	d := c.latencyDuration
	if rate > 0 && c.latencyEvents > 0 {
		need := c.latencyWarmup + time.Duration(float64(c.latencyEvents)/rate*float64(time.Second))
		d = max(d, need.Round(time.Second))
	}
	return d
}

// Machine describes where the numbers were measured.
type Machine struct {
	CPUs      int       `json:"cpus"`
	CPUModel  string    `json:"cpuModel"`
	MemoryGiB float64   `json:"memoryGiB"`
	Kernel    string    `json:"kernel"`
	Go        string    `json:"go"`
	Postgres  string    `json:"postgres"`
	Kafka     string    `json:"kafka"`
	KafkaJVM  string    `json:"kafkaJVM,omitempty"` // the broker's JVM settings
	LoadAvg   string    `json:"loadAvg"`            // at the start: other work on the shared machine
	Date      time.Time `json:"date"`
}

// benchKafkaJVM is the broker's JVM settings in the benchmark: those of Kafka's
// kafka-server-start.sh (KAFKA_HEAP_OPTS and KAFKA_JVM_PERFORMANCE_OPTS).
const benchKafkaJVM = "-Xms1g -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent"

func describeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC()}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if kb, err := parseStatusKB(string(b), "MemTotal"); err == nil {
			m.MemoryGiB = float64(kb) / (1 << 30)
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	return m
}

func writeOutputs(cfg config, res *Results) error {
	var errs []error
	if cfg.jsonOut != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err == nil {
			err = os.WriteFile(cfg.jsonOut, b, 0o644)
		}
		errs = append(errs, err)
	}
	if cfg.out != "" {
		if err := os.MkdirAll(cfg.out, 0o755); err != nil {
			return err
		}
		errs = append(errs, writeMarkdown(filepath.Join(cfg.out, "benchmarks.md"), res))
		errs = append(errs, writePlot(filepath.Join(cfg.out, "benchmarks.png"), res))
		progress("wrote %s and %s", filepath.Join(cfg.out, "benchmarks.md"), filepath.Join(cfg.out, "benchmarks.png"))
	}
	return errors.Join(errs...)
}

// loadResults reads the results of an earlier run written with -json.
func loadResults(cfg config) (*Results, error) {
	b, err := os.ReadFile(cfg.reportFrom)
	if err != nil {
		return nil, err
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.reportFrom, err)
	}
	res.Config = cfg
	return &res, nil
}

// parseRates parses a comma-separated list of positive events/s for flag.
func parseRates(flag, list string) ([]float64, error) {
	var out []float64
	for _, v := range strings.Split(list, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r <= 0 {
			return nil, fmt.Errorf("%s: %q is not a positive rate", flag, v)
		}
		out = append(out, r)
	}
	return out, nil
}
