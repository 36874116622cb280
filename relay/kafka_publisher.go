package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// kafkaPublisher is the publisher: it writes messages with kafka-go's Client.Produce on one
// Transport (its connections, TLS, SASL, and the cluster layout it routes each request to its
// partition's leader by): the messages of one call are assigned partitions with Murmur2Balancer (the Java client's
// partitioner) over the topic's partitions, and each partition's messages of the call go out, in
// order, as one produce request (one record batch), so that the broker accepts or refuses them
// together; the requests of the partitions go out concurrently, with acks from all in-sync
// replicas.
//
// kafka-go's Writer does the same through batching machinery (a goroutine, a timer and channels
// per partition, a batch timeout), which cost the relay a few milliseconds per call for batches
// it has already made.
type kafkaPublisher struct {
	// budget bounds the summed messageSize of one write call, so that one partition's
	// messages of one call fit one produce request under the broker's message.max.bytes (see
	// chunkEnd).
	budget    int
	balancer  kafka.Balancer
	transport *kafka.Transport
	client    *kafka.Client
	addr      net.Addr // the brokers
	topic     string   // a topic of the relay's, for probe

	mu     sync.Mutex
	topics map[string]topicPartitions // partition lists by topic

	// scratch holds the buffers of write calls (*writeScratch), one per call in flight.
	scratch sync.Pool
}

var _ publisher = (*kafkaPublisher)(nil)

// topicPartitions is a topic's partition ids, ascending, as metadata said until expires.
type topicPartitions struct {
	ids     []int
	expires time.Time
}

const (
	// produceAttempts bounds the attempts of one produce request (and of a topic's metadata) on
	// temporary errors; the relay's backoff, with its bookkeeping on the rows, does the rest.
	produceAttempts   = 3
	produceBackoffMin = 50 * time.Millisecond
	produceBackoffMax = 500 * time.Millisecond
	// requestTimeout bounds each request (the broker is given half of it to gather the acks).
	requestTimeout = 10 * time.Second
	// partitionsTTL is how long a topic's partition list is used before it is asked for again
	// (at once after an error that may mean it is stale).
	partitionsTTL = 15 * time.Second
)

func newKafkaPublisher(cfg *Config) (*kafkaPublisher, error) {
	tlsCfg, err := cfg.Kafka.tlsConfig()
	if err != nil {
		return nil, err
	}
	var mech sasl.Mechanism
	switch cfg.Kafka.SASLMechanism {
	case SASLPlain:
		mech = plain.Mechanism{Username: cfg.Kafka.SASLUsername, Password: cfg.Kafka.SASLPassword}
	case SASLScramSHA256, SASLScramSHA512:
		algo := scram.SHA256
		if cfg.Kafka.SASLMechanism == SASLScramSHA512 {
			algo = scram.SHA512
		}
		if mech, err = scram.Mechanism(algo, cfg.Kafka.SASLUsername, cfg.Kafka.SASLPassword); err != nil {
			return nil, fmt.Errorf("--kafka-sasl-mechanism %s: %w", cfg.Kafka.SASLMechanism, err)
		}
	}
	p := &kafkaPublisher{
		addr:     kafka.TCP(cfg.Kafka.Brokers...),
		topic:    probeTopic(cfg),
		budget:   publishCallBytes(cfg.MaxPayloadBytes),
		balancer: kafka.Murmur2Balancer{},
		transport: &kafka.Transport{
			DialTimeout: 5 * time.Second,
			IdleTimeout: time.Minute,
			ClientID:    "outbox-relay",
			TLS:         tlsCfg,
			SASL:        mech,
		},
		topics: map[string]topicPartitions{},
	}
	p.client = &kafka.Client{Addr: p.addr, Transport: p.transport, Timeout: requestTimeout}
	return p, nil
}

// probeTopic is the default topic, or else the first of the topic map's.
func probeTopic(cfg *Config) string {
	if cfg.DefaultTopic != "" {
		return cfg.DefaultTopic
	}
	topics := slices.Sorted(maps.Values(cfg.TopicMap))
	if len(topics) == 0 {
		return ""
	}
	return topics[0]
}

func (p *kafkaPublisher) callBytes() int { return p.budget }

// probe asks the brokers for one of the relay's topics' metadata: whether they can be reached at
// all, with the relay's TLS and SASL settings.
func (p *kafkaPublisher) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// A transport of its own: the publisher's serves metadata from its cache, brokers gone or not.
	tr := &kafka.Transport{DialTimeout: 5 * time.Second, ClientID: p.transport.ClientID, TLS: p.transport.TLS, SASL: p.transport.SASL}
	defer tr.CloseIdleConnections()
	c := &kafka.Client{Addr: p.addr, Transport: tr}
	_, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{p.topic}})
	return err
}

