// Package contract holds facts the operator and the relay must agree on, defined once for both
// (the relay's binary cannot be imported by the operator without its Kafka client).
package contract

import "time"

const (
	// RelayShutdownTimeout bounds how long a relay that received SIGTERM waits for the batch in
	// flight to be acknowledged before it records what it has and stops.
	RelayShutdownTimeout = 20 * time.Second
	// RelayQueryTimeout bounds each database round trip of a relay, the last one (recording the
	// batch in flight, releasing the locks) included.
	RelayQueryTimeout = 30 * time.Second
	// RelayGracePeriod is the termination grace period a relay pod needs to stop cleanly: the
	// batch in flight, one round trip to record it, and a margin to release its locks and exit.
	// Killed earlier, the relay publishes again, after restart, what it had not recorded.
	RelayGracePeriod = RelayShutdownTimeout + RelayQueryTimeout + 10*time.Second
)
