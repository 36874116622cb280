package relay

import (
	"testing"
	"time"
)

// A relay that polls looks again a millisecond after a fetch that found events, then doubles
// its wait up to the poll interval while nothing comes.
func TestNextPoll(t *testing.T) {
	ms := time.Millisecond
	for name, tc := range map[string]struct {
		interval time.Duration
		events   map[int]bool // before which wait a fetch found events
		want     []time.Duration
	}{
		"idle from the start": {interval: 10 * ms, want: []time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms, 10 * ms, 10 * ms}},
		"events again":        {interval: 10 * ms, events: map[int]bool{5: true}, want: []time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms, 10 * ms, 1 * ms, 2 * ms}},
		"interval below 1 ms": {interval: ms / 2, want: []time.Duration{ms / 2, ms / 2}},
		"long interval":       {interval: 50 * ms, events: map[int]bool{3: true}, want: []time.Duration{1 * ms, 2 * ms, 4 * ms, 1 * ms, 2 * ms, 4 * ms, 8 * ms, 16 * ms, 32 * ms, 50 * ms}},
	} {
		t.Run(name, func(t *testing.T) {
			var w wakeState
			for i, want := range tc.want {
				if tc.events[i] {
					w.sawEvents()
				}
				if got := w.nextPoll(tc.interval); got != want {
					t.Fatalf("wait %d: %s, want %s", i, got, want)
				}
			}
		})
	}
}
