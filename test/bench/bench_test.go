package main

import (
	"context"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	kafkatest.StopShared()
	os.Exit(code)
}

func TestParseStat(t *testing.T) {
	cases := map[string]struct {
		line     string
		cpu      time.Duration
		ppid     int
		wantFail bool
	}{
		"plain": {
			line: "1234 (relay) S 77 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 1000 1000000 2000",
			cpu:  3 * time.Second, ppid: 77,
		},
		"name with spaces and parentheses": {
			line: "99 (postgres: a (b) c) R 12 99 99 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 5 6 7",
			cpu:  100 * time.Millisecond, ppid: 12,
		},
		"truncated":  {line: "1 (x) S 2 3", wantFail: true},
		"no command": {line: "garbage", wantFail: true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cpu, ppid, err := parseStat(c.line)
			if c.wantFail {
				if err == nil {
					t.Fatalf("parseStat(%q) succeeded, want an error", c.line)
				}
				return
			}
			if err != nil || cpu != c.cpu || ppid != c.ppid {
				t.Fatalf("parseStat = %v, %d, %v; want %v, %d", cpu, ppid, err, c.cpu, c.ppid)
			}
		})
	}
}

func TestParseStatusKB(t *testing.T) {
	status := "Name:\trelay\nVmPeak:\t 1300000 kB\nVmHWM:\t   40960 kB\nVmRSS:\t   30000 kB\n"
	cases := map[string]struct {
		key  string
		want int64
		fail bool
	}{
		"VmHWM":   {key: "VmHWM", want: 40960 * 1024},
		"VmRSS":   {key: "VmRSS", want: 30000 * 1024},
		"missing": {key: "VmSwap", fail: true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := parseStatusKB(status, c.key)
			if c.fail != (err != nil) || got != c.want {
				t.Fatalf("parseStatusKB(%s) = %d, %v; want %d (fail %v)", c.key, got, err, c.want, c.fail)
			}
		})
	}
	// The real file of this process parses, and a running process has a peak RSS.
	if rss, err := peakRSS(os.Getpid()); err != nil || rss <= 0 {
		t.Fatalf("peakRSS(self) = %d, %v", rss, err)
	}
}

func TestSumMetric(t *testing.T) {
	text := `# HELP outbox_published_total Events published.
# TYPE outbox_published_total counter
outbox_published_total{table="public.outbox",topic="a"} 1500
outbox_published_total{table="public.outbox",topic="b"} 2.5e3
outbox_published_total_created{topic="a"} 1.7e9
outbox_pending 12
`
	cases := map[string]struct {
		name  string
		want  float64
		found bool
	}{
		"labelled samples are summed":    {name: "outbox_published_total", want: 4000, found: true},
		"a longer family does not count": {name: "outbox_published", found: false},
		"unlabelled sample":              {name: "outbox_pending", want: 12, found: true},
		"absent":                         {name: "outbox_lag_seconds", found: false},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, found, err := sumMetric(strings.NewReader(text), c.name)
			if err != nil || got != c.want || found != c.found {
				t.Fatalf("sumMetric(%s) = %v, %v, %v; want %v, %v", c.name, got, found, err, c.want, c.found)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	cases := map[string]struct {
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		"p50 of 1..100":  {d, 50, 50 * time.Millisecond},
		"p99 of 1..100":  {d, 99, 99 * time.Millisecond},
		"p100 is max":    {d, 100, 100 * time.Millisecond},
		"p0 is min":      {d, 0, time.Millisecond},
		"one sample":     {[]time.Duration{7}, 99, 7},
		"nearest rank 3": {[]time.Duration{1, 2, 3}, 50, 2},
		"empty":          {nil, 50, 0},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if got := percentile(c.in, c.p); got != c.want {
				t.Fatalf("percentile(p%v) = %v, want %v", c.p, got, c.want)
			}
		})
	}
}

