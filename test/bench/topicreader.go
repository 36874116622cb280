package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// topicReader is a consumer of a topic from its end, counting the records it reads: the
// consumer the broker serves beside a producer (txncost's read variants, the warm-up), whose
// work is the broker's too.
type topicReader struct {
	cl     *kgo.Client
	n      atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once // stop
}

// startTopicReader starts reading topic from its end as it is now (read_committed when
// committed is set).
func (e *env) startTopicReader(ctx context.Context, topic string, committed bool) (*topicReader, error) {
	from, err := e.endOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	opts := []kgo.Opt{kgo.SeedBrokers(e.kafka.Brokers...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from})}
	if committed {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &topicReader{cl: cl, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for rctx.Err() == nil {
			f := cl.PollFetches(rctx)
			r.n.Add(int64(f.NumRecords()))
		}
	}()
	return r, nil
}

// read is how many records the reader has read.
func (r *topicReader) read() int64 { return r.n.Load() }

// await waits until the reader has read n records, or d.
func (r *topicReader) await(n int64, d time.Duration) {
	deadline := time.Now().Add(d)
	for r.read() < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// stop ends the reader; it may be called more than once.
func (r *topicReader) stop() {
	r.once.Do(func() {
		r.cancel()
		<-r.done
		r.cl.Close()
	})
}
