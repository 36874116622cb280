// Package contract holds facts the operator and the relay must agree on, defined once for both
// (the relay's binary cannot be imported by the operator without its Kafka client).
package contract

import (
	"net/url"
	"time"
)

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

// Kafka header names the relay sets on every message from the row's own columns, and on
// dead-letter messages: the writer library refuses them in an event's headers, the relay drops
// them from a row's headers, the inbox library reads the event id from them.
const (
	HeaderEventID       = "event_id"
	HeaderEventType     = "event_type"
	HeaderAggregateType = "aggregate_type"
	HeaderAggregateID   = "aggregate_id"
	// HeaderError carries the reason on a dead-letter message.
	HeaderError = "error"
	// HeaderOriginalTopic carries, on a dead-letter message, the topic the event was meant for,
	// when the topic map or the default topic names one.
	HeaderOriginalTopic = "original_topic"
	// HeaderReplay marks a message a replay published again (`kubectl outbox replay`): the id of
	// the replay. The event_id is the event's own, so a consumer with an inbox drops the copy of an
	// event it already has.
	HeaderReplay = "outbox_replay"
)

// ReservedHeaders are the header names above, which an event's own headers may not use.
var ReservedHeaders = []string{HeaderEventID, HeaderEventType, HeaderAggregateType, HeaderAggregateID, HeaderError, HeaderOriginalTopic, HeaderReplay}

// MaxHeaderNameLength bounds the name of a row header the relay routes by (relay --topic-header
// and --key-header, spec.routing).
const MaxHeaderNameLength = 128

// DefaultMaxPayloadBytes is the payload limit of the writer library and of the relay unless
// set: below Kafka's default 1 MB message size, with room for the key and headers.
const DefaultMaxPayloadBytes = 900_000

// The relay's environment variables that carry secrets: the operator sets them from Secret
// references only, and the relay reads them from the environment only (never a flag).
const (
	EnvDatabaseURL  = "OUTBOX_DATABASE_URL"
	EnvSASLUsername = "OUTBOX_KAFKA_SASL_USERNAME"
	EnvSASLPassword = "OUTBOX_KAFKA_SASL_PASSWORD"
	// The Schema Registry's basic-auth credentials (relay --schema-registry-url).
	EnvRegistryUsername = "OUTBOX_SCHEMA_REGISTRY_USERNAME"
	EnvRegistryPassword = "OUTBOX_SCHEMA_REGISTRY_PASSWORD"
	// EnvTLSInsecureSkipVerify is a variable rather than a flag in the Deployment: a relay that
	// does not know it ignores it and keeps verifying certificates, the safe side.
	EnvTLSInsecureSkipVerify = "OUTBOX_KAFKA_TLS_INSECURE_SKIP_VERIFY"
)

// Wake-ups: how an idle relay learns that events were committed (docs/architecture.md,
// "Wake-ups"). By default it polls and the table has no insert trigger, so the application's
// transactions pay nothing for wake-ups: the trigger, even when no relay waits and it notifies
// nobody, cost 32 durable writers about 8% of their throughput (make bench, the write path).
// Notifications (spec.publish.notify, --notify) bring an idle relay's first event down from
// half a poll interval to about a millisecond at that cost.
const (
	// DefaultNotify is whether relays listen for notifications unless told otherwise.
	DefaultNotify = false
	// PollInterval is the default poll interval of a relay that polls: under load it never
	// sleeps, and right after a fetch that found events it looks again within a millisecond,
	// doubling its wait up to this; idle for longer, it backs off (IdlePollInterval). PostgreSQL
	// answers each idle poll from the current snapshot or, under snapshot tracking, from the id
	// sequence alone.
	PollInterval = 10 * time.Millisecond
	// NotifyPollInterval is the default poll interval of a relay that listens: the fallback for
	// a notification that does not come (a writer that bypasses the trigger, a lost connection).
	// Each such poll renews the wake-up claim and, in the same round trip, checks for events:
	// two statements a shard (the claim and, under snapshot tracking, the check whether anything
	// was committed since the last snapshot, which opens a batch only if so; under row tracking,
	// the fetch). At 5 s, 100 idle row shards cost 66 statements/s (make bench, "Idle shards",
	// 2026-12-03; the target is 50); at 10 s, 35 (2026-12-04).
	NotifyPollInterval = 10 * time.Second
)