func (p *kafkaPublisher) close() error {
	p.transport.CloseIdleConnections()
	return nil
}

// write publishes msgs (see publisher). Each message goes to the partition Murmur2Balancer picks
// for its key among its topic's partitions; the messages of one partition go out, in order, as
// one produce request, the partitions' requests concurrently. A topic that is missing or
// forbidden fails its own messages only.
func (p *kafkaPublisher) write(ctx context.Context, msgs []kafka.Message, errs []error) bool {
	clear(errs)
	if len(msgs) == 0 {
		return true
	}
	scratch, _ := p.scratch.Get().(*writeScratch)
	if scratch == nil {
		scratch = &writeScratch{}
	}
	complete := p.writeWith(ctx, msgs, errs, scratch)
	if complete {
		// A request that ctx abandoned may still be read by the transport: such a call's
		// buffers are not reused.
		p.scratch.Put(scratch)
	}
	return complete
}

func (p *kafkaPublisher) writeWith(ctx context.Context, msgs []kafka.Message, errs []error, scratch *writeScratch) bool {
	now := time.Now() // the records' CreateTime
	scratch.reset()
	// Assign the messages to partitions, and group them by partition in order.
	for i := range msgs {
		m := &msgs[i]
		t, ok := scratch.topics[m.Topic]
		if !ok {
			t.ids, t.err = p.partitionsRetried(ctx, m.Topic)
			scratch.topics[m.Topic] = t
		}
		if t.err != nil {
			errs[i] = t.err
			continue
		}
		key := topicPartition{m.Topic, p.balancer.Balance(*m, t.ids...)}
		g, ok := scratch.index[key]
		if !ok {
			g = len(scratch.groups)
			scratch.index[key] = g
			if g < cap(scratch.groups) {
				scratch.groups = scratch.groups[:g+1]
				scratch.groups[g] = produceGroup{idx: scratch.groups[g].idx[:0]}
			} else {
				scratch.groups = append(scratch.groups, produceGroup{})
			}
			scratch.groups[g].topicPartition = key
		}
		scratch.groups[g].idx = append(scratch.groups[g].idx, i)
	}
	// Each request reads copies of its messages (with the time set), laid out partition by
	// partition in one slice.
	scratch.recs = scratch.recs[:0]
	for g := range scratch.groups {
		grp := &scratch.groups[g]
		start := len(scratch.recs)
		for _, i := range grp.idx {
			m := msgs[i]
			m.Time = now
			scratch.recs = append(scratch.recs, m)
		}
		grp.recs = scratch.recs[start:len(scratch.recs):len(scratch.recs)]
	}
	if n := len(scratch.groups); n > 0 {
		var wg sync.WaitGroup
		for g := 1; g < n; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.produce(ctx, &scratch.groups[g])
			}()
		}
		p.produce(ctx, &scratch.groups[0])
		wg.Wait()
	}
	complete := true
	for g := range scratch.groups {
		grp := &scratch.groups[g]
		if grp.err != nil && ctx.Err() != nil {
			complete = false
		}
		for k, i := range grp.idx {
			errs[i] = grp.err
			if recErr, ok := grp.recErrs[k]; ok && grp.err != nil {
				errs[i] = fmt.Errorf("%w (this record: %w)", grp.err, recErr)
			}
		}
	}
	for _, t := range scratch.topics {
		if t.err != nil && ctx.Err() != nil {
			complete = false
		}
	}
	return complete
}

// produce sends grp's messages in one produce request, up to produceAttempts times while the
// error is temporary, with the topic's metadata asked for again before each retry, and stores
// the outcome in grp.
func (p *kafkaPublisher) produce(ctx context.Context, grp *produceGroup) {
	grp.err, grp.recErrs = nil, nil
	delay := produceBackoffMin
	for attempt := 1; ; attempt++ {
		res, err := p.client.Produce(ctx, &kafka.ProduceRequest{
			Topic:        grp.topic,
			Partition:    grp.partition,
			RequiredAcks: kafka.RequireAll,
			Records:      &recordReader{msgs: grp.recs},
		})
		if err == nil && res.Error != nil {
			err, grp.recErrs = res.Error, res.RecordErrors
		}
		grp.err = err
		if err == nil {
			return
		}
		p.forget(grp.topic)
		// The broker saying it has no such topic or partition, while the metadata the request
		// was routed by said it had, is retried like the Writer did; the metadata asked for
		// before the retry tells a topic that is gone (a refusal) from one not known yet.
		retry := transient(err) || errors.Is(err, kafka.UnknownTopicOrPartition)
		if attempt >= produceAttempts || !retry || ctx.Err() != nil {
			return
		}
		if !sleepCtx(ctx, delay) {
			return
		}
		delay = min(2*delay, produceBackoffMax)
		if _, err := p.partitions(ctx, grp.topic); err != nil && !transient(err) {
			grp.err = err
			return
		}
	}
}