func TestFormatting(t *testing.T) {
	cases := []struct{ got, want string }{
		{fmtInt(0), "0"},
		{fmtInt(999), "999"},
		{fmtInt(1000), "1,000"},
		{fmtInt(1234567.6), "1,234,568"},
		{fmtInt(-50000), "-50,000"},
		{count(1_000_000), "1M"},
		{count(2_500_000), "2.5M"},
		{count(10_000), "10k"},
		{count(1_500), "1.5k"},
		{count(999), "999"},
		{count(12_345), "12345"},
		{sanitizeKey("relay-1"), "relay_1"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	for raw, want := range map[float64]float64{0: 1, 0.7: 1, 3: 5, 4800: 5000, 5001: 10000, 12000: 20000} {
		if got := niceStep(raw); got != want {
			t.Errorf("niceStep(%v) = %v, want %v", raw, got, want)
		}
	}
	if m := median([]float64{5, 1, 3}); m != 3 {
		t.Errorf("median odd = %v", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median even = %v", m)
	}
}

func TestParseFlags(t *testing.T) {
	cases := map[string]struct {
		args  []string
		check func(c config) bool
		fail  bool
	}{
		"full sizes by default": {args: nil, check: func(c config) bool {
			return c.backlog == 1_000_000 && c.smallPending == 10_000 && c.largePending == 2_000_000 &&
				c.sentRows == 5_000_000 && c.defaultsWindow == 15*time.Second && c.latencyDuration == 25*time.Second &&
				c.latencyWarmup == 3*time.Second && len(c.scenarios) == len(allScenarios)
		}},
		"scale shrinks, with floors": {args: []string{"-scale", "0.001"}, check: func(c config) bool {
			return c.backlog == 10_000 && c.smallPending == 1_000 && c.defaultsWindow == 3*time.Second &&
				c.latencyDuration == 6*time.Second && c.latencyWarmup == 1500*time.Millisecond
		}},
		"explicit size wins over scale": {args: []string{"-scale", "0.1", "-backlog", "1234"}, check: func(c config) bool {
			return c.backlog == 1234 && c.largePending == 200_000
		}},
		"scenario subset": {args: []string{"-scenarios", "drain, append"}, check: func(c config) bool {
			return c.scenarios["drain"] && c.scenarios["append"] && !c.scenarios["latency"]
		}},
		"unknown scenario": {args: []string{"-scenarios", "drain,fast"}, fail: true},
		"zero scale":       {args: []string{"-scale", "0"}, fail: true},
		"stray argument":   {args: []string{"extra"}, fail: true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cfg, err := parseFlags(c.args)
			if c.fail {
				if err == nil {
					t.Fatalf("parseFlags(%q) succeeded, want an error", c.args)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(cfg) {
				t.Fatalf("parseFlags(%q) = %+v", c.args, cfg)
			}
		})
	}
}

// newOutbox returns a fresh database with the outbox schema and partitions from days ago to
// tomorrow.
func newOutbox(t *testing.T, days int) (string, outboxdb.Table) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	tbl := outboxdb.MustParseTable("public.outbox")
	if err := pgtest.OutboxSchema(context.Background(), url, tbl, days); err != nil {
		t.Fatal(err)
	}
	return url, tbl
}

// The generated data is what the scenarios claim: sent rows spread evenly over the daily
// partitions (none in the default partition), pending rows unsent, payloads of realistic size.
func TestGeneratedRows(t *testing.T) {
	ctx := context.Background()
	const days, sent, pending = 3, 3000, 500
	url, tbl := newOutbox(t, days)
	if err := fillSent(ctx, url, tbl, sent, 100, days); err != nil {
		t.Fatal(err)
	}
	if err := fillPending(ctx, url, tbl, pending, 100, "test"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT tableoid::regclass::text, count(*), count(*) FILTER (WHERE sent_at IS NULL)
		FROM outbox GROUP BY 1 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][2]int64{}
	for rows.Next() {
		var name string
		var n, unsent int64
		if err := rows.Scan(&name, &n, &unsent); err != nil {
			t.Fatal(err)
		}
		got[name] = [2]int64{n, unsent}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	want := map[string][2]int64{"outbox_" + "p" + today.Format("20060102"): {pending, pending}}
	for d := 1; d <= days; d++ {
		want["outbox_p"+today.AddDate(0, 0, -d).Format("20060102")] = [2]int64{sent / days, 0}
	}
	if len(got) != len(want) {
		t.Fatalf("rows per partition = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("rows per partition = %v, want %v", got, want)
		}
	}
	var avgPayload, distinctAggs float64
	if err := conn.QueryRow(ctx, `SELECT avg(octet_length(payload::text)), count(DISTINCT aggregate_id) FROM outbox`).
		Scan(&avgPayload, &distinctAggs); err != nil {
		t.Fatal(err)
	}
	if avgPayload < 120 || avgPayload > 250 || distinctAggs != 100 {
		t.Fatalf("average payload %v bytes, %v aggregates; want 120..250 bytes and 100 aggregates", avgPayload, distinctAggs)
	}
}

// The baselines are correct workers: every row reaches Kafka, keyed by its aggregate, with the
// event headers, and is marked sent; the windowed run stops after its window.
func TestBaselinesPublishEveryRow(t *testing.T) {
	kc := kafkatest.Start(t, kafkatest.Apache)
	cases := map[string]struct {
		b      baseline
		n      int64
		window time.Duration
	}{
		"tuned":    {b: baselineTuned, n: 2500},
		"defaults": {b: baselineDefaults, n: 150},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			url, tbl := newOutbox(t, 1)
			if err := fillPending(ctx, url, tbl, c.n, 40, name); err != nil {
				t.Fatal(err)
			}
			topic := kafkatest.UniqueTopic("bench-test")
			kc.CreateTopic(t, topic, 3)
			finished := false
			marked, err := c.b.run(ctx, url, tbl, kc.Brokers, topic, func() { finished = true })
			if err != nil {
				t.Fatal(err)
			}
			if marked != c.n || !finished {
				t.Fatalf("marked %d of %d rows (finished hook ran: %v)", marked, c.n, finished)
			}
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var unsent int64
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE sent_at IS NULL").Scan(&unsent); err != nil {
				t.Fatal(err)
			}
			if unsent != 0 {
				t.Fatalf("%d rows still unsent", unsent)
			}
			recs := kc.NewConsumer(t, topic).ReadN(t, int(c.n), time.Minute)
			ids := map[string]bool{}
			for _, r := range recs {
				if !strings.HasPrefix(r.Key, "order-") || r.Headers["aggregate_id"] != r.Key ||
					r.Headers["event_type"] == "" || r.Headers["aggregate_type"] != "order" || r.Headers["traceparent"] == "" {
					t.Fatalf("record key %q headers %v", r.Key, r.Headers)
				}
				ids[r.Headers["event_id"]] = true
			}
			if len(ids) != int(c.n) {
				t.Fatalf("%d distinct event ids in %d records, want %d", len(ids), len(recs), c.n)
			}
		})
	}

	t.Run("window", func(t *testing.T) {
		ctx := context.Background()
		url, tbl := newOutbox(t, 1)
		if err := fillPending(ctx, url, tbl, 5000, 40, "window"); err != nil {
			t.Fatal(err)
		}
		topic := kafkatest.UniqueTopic("bench-test")
		kc.CreateTopic(t, topic, 3)
		wctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer cancel()
		start := time.Now()
		marked, err := baselineDefaults.run(wctx, url, tbl, kc.Brokers, topic, nil)
		if err != nil {
			t.Fatal(err)
		}
		// A batch takes about a second (BatchTimeout), so a 1.5 s window marks one or two
		// batches of 100 and returns soon after the window.
		if marked < 100 || marked > 300 || marked%100 != 0 || time.Since(start) > 5*time.Second {
			t.Fatalf("marked %d rows in %s", marked, time.Since(start))
		}
	})
}

// The PostgreSQL-only worker marks every pending row, in batches of ceilingBatch, and stops
// when none is left; rows already sent stay as they were.
func TestCeilingMarksEveryRow(t *testing.T) {
	ctx := context.Background()
	url, tbl := newOutbox(t, 1)
	if err := fillPending(ctx, url, tbl, 2*ceilingBatch+345, 40, "ceiling"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := conn.Exec(ctx, `UPDATE outbox SET sent_at = $1 WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT 10)`, old); err != nil {
		t.Fatal(err)
	}
	finished := false
	marked, err := runCeiling(ctx, url, tbl, func() { finished = true })
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(2*ceilingBatch + 345 - 10); marked != want || !finished {
		t.Fatalf("marked %d rows, want %d (finished hook ran: %v)", marked, want, finished)
	}
	var unsent, kept int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE sent_at IS NULL), count(*) FILTER (WHERE sent_at = $1) FROM outbox`, old).
		Scan(&unsent, &kept); err != nil {
		t.Fatal(err)
	}
	if unsent != 0 || kept != 10 {
		t.Fatalf("%d rows unsent, %d of the 10 sent rows kept their sent_at", unsent, kept)
	}
}

// Sorting helpers keep their input intact (the report reuses the rounds).
func TestMedianKeepsInput(t *testing.T) {
	in := []float64{3, 1, 2}
	_ = median(in)
	if !slices.Equal(in, []float64{3, 1, 2}) {
		t.Fatalf("median reordered its input: %v", in)
	}
}

func TestThreadKinds(t *testing.T) {
	for name, want := range map[string]string{
		"data-plane-kafk":  "data-plane-kafk",
		"GC Thread#3":      "GC Thread",
		"C2 CompilerThre":  "C2 CompilerThre",
		"kafka-log-clean":  "kafka-log-clean",
		"ReplicaFetcher-0": "ReplicaFetcher",
		"java":             "java",
	} {
		if got := threadKind(name); got != want {
			t.Errorf("threadKind(%q) = %q, want %q", name, got, want)
		}
	}
	a := map[int]threadTime{1: {"GC Thread#0", time.Second}, 2: {"GC Thread#1", time.Second}, 3: {"gone", time.Second}}
	b := map[int]threadTime{1: {"GC Thread#0", 3 * time.Second}, 2: {"GC Thread#1", 2 * time.Second}, 4: {"new-1", time.Second}, 5: {"idle", 0}}
	got := threadsSince(a, b, func(_ int, comm string) string { return comm })
	want := map[string]float64{"GC Thread": 3, "new": 1}
	if !maps.Equal(got, want) {
		t.Fatalf("threadsSince = %v, want %v", got, want)
	}
	if s := threadsSummary(got, 1e6); s != "GC Thread 3.0, new 1.0, other 0.0" {
		t.Fatalf("threadsSummary = %q", s)
	}
}

func TestThreadTimesReadsThisProcess(t *testing.T) {
	th := threadTimes(os.Getpid())
	if len(th) == 0 {
		t.Fatal("no threads read for this process")
	}
}

func TestParseThreadDump(t *testing.T) {
	dump := `2026-12-05 22:50:00
Full thread dump OpenJDK 64-Bit Server VM (17.0.13+11-Debian-2 mixed mode, sharing):

"data-plane-kafka-request-handler-0" #52 daemon prio=5 os_prio=0 cpu=1234.56ms elapsed=100.00s tid=0x00007f nid=0x1f4 waiting on condition  [0x00007f]
   java.lang.Thread.State: TIMED_WAITING (parking)

"GC Thread#1" os_prio=0 cpu=10.00ms elapsed=99.00s tid=0x00007e nid=0x20 runnable
"data-plane-kafka-network-thread-1-ListenerName(PLAINTEXT)-PLAINTEXT-0" #40 prio=5 os_prio=0 cpu=1.00ms elapsed=1.00s tid=0x1 nid=1001 runnable
`
	got := parseThreadDump(dump)
	want := map[int]string{0x1f4: "data-plane-kafka-request-handler-0", 0x20: "GC Thread#1",
		1001: "data-plane-kafka-network-thread-1-ListenerName(PLAINTEXT)-PLAINTEXT-0"}
	if !maps.Equal(got, want) {
		t.Fatalf("parseThreadDump = %v, want %v", got, want)
	}
	if k := threadKind(want[1001]); k != "data-plane-kafka-network-thread" {
		t.Fatalf("threadKind = %q", k)
	}
}
