package relay

import (
	"context"
	"testing"
	"time"
)

// A relay that polls looks again a millisecond (or its latency budget, if longer) after a fetch
// that found events, then doubles its wait up to the poll interval while nothing comes.
func TestNextPoll(t *testing.T) {
	ms := time.Millisecond
	for name, tc := range map[string]struct {
		interval, budget time.Duration
		events           map[int]bool // before which wait a fetch found events
		want             []time.Duration
	}{
		"budget 5 ms":          {interval: 10 * ms, budget: 5 * ms, events: map[int]bool{2: true}, want: []time.Duration{5 * ms, 10 * ms, 5 * ms, 10 * ms}},
		"budget over interval": {interval: 10 * ms, budget: 20 * ms, want: []time.Duration{10 * ms, 10 * ms}},
		"idle from the start":  {interval: 10 * ms, want: []time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms, 10 * ms, 10 * ms}},
		"events again":         {interval: 10 * ms, events: map[int]bool{5: true}, want: []time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms, 10 * ms, 1 * ms, 2 * ms}},
		"interval below 1 ms":  {interval: ms / 2, want: []time.Duration{ms / 2, ms / 2}},
		"long interval":        {interval: 50 * ms, events: map[int]bool{3: true}, want: []time.Duration{1 * ms, 2 * ms, 4 * ms, 1 * ms, 2 * ms, 4 * ms, 8 * ms, 16 * ms, 32 * ms, 50 * ms}},
	} {
		t.Run(name, func(t *testing.T) {
			var w wakeState
			for i, want := range tc.want {
				if tc.events[i] {
					w.sawEvents()
				}
				if got := w.nextPoll(tc.interval, tc.budget); got != want {
					t.Fatalf("wait %d: %s, want %s", i, got, want)
				}
			}
		})
	}
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