// A relay that polls backs off while it finds nothing: after an idle spell of T it waits up to
// T/IdleBackoffShare between polls, never more than IdlePollInterval (--idle-poll-interval,
// spec.publish.idlePollInterval) nor less than its poll interval, and its first fetch that finds
// events brings it back to the poll interval. So an event committed after an idle spell of T
// waits at most T/16 (a sixteenth: 60 ms after a second, 5 s after 80 s or more) for its poll,
// while a stream of events, however sparse, keeps the relay near its poll interval. Idle, a shard
// then costs its database one small statement every IdlePollInterval instead of one every poll
// interval: 100 idle shards polling at 10 ms sent 4,293 statements/s and cost PostgreSQL about
// two cores (make bench, "Idle shards", 2026-12-03; the target is under 50 statements/s and 5%
// of a core). Relays that listen (--notify) wake on the writers' notifications and do not back
// off: their poll is already the slow fallback. At or below the poll interval: no backoff.
const (
	// IdlePollInterval is the default longest wait of an idle relay that polls.
	IdlePollInterval = 5 * time.Second
	// IdlePollIntervalLimit bounds --idle-poll-interval: the first event after a long idle waits
	// at most this long.
	IdlePollIntervalLimit = 5 * time.Minute
	// IdleBackoffShare: an idle relay waits at most this fraction (1/IdleBackoffShare) of the
	// time it has been idle.
	IdleBackoffShare = 16
)

// Batches gathered by a latency budget (--max-delay, spec.publish.maxDelay): after a fetch that
// found events but did not fill a batch, a relay fetches again only once MaxDelay has passed
// since that fetch began, so that at steady rates what commits within the budget travels in one
// round trip and one produce request per partition rather than one each per commit. The first
// event after an idle spell goes at once; at rates that fill batches, or where a round trip and
// its publication take longer than the budget, nothing waits. The default was chosen in make
// bench (docs/benchmarks.md, "Cost per event at each steady rate"): at 5 ms the relays' p99 at
// 2,000 and 500 events/s was half Debezium's and the broker still spent more per event than for
// Debezium; at 10 ms the p99 at 500 events/s came within 1 ms of Debezium's; 8 ms keeps the p99
// below Debezium's at both rates with most of the saving.
const (
	// MaxDelay is the default budget.
	MaxDelay = 8 * time.Millisecond
	// MaxDelayLimit bounds the budget from above (0, fetching again at once, is allowed): far
	// below the shortest lock lease's beat, so a relay gathering keeps its lease.
	MaxDelayLimit = time.Second
)

// DefaultPollInterval returns the poll interval of a relay that sets none.
func DefaultPollInterval(notify bool) time.Duration {
	if notify {
		return NotifyPollInterval
	}
	return PollInterval
}

// A relay that cannot publish because of Kafka says so to the operator in its lock connection's
// application_name, "[state] " before its usual name, which the operator reads from
// pg_stat_activity for the sessions holding the table's presence locks (RelaysAvailable then
// names the cause rather than only counting unready pods).
const (
	// RelayKafkaUnreachable: no broker answered its last publication or probe.
	RelayKafkaUnreachable = "kafka-unreachable"
	// RelayKafkaRefused: the cluster refused the relay itself: credentials (SASL), permissions
	// (ACLs), TLS, or a topic that does not exist.
	RelayKafkaRefused = "kafka-refused"
)

// RelayStateName returns the application_name of a relay's lock connection in state ("" for
// none) given its usual name.
func RelayStateName(state, name string) string {
	if state == "" {
		return name
	}
	return "[" + state + "] " + name
}

// RelayState returns the state a relay's application_name carries, "" for none.
func RelayState(appName string) string {
	for _, s := range []string{RelayKafkaUnreachable, RelayKafkaRefused} {
		if len(appName) > len(s)+2 && appName[:len(s)+2] == "["+s+"]" {
			return s
		}
	}
	return ""
}

// ValidOTLPEndpoint reports whether s is an endpoint the relays export spans to (relay
// --otlp-endpoint, the operator's --relay-otlp-endpoint): an http:// (plaintext) or https://
// (TLS) URL with a host.
func ValidOTLPEndpoint(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}
