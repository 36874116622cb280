// Package seqtest writes numbered events through the outbox writer library and checks, as a
// consumer with an inbox would, that they arrived: each aggregate's events in sequence after
// dropping duplicates by event_id, each aggregate on one partition, none lost. Shared by the
// relay's and the operator's tests.
package seqtest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
)

// Header names the relay sets (relay.HeaderEventID and relay.HeaderAggregateID; not imported, so
// that the relay's own tests can use this package).
const (
	headerEventID     = "event_id"
	headerAggregateID = "aggregate_id"
)

// Event is the payload of a numbered event: aggregate Agg's Seq-th event.
type Event struct {
	Agg string `json:"agg"`
	Seq int    `json:"seq"`
	Pad string `json:"pad,omitempty"`
}

// Append appends, in one transaction with outbox.AppendBatch, one event per (aggregate,
// sequence) pair, with a traceparent header.
func Append(ctx context.Context, pool *pgxpool.Pool, w *outbox.Writer, aggType string, evs []Event) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return AppendIn(ctx, tx, w, aggType, evs) })
}

// AppendEvents appends evs in one transaction with outbox.AppendBatch.
func AppendEvents(ctx context.Context, pool *pgxpool.Pool, w *outbox.Writer, evs []outbox.Event) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.AppendBatch(ctx, tx, evs)
		return err
	})
}

// AppendIn is Append in the caller's transaction.
func AppendIn(ctx context.Context, tx pgx.Tx, w *outbox.Writer, aggType string, evs []Event) error {
	batch := make([]outbox.Event, len(evs))
	for i, e := range evs {
		p, _ := json.Marshal(e)
		batch[i] = outbox.Event{AggregateType: aggType, AggregateID: e.Agg, EventType: "Seq", Payload: p,
			Headers: map[string]string{"traceparent": fmt.Sprintf("00-%032x-%016x-01", i+1, e.Seq)}}
	}
	_, err := w.AppendBatch(ctx, tx, batch)
	return err
}

// CheckOrder checks the records as a consumer with an inbox sees them and returns the number of
// duplicates it dropped. wantPerAgg is each aggregate's last sequence number; after, when not
// nil, the sequence numbers already delivered elsewhere.
func CheckOrder(t testing.TB, recs []kafkatest.Record, wantPerAgg, after map[string]int) (dups int) {
	t.Helper()
	sorted := append([]kafkatest.Record(nil), recs...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if sorted[i].Topic != sorted[j].Topic {
			return sorted[i].Topic < sorted[j].Topic
		}
		if sorted[i].Partition != sorted[j].Partition {
			return sorted[i].Partition < sorted[j].Partition
		}
		return sorted[i].Offset < sorted[j].Offset
	})
	seen := map[string]bool{}
	next := map[string]int{}
	for a, n := range after {
		next[a] = n
	}
	partition := map[string]string{}
	reorders := 0
	for _, r := range sorted {
		id := r.Headers[headerEventID]
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		var e Event
		if err := json.Unmarshal(r.Value, &e); err != nil {
			t.Fatalf("record %s[%d]@%d: payload %q: %v", r.Topic, r.Partition, r.Offset, r.Value, err)
		}
		if r.Key != e.Agg || r.Headers[headerAggregateID] != e.Agg {
			t.Errorf("record of %s has key %q and aggregate_id header %q", e.Agg, r.Key, r.Headers[headerAggregateID])
		}
		p := fmt.Sprintf("%s[%d]", r.Topic, r.Partition)
		if prev, ok := partition[e.Agg]; ok && prev != p {
			t.Errorf("aggregate %s on two partitions: %s and %s", e.Agg, prev, p)
		}
		partition[e.Agg] = p
		if e.Seq != next[e.Agg]+1 {
			if reorders < 10 {
				t.Errorf("aggregate %s: got seq %d after %d (%s offset %d)", e.Agg, e.Seq, next[e.Agg], p, r.Offset)
			}
			reorders++
		}
		if e.Seq > next[e.Agg] {
			next[e.Agg] = e.Seq
		}
	}
	lost := 0
	for agg, n := range wantPerAgg {
		if next[agg] != n {
			lost += n - next[agg]
			if lost < 10 {
				t.Errorf("aggregate %s: last seq %d, want %d", agg, next[agg], n)
			}
		}
	}
	if reorders > 0 || lost > 0 {
		t.Errorf("%d reorders, %d lost", reorders, lost)
	}
	return dups
}

// Load is a continuous write load: writers goroutines append transactions of perTx events to
// aggregates agg-0000.., each writer numbering its own aggregates, until Stop.
type Load struct {
	stop    atomic.Bool
	wg      sync.WaitGroup
	written atomic.Int64
	want    []map[string]int
	errs    chan error
}

// StartLoad starts the writers; pause is the sleep between two transactions of a writer.
func StartLoad(ctx context.Context, pool *pgxpool.Pool, w *outbox.Writer, aggType string, aggregates, writers, perTx int, pause time.Duration) *Load {
	l := &Load{want: make([]map[string]int, writers), errs: make(chan error, writers)}
	for wr := range writers {
		l.want[wr] = map[string]int{}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(wr), 11))
			for !l.stop.Load() {
				evs := make([]Event, 0, perTx)
				for range perTx {
					a := fmt.Sprintf("agg-%04d", rnd.IntN(aggregates/writers)*writers+wr)
					l.want[wr][a]++
					evs = append(evs, Event{Agg: a, Seq: l.want[wr][a]})
				}
				if err := Append(ctx, pool, w, aggType, evs); err != nil {
					l.errs <- err
					return
				}
				l.written.Add(int64(perTx))
				time.Sleep(pause)
			}
		}()
	}
	return l
}

// Written is the number of events committed so far.
func (l *Load) Written() int { return int(l.written.Load()) }

// Stop stops the writers and returns each aggregate's last sequence number; a write error fails t.
func (l *Load) Stop(t testing.TB) map[string]int {
	t.Helper()
	l.stop.Store(true)
	l.wg.Wait()
	close(l.errs)
	for err := range l.errs {
		t.Fatal(err)
	}
	all := map[string]int{}
	for _, m := range l.want {
		for a, n := range m {
			all[a] = n
		}
	}
	return all
}
