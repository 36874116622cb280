package relay

import (
	"math/rand/v2"
	"time"
)

// Backoff is an exponential backoff with jitter: retry n (n >= 1) waits about Min·2^(n−1),
// capped at Max.
type Backoff struct {
	Min time.Duration
	Max time.Duration
}

// Delay returns the wait before retry n (1 for the first retry). The exponential value d is
// jittered uniformly within [d/2, d] ("equal jitter"), so that relays and aggregates that failed
// together do not retry in lockstep, while the wait still grows with n.
func (b Backoff) Delay(n int) time.Duration { return b.delay(n, rand.Int64N) }

// Longest returns a jittered wait at the cap, the backoff of a poison event.
func (b Backoff) Longest() time.Duration { return b.delay(64, rand.Int64N) }

func (b Backoff) delay(n int, randN func(int64) int64) time.Duration {
	if n < 1 {
		n = 1
	}
	d := b.Min
	if d <= 0 {
		d = b.Max
	}
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	if d > b.Max || d <= 0 {
		d = b.Max
	}
	if d <= 0 {
		return 0
	}
	half := d / 2
	return half + time.Duration(randN(int64(d-half)+1))
}
