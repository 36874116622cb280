package relay

import (
	"testing"
	"time"
)

// untilBackoffEnds: the wait ends when a backoff the last round trip saw running ends, at once
// for one that ended between that round trip and the wait (the parked aggregate of
// TestLeastPrivilegeRelay, left a whole poll interval under load), and a backoff that had ended
// before the round trip was planned does not shorten it (or an idle relay would spin while the
// entry waits to be forgotten).
func TestUntilBackoffEnds(t *testing.T) {
	planned := time.Date(2026, 12, 6, 17, 0, 0, 0, time.UTC)
	now := planned.Add(5 * time.Millisecond)
	for _, c := range []struct {
		name  string
		until []time.Duration // from planned
		want  time.Duration
	}{
		{"none", nil, time.Minute},
		{"running", []time.Duration{30 * time.Millisecond}, 25 * time.Millisecond},
		{"the earliest of two", []time.Duration{time.Second, 10 * time.Millisecond}, 5 * time.Millisecond},
		{"ended since the round trip", []time.Duration{2 * time.Millisecond}, 0},
		{"ended before the round trip", []time.Duration{-time.Millisecond}, time.Minute},
		{"ended at the round trip", []time.Duration{0}, time.Minute},
		{"later than the wait", []time.Duration{2 * time.Minute}, time.Minute},
	} {
		r := &Relay{blocked: map[string]blockEntry{}, planned: planned}
		for i, u := range c.until {
			r.blocked[string(rune('a'+i))] = blockEntry{until: planned.Add(u)}
		}
		if got := r.untilBackoffEnds(now, time.Minute); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
