package main

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// warmupSeconds is how long warmBroker keeps the broker busy.
const warmupSeconds = 20

// warmBroker keeps a freshly started broker busy producing and consuming for warmupSeconds
// before anything is measured. Its JVM compiles the produce and fetch paths as they run: on a
// broker a minute old the side by side with Debezium measured 40 µs of broker CPU per event
// in a relay's drain, against 2.3 µs when the scenario ran last in a full run. Every scenario
// then meets the same warm broker, whether it runs alone or in the full suite.
func (e *env) warmBroker(ctx context.Context) error {
	topic, err := e.newTopic(ctx, "warmup")
	if err != nil {
		return err
	}
	defer e.deleteTopic(context.Background(), topic)
	prod, err := e.newProducer(topic)
	if err != nil {
		return err
	}
	defer prod.Close()
	cons, err := e.newTopicConsumer(topic)
	if err != nil {
		return err
	}
	defer cons.Close()
	ctx, cancel := context.WithTimeout(ctx, warmupSeconds*time.Second)
	defer cancel()
	consumed := make(chan int)
	go func() {
		n := 0
		for ctx.Err() == nil {
			n += cons.PollFetches(ctx).NumRecords()
		}
		consumed <- n
	}()
	value := []byte(seqPayload(0, "order-0"))
	produced := 0
	for i := 0; ctx.Err() == nil; i++ {
		// Batches like a draining relay's, then single records like a paced one's.
		n := 500
		if i%2 == 1 {
			n = 1
		}
		recs := make([]*kgo.Record, n)
		for j := range recs {
			recs[j] = &kgo.Record{Key: fmt.Appendf(nil, "order-%d", (i*n+j)%1000), Value: value}
		}
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil && ctx.Err() == nil {
			return fmt.Errorf("warm-up produce: %w", err)
		}
		produced += n
	}
	progress("broker warm-up: %d records produced, %d consumed in %ds", produced, <-consumed, warmupSeconds)
	return nil
}

// newProducer returns a client producing to topic as a careful publisher does: every record
// acknowledged by all in-sync replicas, sent without waiting for more.
func (e *env) newProducer(topic string) (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers...), kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0))
}
