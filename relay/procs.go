package relay

import (
	"runtime"
	"strconv"
)

// MaxProcs is how many CPUs the relay's Go runtime schedules its goroutines on by default
// (GOMAXPROCS), whatever the machine has: a relay is one loop with one batch in flight, a round
// trip to PostgreSQL and a produce request at a time, so at steady rates its CPU goes to waking
// up, not to work. With more than one, every wake-up (a response, a timer) may start a second
// thread that spins looking for work and then sleeps (futex). Measured on a 2-core machine
// against GOMAXPROCS 2, the relay's CPU per event: 9-21% less at 50 events/s, 19-28% less at
// 500 and 19% less at 2,000 (both tracking modes), 12-20% less in a drain, which was no slower
// (row 73-77k against 70-73k events/s, snapshot 264-272k against 228-253k: the CPU it no longer
// spends is PostgreSQL's and the broker's). A pod without a CPU limit would otherwise size the
// runtime, and its garbage collector's workers, by the node's cores. One CPU keeps up with a
// drain (about 1.2 µs of the relay's CPU per event under snapshot tracking, 2.7 under row);
// more throughput comes from more shards.
const MaxProcs = 1

// SizeProcs sets GOMAXPROCS to MaxProcs unless the GOMAXPROCS environment variable (read with
// getenv) sets it, which wins as it does for any Go program (spec.relay.env under the operator);
// it returns the number in force.
func SizeProcs(getenv func(string) string) int {
	if n, err := strconv.Atoi(getenv("GOMAXPROCS")); err == nil && n > 0 {
		return runtime.GOMAXPROCS(0)
	}
	runtime.GOMAXPROCS(min(MaxProcs, runtime.GOMAXPROCS(0)))
	return runtime.GOMAXPROCS(0)
}
