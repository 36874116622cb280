package relay

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: 2 * time.Second}
	lowest := func(n int64) int64 { return 0 }
	highest := func(n int64) int64 { return n - 1 }
	tests := []struct {
		n        int
		min, max time.Duration
	}{
		{n: -1, min: 50 * time.Millisecond, max: 100 * time.Millisecond},
		{n: 0, min: 50 * time.Millisecond, max: 100 * time.Millisecond},
		{n: 1, min: 50 * time.Millisecond, max: 100 * time.Millisecond},
		{n: 2, min: 100 * time.Millisecond, max: 200 * time.Millisecond},
		{n: 3, min: 200 * time.Millisecond, max: 400 * time.Millisecond},
		{n: 5, min: 800 * time.Millisecond, max: 1600 * time.Millisecond},
		{n: 6, min: time.Second, max: 2 * time.Second}, // capped
		{n: 1000, min: time.Second, max: 2 * time.Second},
	}
	for _, tc := range tests {
		if got := b.delay(tc.n, lowest); got != tc.min {
			t.Errorf("delay(%d) lowest jitter = %s, want %s", tc.n, got, tc.min)
		}
		if got := b.delay(tc.n, highest); got != tc.max {
			t.Errorf("delay(%d) highest jitter = %s, want %s", tc.n, got, tc.max)
		}
		for range 200 {
			if got := b.Delay(tc.n); got < tc.min || got > tc.max {
				t.Fatalf("Delay(%d) = %s, want within [%s, %s]", tc.n, got, tc.min, tc.max)
			}
		}
	}
	// Jitter spreads retries: 200 draws are not all equal.
	seen := map[time.Duration]bool{}
	for range 200 {
		seen[b.Delay(3)] = true
	}
	if len(seen) < 10 {
		t.Errorf("Delay(3) took only %d distinct values in 200 draws", len(seen))
	}
	for range 100 {
		if got := b.Longest(); got < time.Second || got > 2*time.Second {
			t.Fatalf("Longest() = %s, want within [1s, 2s]", got)
		}
	}
	if got := (Backoff{}).Delay(3); got != 0 {
		t.Errorf("zero Backoff delay = %s", got)
	}
	if got := (Backoff{Max: time.Second}).delay(1, highest); got != time.Second {
		t.Errorf("Backoff without Min: delay = %s, want the max", got)
	}
}
