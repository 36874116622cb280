package relay

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Poison reasons, the "reason" label of outbox_poison_events_total.
const (
	reasonNoTopic     = "no_topic"
	reasonOversized   = "oversized"
	reasonMaxAttempts = "max_attempts"
	reasonBadHeaders  = "bad_headers"
	reasonNoValue     = "no_value"
	// reasonInvalid: an event the table's CHECKs would refuse, from a plain INSERT into a table
	// without them (a new table's default; spec.writers.checks: Relay): an empty aggregate_type,
	// aggregate_id or event_type. Headers that are not a JSON object are reasonBadHeaders.
	reasonInvalid = "invalid"
	// reasonSchema: the event's subject has no usable schema, or its payload does not fit it
	// (--schema-registry-url).
	reasonSchema = "schema"
	// reasonSkipped: someone asked for the event to go to the dead-letter topic (kubectl outbox
	// skip --to-dead-letter, outboxdb.DeadLetterRequested).
	reasonSkipped = "skipped"
)

// metrics are the relay's own Prometheus metrics, on its own registry, each labelled with the
// shard and the table.
type metrics struct {
	registry *prometheus.Registry

	pending       prometheus.Gauge
	lag           prometheus.Gauge
	blocked       prometheus.Gauge
	parked        prometheus.Gauge
	published     prometheus.Counter
	replayed      prometheus.Counter
	publishErrors prometheus.Counter
	poison        *prometheus.CounterVec
	tick          prometheus.Histogram
	claims        prometheus.Counter
	standbyWait   prometheus.Counter
	quietPolls    prometheus.Counter
	gathered      prometheus.Counter
	ready         prometheus.Gauge
}

func newMetrics(table string, shard int) *metrics {
	labels := prometheus.Labels{"shard": strconv.Itoa(shard), "table": table}
	m := &metrics{
		registry: prometheus.NewRegistry(),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_pending", ConstLabels: labels,
			Help: "Pending (unsent) rows of this shard, refreshed every few seconds; past the count limit, extrapolated from the ids.",
		}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_lag_seconds", ConstLabels: labels,
			Help: "Age of the oldest pending row of this shard (the first in publish order), 0 when none.",
		}),
		blocked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_blocked_aggregates", ConstLabels: labels,
			Help: "Aggregates whose later events wait because one of their events failed.",
		}),
		parked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_parked_aggregates", ConstLabels: labels,
			Help: "Snapshot tracking: aggregates with events parked in <table>_parked (a failed event and every later event of its aggregate), retried with backoff.",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_published_total", ConstLabels: labels,
			Help: "Events acknowledged by Kafka on their topic and marked sent.",
		}),
		replayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_replay_events_total", ConstLabels: labels,
			Help: "Events a replay published again (kubectl outbox replay), counted when their batch is committed.",
		}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_publish_errors_total", ConstLabels: labels,
			Help: "Failed publish attempts of an event, poison events included.",
		}),
		poison: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_poison_events_total", ConstLabels: labels,
			Help: "Poison events met, by reason (invalid, no_topic, no_value, schema, oversized, bad_headers, max_attempts, skipped) and policy (block, dead-letter).",
		}, []string{"reason", "policy"}),
		tick: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "outbox_worker_tick_duration_seconds", ConstLabels: labels,
			Help:    "Duration of one relay loop iteration (round trip, wait for the batch in flight, start of the next), idle waits excluded.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		claims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relay_wait_claims_total", ConstLabels: labels,
			Help: "Claims (and renewals) of a wait for a notification: while a relay holds one, inserts notify; under load it holds none.",
		}),
		standbyWait: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relay_standby_wait_seconds_total", ConstLabels: labels,
			Help: "With --wait-for-standbys: time batches waited for the standbys to flush their events' WAL before being published.",
		}),
		quietPolls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relay_quiet_polls_total", ConstLabels: labels,
			Help: "Polls that found nothing committed since the last snapshot: under snapshot tracking they open no batch (no snapshot, no transaction id), under row tracking they run one small statement instead of the fetch. With --notify, the renewals of the claim to be woken that opened no batch (snapshot tracking).",
		}),
		gathered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relay_gather_seconds_total", ConstLabels: labels,
			Help: "Time the relay waited before a fetch to gather events within its latency budget (--max-delay) after a fetch that found events and did not fill its batch.",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_shard_ready", ConstLabels: labels,
			Help: "1 while this relay holds all its shard's bucket locks and its last database round trip succeeded (the operator's outbox_relay_ready is the OutboxRelay's Ready condition).",
		}),
	}
	m.registry.MustRegister(m.pending, m.lag, m.blocked, m.parked, m.published, m.replayed, m.publishErrors, m.poison, m.tick, m.claims, m.standbyWait, m.quietPolls, m.gathered, m.ready,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
