package main

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
)

// warmupSeconds is how long warmBroker keeps the broker busy, warmupPacedSeconds how long it
// then produces at a steady rate's cadence.
const (
	warmupSeconds      = 30
	warmupPacedSeconds = 15
)

// warmBroker keeps a freshly started broker busy producing and consuming for warmupSeconds
// before anything is measured. Its JVM compiles the produce and fetch paths as they run: on a
// broker a minute old the side by side with Debezium measured 40 µs of broker CPU per event
// in a relay's drain, against 2.3 µs when the scenario ran last in a full run. Every scenario
// then meets the same warm broker, whether it runs alone or in the full suite.
//
// The records are shaped as the publishers' are (a relay's headers, on a topic stamped at
// append), and the calls alternate between the shapes the publishers send: idempotent
// produces of a drain's batch and of one record, and transactions (each with a cursor record
// on a compacted topic, as an exactly-once relay's) of a drain's batch and of a paced batch,
// read meanwhile by a read_committed consumer and a plain one. What it does not remove: on a
// broker a few minutes old the C2 compiler thread took 25-40% of the broker's CPU through the
// exactly-once drain and latency runs (/proc, by thread; 5-15% under at-least-once), also after
// a rehearsal drain of each publisher's own; its JIT log showed first compilations (133 at C2
// in 15 s), not a loop of recompiling. That is counted as the broker's cost, and the reports
// give the JIT compiler threads' part of it beside (CPUUsage.KafkaJIT): in one run the
// compilers took 99 of Debezium's 264 broker µs per event at 500/s and 28 of the relay's 190.
func (e *env) warmBroker(ctx context.Context) error {
	topic, err := e.newAppendTimeTopic(ctx, "warmup")
	if err != nil {
		return err
	}
	defer e.deleteTopic(context.Background(), topic)
	compact := "compact"
	cursors, err := e.newTopicWith(ctx, "warmup.cursors", map[string]*string{"cleanup.policy": &compact})
	if err != nil {
		return err
	}
	defer e.deleteTopic(context.Background(), cursors)
	prod, err := e.newProducer(topic)
	if err != nil {
		return err
	}
	defer prod.Close()
	txn, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0),
		kgo.TransactionalID("bench-warmup-"+topic), kgo.ConcurrentTransactionsBackoff(time.Millisecond),
		kgo.MaxVersions(kversion.V3_9_0())) // as the exactly-once relay runs them
	if err != nil {
		return err
	}
	defer txn.Close()
	// The consumers stop once the last call ended: a call is never cut short (a transaction
	// left open would hold back the read_committed consumer, and linger on the broker).
	var readers []*topicReader
	for _, committed := range []bool{false, true} {
		r, err := e.startTopicReader(ctx, topic, committed)
		if err != nil {
			return err
		}
		defer r.stop()
		readers = append(readers, r)
	}
	value := []byte(seqPayload(0, "order-0"))
	headers := []kgo.RecordHeader{
		{Key: "event_id", Value: []byte("0196f3a0-7c1e-7d3a-9b1e-3f2a1c0d4e5f")},
		{Key: "event_type", Value: []byte("OrderPlaced")},
		{Key: "aggregate_type", Value: []byte("order")},
		{Key: "aggregate_id", Value: []byte("order-0")},
	}
	produced, inTxns := 0, 0
	call := func(i, n int, inTxn bool) error {
		recs := make([]*kgo.Record, n)
		for j := range recs {
			recs[j] = &kgo.Record{Key: fmt.Appendf(nil, "order-%d", (i*n+j)%1000), Value: value, Headers: headers}
		}
		if err := warmCall(ctx, prod, txn, inTxn, recs, cursors); err != nil {
			return fmt.Errorf("warm-up produce: %w", err)
		}
		produced += n
		if inTxn {
			inTxns += n
		}
		return nil
	}
	for i, end := 0, time.Now().Add(warmupSeconds*time.Second); time.Now().Before(end); i++ {
		// A draining relay's batch, a paced relay's single record, an exactly-once relay's
		// drain and paced transactions.
		if err := call(i, []int{500, 1, 2000, 16}[i%4], i%4 >= 2); err != nil {
			return err
		}
	}
	// Then at a steady rate's cadence, the consumers caught up: each of their fetches waits on
	// the broker until a produce completes it, the paths every latency run takes and the calls
	// above, always ahead of the consumers, never reach. Without this the JIT compiled them in
	// the first latency windows (C2 160 µs per event in the floor's run at 500/s).
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for i, end := 0, time.Now().Add(warmupPacedSeconds*time.Second); time.Now().Before(end); i++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		// An at-least-once relay's batch at 2,000 events/s, and an exactly-once one's.
		if err := call(i, []int{3, 3, 3, 8}[i%4], i%4 == 3); err != nil {
			return err
		}
	}
	read := int64(0)
	for _, r := range readers {
		r.stop()
		read += r.read()
	}
	progress("broker warm-up: %d records produced (%d in transactions), %d read by two consumers in %ds, the last %ds paced",
		produced, inTxns, read, warmupSeconds+warmupPacedSeconds, warmupPacedSeconds)
	return nil
}

// warmCall sends recs once: an idempotent produce on prod, or a transaction on txn that also
// carries a cursor record.
func warmCall(ctx context.Context, prod, txn *kgo.Client, inTxn bool, recs []*kgo.Record, cursors string) error {
	if !inTxn {
		return prod.ProduceSync(ctx, recs...).FirstErr()
	}
	if err := txn.BeginTransaction(); err != nil {
		return err
	}
	recs = append(recs, &kgo.Record{Topic: cursors, Key: []byte("shard-0"), Value: []byte(`{"xmin":1,"xmax":2,"last_id":3}`)})
	if err := txn.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		_ = txn.EndTransaction(ctx, kgo.TryAbort)
		return err
	}
	return txn.EndTransaction(ctx, kgo.TryCommit)
}

// newProducer returns a client producing to topic as a careful publisher does: every record
// acknowledged by all in-sync replicas, sent without waiting for more.
func (e *env) newProducer(topic string) (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers...), kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0))
}
