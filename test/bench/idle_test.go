package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// The idle scenario's sizes follow -scale, its modes are checked.
func TestParseIdleFlags(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.scenarios["idle"] || c.idleTables != 50 || c.idleWindow != 2*time.Minute || c.idleFed != time.Minute ||
		c.idleLong != 10*time.Minute || !slices.Equal(c.idleModes, []string{"poll-snapshot", "notify-snapshot"}) {
		t.Fatalf("defaults: %d tables, %s / %s / %s, %v", c.idleTables, c.idleWindow, c.idleLong, c.idleFed, c.idleModes)
	}
	c, err = parseFlags([]string{"-scale", "0.1", "-scenarios", "idle", "-idle-modes", "notify, poll-snapshot"})
	if err != nil {
		t.Fatal(err)
	}
	if c.idleTables != 5 || c.idleWindow != 12*time.Second || c.idleLong != 60*time.Second || c.idleFed != 10*time.Second ||
		!slices.Equal(c.idleModes, []string{"notify", "poll-snapshot"}) || c.scenarios["debezium"] {
		t.Fatalf("scale 0.1: %d tables, %s / %s, %v", c.idleTables, c.idleWindow, c.idleLong, c.idleModes)
	}
	if c, _ = parseFlags([]string{"-scale", "0.01"}); c.idleWindow != 10*time.Second || c.idleLong != 20*time.Second {
		t.Fatalf("scale 0.01: %s / %s (the long idle covers the window)", c.idleWindow, c.idleLong)
	}
	if c, _ = parseFlags([]string{"-idle-tables", "3"}); c.idleTables != 3 {
		t.Fatalf("-idle-tables 3: %d", c.idleTables)
	}
	if _, err := parseFlags([]string{"-idle-modes", "sometimes"}); err == nil {
		t.Fatal("-idle-modes sometimes was accepted")
	}
	if _, err := parseFlags([]string{"-scenarios", "idle", "-idle-modes", ","}); err == nil {
		t.Fatal("no idle mode was accepted")
	}
}

func TestIdleCost(t *testing.T) {
	u := CPUUsage{Wall: 100, Postgres: 2, PostgresRelay: 1.5, Relay: 4, Machine: 50}
	c := idleCostOf(u, pgCounters{statements: 10, all: 20, xmax: 100, xacts: 7, rollbacks: 1, dealloc: 3},
		pgCounters{statements: 4010, all: 4500, xmax: 350, xacts: 2307, rollbacks: 101, dealloc: 4}, 200)
	if c.Statements != 4000 || c.AllStatements != 4480 || c.Xids != 50 || c.Xacts != 2300 || c.Events != 200 || c.Rollbacks != 100 || c.Evicted != 1 {
		t.Fatalf("idleCostOf = %+v", c)
	}
	if c.PostgresPct() != 2 || c.RelayPct() != 4 || c.StatementsPerSec() != 40 || c.XactsPerSec() != 21 || c.XidsPerSec() != 0.5 {
		t.Fatalf("per second: %.2f%% %.2f%% %.1f %.1f %.2f", c.PostgresPct(), c.RelayPct(), c.StatementsPerSec(), c.XactsPerSec(), c.XidsPerSec())
	}
	t0 := time.Now()
	commit := map[int]time.Time{0: t0, 1: t0, 2: t0, 3: t0}
	recv := map[int]time.Time{0: t0.Add(4 * time.Millisecond), 1: t0.Add(2 * time.Millisecond), 2: t0.Add(9 * time.Millisecond)}
	app := map[int]time.Time{0: t0.Add(3 * time.Millisecond), 1: t0.Add(time.Millisecond), 2: t0.Add(8 * time.Millisecond)}
	l := idleLatency(commit, recv, app)
	if l.Events != 3 || l.P50 != 4 || l.Max != 9 || l.PickupP50 != 3 || l.PickupMax != 8 {
		t.Fatalf("idleLatency = %+v", l)
	}
	if idleLatency(commit, nil, nil) != nil {
		t.Fatal("latency of nothing received")
	}
}

// The verdict scales the measured shards to the target's 100, and the report says so.
func TestIdleReport(t *testing.T) {
	cheap := &IdleCost{Seconds: 100, PostgresCPU: 0.4, Statements: 1000}  // 0.4%, 10/s on 10 shards: 4%, 100/s on 100
	cheaper := &IdleCost{Seconds: 100, PostgresCPU: 0.2, Statements: 300} // 2%, 30/s on 100
	r := &IdleResult{Tables: 5, ShardsPerTable: 2, WindowSec: 12, LongIdleSec: 60, FedSec: 12, FedPerRelay: 1,
		Runs: []*IdleRun{
			{Key: "poll", Name: "polling", PollMs: 10, Idle: cheap, Fed: cheap, IdleForSec: 61, First: &IdleLatency{Events: 5, P50: 3, Max: 7}},
			{Key: "notify", Name: "notified", PollMs: 5000, Idle: cheaper, Alongside: []string{"poll"}},
			{Key: "poll-snapshot", Name: "snapshot", Err: "boom"},
		}}
	res := &Results{Idle: r}
	rows := idleShardRows(res)
	if len(rows) != 3 || rows[0].Verdict != "MISSED" || rows[1].Verdict != "met" || !strings.HasPrefix(rows[2].Value, "failed: boom") {
		t.Fatalf("rows: %+v", rows)
	}
	if !strings.Contains(rows[0].Value, "per 100 shards 4.00% / 100/s") {
		t.Fatalf("row: %q", rows[0].Value)
	}
	var b strings.Builder
	writeIdle(&b, res)
	out := b.String()
	for _, want := range []string{
		"## Idle shards", "**Target**: 100 idle shards cost PostgreSQL under 50 statements/s and under 5% of a core",
		"scale the measured ones by 10.0", "| idle 12s: the relays' statements/s (pg_stat_statements) | 10.0 (100.0 per 100 shards) | 3.0 (30.0 per 100 shards) | failed: boom |",
		"after 1m1s: 3.0 / 7.0 ms", "| idle 12s: PostgreSQL CPU, % of a core (of which the relays' backends) | 0.40% (0.00%); per 100 shards 4.00% |", "| other modes' relays running beside the idle window | none | poll | none |", "**missed** | met |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}
