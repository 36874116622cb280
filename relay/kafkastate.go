package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// What the relay knows of Kafka's reachability: it makes the relay not ready while the brokers
// cannot be reached or refuse it (/readyz says which), and the relay reports it to the operator
// in its lock connection's application_name (RelaysAvailable then names the cause).

// probeKafka asks the brokers, before an idle wait, whether they can be reached: while the last
// publication reached none (a relay with nothing to publish would not learn otherwise that they
// are back, and would stay not ready), and when nothing was heard from them for
// cfg.KafkaProbeInterval (an idle relay would not learn otherwise that they are gone).
func (r *Relay) probeKafka(ctx context.Context) {
	if r.kafkaDown.Load() == nil && time.Since(r.kafkaSeen) < r.cfg.KafkaProbeInterval {
		return
	}
	err := r.pub.probe(ctx)
	if ctx.Err() == nil {
		r.kafkaReached(err != nil, err)
	}
}

// reportState tells the operator, through the lock connection's application_name, why the relay
// cannot publish (contract.RelayStateName), when that changed.
func (r *Relay) reportState(conn *pgx.Conn) {
	if r.kafkaState == r.reported {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	name := contract.RelayStateName(r.kafkaState, r.connCfg.RuntimeParams["application_name"])
	if _, err := conn.Exec(ctx, `SELECT set_config('application_name', $1, false)`, name); err == nil {
		r.reported = r.kafkaState
	}
}

// kafkaReached records the outcome of a publication for readiness: down (every message failed
// for want of a reachable broker, err says why) or not.
func (r *Relay) kafkaReached(down bool, err error) {
	if !down {
		r.kafkaSeen = time.Now()
		r.kafkaState = ""
		if r.kafkaDown.Swap(nil) != nil {
			r.log.Info("kafka reachable again")
			r.setReady()
		}
		return
	}
	msg := "kafka unreachable"
	r.kafkaState = contract.RelayKafkaUnreachable
	if r.pub.classify(err) == failRefused {
		msg = "kafka refused the relay (credentials, permissions, TLS or a missing topic)"
		r.kafkaState = contract.RelayKafkaRefused
	}
	if err != nil {
		msg += ": " + r.red.Error(err)
	}
	if r.kafkaDown.Swap(&msg) == nil {
		r.setReady()
	}
}