// partitionsRetried is partitions, tried up to produceAttempts times while the error is
// temporary (a topic just created automatically has no leader for a moment).
func (p *kafkaPublisher) partitionsRetried(ctx context.Context, topic string) ([]int, error) {
	delay := produceBackoffMin
	for attempt := 1; ; attempt++ {
		ids, err := p.partitions(ctx, topic)
		if err == nil || attempt >= produceAttempts || !transient(err) || ctx.Err() != nil {
			return ids, err
		}
		if !sleepCtx(ctx, delay) {
			return nil, err
		}
		delay = min(2*delay, produceBackoffMax)
	}
}

// partitions returns topic's partition ids, ascending: from the cache while fresh, or else from
// a metadata request that, as kafka-go's Writer's did, lets the broker create the topic when its
// auto.create.topics.enable says so. A topic that does not exist is kafka.UnknownTopicOrPartition.
func (p *kafkaPublisher) partitions(ctx context.Context, topic string) ([]int, error) {
	p.mu.Lock()
	tp, ok := p.topics[topic]
	p.mu.Unlock()
	if ok && time.Now().Before(tp.expires) {
		return tp.ids, nil
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	// The transport answers from the cluster layout it keeps (and refreshes) when it knows the
	// topic, and asks the broker otherwise.
	r, err := p.transport.RoundTrip(ctx, p.addr, &metadataAPI.Request{TopicNames: []string{topic}, AllowAutoTopicCreation: true})
	if err != nil {
		return nil, err
	}
	var ids []int
	found := false
	for _, t := range r.(*metadataAPI.Response).Topics {
		if t.Name != topic {
			continue
		}
		if t.ErrorCode != 0 {
			return nil, kafka.Error(t.ErrorCode)
		}
		found = true
		ids = make([]int, len(t.Partitions))
		for i := range t.Partitions {
			ids[i] = int(t.Partitions[i].PartitionIndex)
		}
	}
	switch {
	case !found:
		return nil, kafka.UnknownTopicOrPartition
	case len(ids) == 0:
		return nil, kafka.LeaderNotAvailable // being created
	}
	slices.Sort(ids)
	p.mu.Lock()
	p.topics[topic] = topicPartitions{ids: ids, expires: time.Now().Add(partitionsTTL)}
	p.mu.Unlock()
	return ids, nil
}

// forget drops topic's cached partition list: the next call asks for it again.
func (p *kafkaPublisher) forget(topic string) {
	p.mu.Lock()
	delete(p.topics, topic)
	p.mu.Unlock()
}

type topicPartition struct {
	topic     string
	partition int
}

// produceGroup is one produce request of a write call: a partition's messages, and its outcome.
type produceGroup struct {
	topicPartition
	idx     []int           // the messages' indexes in the call, ascending
	recs    []kafka.Message // copies of those messages, with the call's time
	err     error
	recErrs map[int]error // the broker's errors of single records, by index in recs
}

// writeScratch is the buffers of one write call, reused by later ones.
type writeScratch struct {
	topics map[string]topicResult
	index  map[topicPartition]int
	groups []produceGroup
	recs   []kafka.Message
}

// topicResult is a topic's partitions for one write call, or why it has none.
type topicResult struct {
	ids []int
	err error
}

func (s *writeScratch) reset() {
	if s.index == nil {
		s.index = map[topicPartition]int{}
		s.topics = map[string]topicResult{}
	}
	clear(s.index)
	clear(s.topics)
	s.groups = s.groups[:0]
}

// recordReader hands a produce request its records: the messages' keys, values, headers and
// times, without copying them.
type recordReader struct {
	msgs       []kafka.Message
	next       int
	rec        kafka.Record
	key, value bytesReadCloser
}

func (r *recordReader) ReadRecord() (*kafka.Record, error) {
	if r.next >= len(r.msgs) {
		return nil, io.EOF
	}
	m := &r.msgs[r.next]
	r.next++
	r.rec = kafka.Record{Time: m.Time, Headers: m.Headers}
	if m.Key != nil {
		r.key.Reset(m.Key)
		r.rec.Key = &r.key
	}
	if m.Value != nil {
		r.value.Reset(m.Value)
		r.rec.Value = &r.value
	}
	return &r.rec, nil
}

type bytesReadCloser struct{ bytes.Reader }

func (*bytesReadCloser) Close() error { return nil }
