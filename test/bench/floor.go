package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// The floor of the debezium scenario: what commit-to-consumer latency no publisher can beat on
// this machine, under the same load. The writers commit their events as in every latency run
// and then hand each one to the broker themselves (a franz-go producer, acks=all, no linger) as
// soon as COMMIT returns: no process reads the database, nothing waits for a poll, a fetch or a
// batch in flight. What remains is the commit, the produce request, the broker, the consumer,
// and the machine they share with PostgreSQL's writers; a publisher adds to it.

// floorNote says, in the report, what the floor runs are.
const floorNote = "the writers hand each event to the broker themselves as soon as COMMIT returns (franz-go, acks=all, no linger): no publisher reads the database"

// runFloor measures the floor at each rate on a fresh database and topic of srv.
func (e *env) runFloor(ctx context.Context, srv *pgtest.Server, d *DebeziumResult) {
	for _, rate := range d.Rates {
		lr := &LatencyResult{Rate: rate, Writers: 8}
		d.Floor = append(d.Floor, lr)
		progress("debezium: the floor at %.0f events/s (%s)", rate, floorNote)
		if err := e.floorAt(ctx, srv, lr); err != nil {
			lr.Err = err.Error()
			progress("debezium: the floor at %.0f/s: FAILED: %v", rate, err)
		}
	}
}

func (e *env) floorAt(ctx context.Context, srv *pgtest.Server, lr *LatencyResult) error {
	const db = "bench_floor"
	url, err := createDatabaseOn(ctx, srv, e.table, db, 1)
	if err != nil {
		return err
	}
	defer dropDatabaseOn(context.Background(), srv, db)
	topic, err := e.newAppendTimeTopic(ctx, "floor")
	if err != nil {
		return err
	}
	defer e.deleteTopic(context.Background(), topic)
	prod, err := e.newProducer(topic)
	if err != nil {
		return err
	}
	defer prod.Close()
	cg := cpuGroups{pgMaster: postmasterPid(srv.DataDir), kafka: e.kafkaPid, relay: func() []int { return nil }}
	// The hand-off does not wait for the broker's answer, so that each writer keeps its pace; a
	// failed produce stops the run (alive) and the consumer's count.
	var failed atomic.Pointer[error]
	alive := func() error {
		if err := failed.Load(); err != nil {
			return *err
		}
		return nil
	}
	// The observer counts here what no publisher draws: a check of the counting (about zero
	// statements and transaction ids per event).
	obs, err := newPGObserver(ctx, srv, "")
	if err != nil {
		return err
	}
	defer obs.close()
	return e.measureLatency(ctx, lr, latencyTarget{
		url: url, topic: topic, cg: cg, alive: alive, label: "floor", obs: obs,
		peakRSS: func() (int64, error) { return 0, errors.New("no publisher process") },
		handOff: func(ctx context.Context, seq int, key, payload string) error {
			prod.Produce(ctx, &kgo.Record{Key: []byte(key), Value: []byte(payload)}, func(_ *kgo.Record, err error) {
				if err != nil {
					err = fmt.Errorf("produce event %d: %w", seq, err)
					failed.CompareAndSwap(nil, &err)
				}
			})
			return alive()
		},
	})
}

// writeDebeziumFloor reports the floor at each rate beside the latency goal Debezium's p99 sets.
func writeDebeziumFloor(b *strings.Builder, d *DebeziumResult) {
	z := d.peer(peerDebezium)
	var parts []string
	for _, f := range d.Floor {
		if !f.Measured {
			continue
		}
		s := fmt.Sprintf("at %s events/s p50 %.1f, p99 %.1f ms (of which the writer's COMMIT p99 %.1f ms)", fmtInt(f.Rate), f.P50, f.P99, f.CommitP99)
		if zl := latencyAt(z, f.Rate); zl != nil {
			goal := zl.P99 / goalP99VsDebezium
			s += fmt.Sprintf(", against a goal of %.1f ms (a third of Debezium's %.1f)", goal, zl.P99)
			if f.P99 > goal {
				s += ": the goal lies below the floor, so no publisher could meet it in this run"
			}
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return
	}
	fmt.Fprintf(b, "**The floor on this machine** (%s): %s.\n\n", floorNote, strings.Join(parts, "; "))
}

// latencyAt is p's measured latency run (polling, or Debezium's own) at rate, or nil.
func latencyAt(p *PeerResult, rate float64) *LatencyResult {
	if p == nil {
		return nil
	}
	for _, l := range p.Latency {
		if l.Measured && l.Rate == rate {
			return l
		}
	}
	return nil
}

// floorMethod is the sentence of the method that describes the floor runs, when the run has them.
func floorMethod(d *DebeziumResult) string {
	if len(d.Floor) == 0 {
		return ""
	}
	return "Before the publishers, **the floor** is measured at each rate: the same writers on the same server, but " + floorNote + " (below the table). "
}
