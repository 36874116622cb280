package relay

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// A relay that polls looks again a millisecond (or its latency budget, if longer) after a fetch
// that found events, then doubles its wait up to the poll interval while nothing comes; with an
// idle ceiling above the interval it then waits a sixteenth of its idle spell, up to the ceiling.
// The clock advances by each wait (each poll finds nothing but where events says otherwise).
func TestNextPoll(t *testing.T) {
	ms := time.Millisecond
	for name, tc := range map[string]struct {
		interval, budget, ceiling time.Duration
		events                    map[int]bool // before which wait a fetch found events
		want                      []time.Duration
	}{
		"budget 5 ms":                         {interval: 10 * ms, budget: 5 * ms, events: map[int]bool{2: true}, want: []time.Duration{5 * ms, 10 * ms, 5 * ms, 10 * ms}},
		"budget over interval":                {interval: 10 * ms, budget: 20 * ms, want: []time.Duration{10 * ms, 10 * ms}},
		"idle from the start":                 {interval: 10 * ms, want: []time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms, 10 * ms, 10 * ms}},
		"events again":                        {interval: 10 * ms, events: map[int]bool{5: true}, want: []time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms, 10 * ms, 1 * ms, 2 * ms}},
		"interval below 1 ms":                 {interval: ms / 2, want: []time.Duration{ms / 2, ms / 2}},
		"long interval":                       {interval: 50 * ms, events: map[int]bool{3: true}, want: []time.Duration{1 * ms, 2 * ms, 4 * ms, 1 * ms, 2 * ms, 4 * ms, 8 * ms, 16 * ms, 32 * ms, 50 * ms}},
		"ceiling at the interval: no backoff": {interval: 10 * ms, ceiling: 10 * ms, want: []time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms, 10 * ms, 10 * ms, 10 * ms}},
		// Idle 1+2+4+8 = 15 ms, then 10 ms waits until the spell reaches 160 ms (a sixteenth of
		// it is 10 ms): the wait at 165 ms is 10.3125 ms, then each wait is a sixteenth of the
		// spell so far, up to the ceiling.
		"backs off to the ceiling": {interval: 10 * ms, ceiling: 12 * ms, want: slices.Concat(
			[]time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms}, tens(15),
			[]time.Duration{10_312_500, 10_957_031, 11_641_845, 12 * ms, 12 * ms})},
		"events end the backoff": {interval: 10 * ms, ceiling: time.Hour, events: map[int]bool{21: true}, want: slices.Concat(
			[]time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms}, tens(15),
			[]time.Duration{10_312_500, 10_957_031, 1 * ms, 2 * ms, 4 * ms, 8 * ms, 10 * ms})},
	} {
		t.Run(name, func(t *testing.T) {
			var w wakeState
			now := time.Unix(1e9, 0)
			for i, want := range tc.want {
				if tc.events[i] {
					w.sawEvents()
				}
				got := w.nextPoll(tc.interval, tc.budget, tc.ceiling, now)
				if got != want {
					t.Fatalf("wait %d: %s, want %s", i, got, want)
				}
				now = now.Add(got)
			}
		})
	}
}

// tens is n waits of 10 ms.
func tens(n int) []time.Duration { return slices.Repeat([]time.Duration{10 * time.Millisecond}, n) }

// An idle relay that polls at the defaults sends its database one poll every
// contract.IdlePollInterval once idle long enough, and about 16 ln(T) polls in an idle spell of T
// seconds before that: the cost of idle shards (docs/benchmarks.md, "Idle shards").
func TestIdlePollsAtTheDefaults(t *testing.T) {
	cfg := DefaultConfig()
	var w wakeState
	now := time.Unix(1e9, 0)
	start := now
	polls := 0
	for now.Sub(start) < 10*time.Minute {
		now = now.Add(w.nextPoll(cfg.PollInterval, cfg.MaxDelay, cfg.IdlePollInterval, now))
		polls++
	}
	if last := w.poll; last != contract.IdlePollInterval {
		t.Fatalf("after 10 idle minutes a poll every %s, want %s", last, contract.IdlePollInterval)
	}
	// 10 ms polls until the spell reaches 160 ms, then 16 ln(80 s / 160 ms) ≈ 99 up to the
	// ceiling, then one per 5 s for the rest: about 230 in all.
	if polls > 300 {
		t.Fatalf("%d polls in 10 idle minutes", polls)
	}
	t.Logf("%d polls in 10 idle minutes at the defaults (a 10 ms poll without backoff: 60,000)", polls)
}

// After a fetch that found events and did not fill its batch, the next fetch waits until the
// budget after that fetch began; after a full batch (more rows wait), an empty fetch, or with
// no budget, it does not wait; a stop ends the wait at once.
func TestGather(t *testing.T) {
	ms := time.Millisecond
	start := time.Now()
	for name, tc := range map[string]struct {
		events, more bool
		budget       time.Duration
		want         time.Time
	}{
		"events, batch not full": {events: true, budget: 5 * ms, want: start.Add(5 * ms)},
		"batch full":             {events: true, more: true, budget: 5 * ms},
		"nothing found":          {budget: 5 * ms},
		"no budget":              {events: true},
	} {
		t.Run(name, func(t *testing.T) {
			w := wakeState{gatherUntil: start.Add(time.Hour)} // the last round's, replaced
			w.fetched(start, tc.events, tc.more, tc.budget)
			if !w.gatherUntil.Equal(tc.want) {
				t.Fatalf("gather until %v, want %v", w.gatherUntil, tc.want)
			}
		})
	}
	t.Run("waits until then, once", func(t *testing.T) {
		w := wakeState{gatherUntil: time.Now().Add(20 * ms)}
		if d := w.gather(context.Background()); d <= 0 {
			t.Fatalf("waited %s", d)
		}
		if !time.Now().After(w.gatherUntil) || !w.gatherUntil.IsZero() {
			t.Fatalf("gather until %v after the wait, want zero (past)", w.gatherUntil)
		}
		if d := w.gather(context.Background()); d != 0 {
			t.Fatalf("a second wait of %s", d)
		}
	})
	t.Run("a stop ends it", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		w := wakeState{gatherUntil: time.Now().Add(time.Hour)}
		if d := w.gather(ctx); d >= time.Hour {
			t.Fatalf("waited %s after the stop", d)
		}
	})
}
