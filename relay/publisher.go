package relay

import (
	"context"

	"github.com/segmentio/kafka-go"
)

// publisher is the relay's seam to Kafka. The loop (publish, settle) and replays hand it a
// batch's messages chunk by chunk (chunkEnd, within callBytes), each chunk after the previous
// one's outcome is known, and read each message's outcome back; classify tells them what a
// failure means: the event's fault (an attempt counts, its aggregate waits) or the cluster's (the
// relay backs off as a whole). kafkaPublisher is the one there is (kafka-go, one produce request
// per partition per call, at-least-once); a transactional publisher plugs in here, the loop
// unchanged.
type publisher interface {
	// callBytes is the byte budget of one write call (messageSize summed over its messages):
	// one partition's messages of a call must fit one produce request.
	callBytes() int
	// write publishes msgs and stores each message's outcome in errs (nil: acknowledged; the
	// messages of one aggregate in order). It reports whether every request returned, false
	// when ctx ended first (a request may then still be sent, and read the messages). Calls
	// from different goroutines (the loop's, a replay's) may overlap.
	write(ctx context.Context, msgs []kafka.Message, errs []error) bool
	// classify says what a message's error from write (or probe's) means.
	classify(err error) failure
	// probe asks the brokers whether they can be reached at all, with the relay's settings.
	probe(ctx context.Context) error
	close() error
}

// failure is what an error from the publisher means for the event and the relay.
type failure uint8

const (
	failNone failure = iota // no error
	// failEvent: the broker refused this event (too large, corrupt, a policy): the attempt
	// counts against the event, its aggregate's later events wait.
	failEvent
	// failUnreachable: the brokers could not be reached or were not ready; the event is fine.
	failUnreachable
	// failRefused: the cluster refuses the relay itself (credentials, permissions, TLS, a
	// missing topic): every event of the relay, or of that topic, fails alike until someone
	// fixes it; no attempt is charged.
	failRefused
)

// clusters reports whether f is the cluster's doing rather than the event's: no attempt is
// charged, and when every message of a batch fails so the relay backs off as a whole.
func (f failure) clusters() bool { return f == failUnreachable || f == failRefused }

// publishCallBytes is the byte budget of one write call: Kafka's default message.max.bytes
// (1 MiB per record batch) with headroom, or more when --max-payload-bytes asks for it.
func publishCallBytes(maxPayload int) int {
	return max(1_000_000, maxPayload+100_000)
}

// chunkEnd returns where the chunk of messages that starts at start ends (exclusive): as many
// messages as fit one write call's byte budget (sizes[k] is messageSize of message k), at least
// one. The relay's batches and replays are published chunk by chunk, each after the previous
// one's outcome is known.
func chunkEnd(sizes []int, start, budget int) int {
	end, size := start, 0
	for end < len(sizes) && (end == start || size+sizes[end] <= budget) {
		size += sizes[end]
		end++
	}
	return end
}
