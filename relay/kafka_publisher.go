package relay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"
	"github.com/segmentio/kafka-go/protocol"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/internal/kafkaauth"
)

// kafkaPublisher is the publisher: it writes messages with kafka-go's produce requests on one
// Transport (its connections, TLS, SASL, and the cluster layout it routes each request to its
// partitions' leader by): the messages of one call are assigned partitions with Murmur2Balancer
// (the Java client's partitioner) over the topic's partitions, and each partition's messages of
// the call go out, in order, as one record batch, so that the broker accepts or refuses them
// together; the record batches of the partitions one broker leads travel in one produce request
// (the broker's cost is mostly per request: at steady rates a batch of a few events spread over
// six partitions was six requests), the brokers' requests concurrently, with acks from all
// in-sync replicas. A partition whose part failed is retried on its own (produce).
//
// kafka-go's Writer does the same through batching machinery (a goroutine, a timer and channels
// per partition, a batch timeout), which cost the relay a few milliseconds per call for batches
// it has already made.
type kafkaPublisher struct {
	// budget bounds the summed messageSize of one write call, so that one partition's
	// messages of one call fit one produce request under the broker's message.max.bytes (see
	// chunkEnd).
	budget   int
	balancer kafka.Balancer
	// attrs carries the codec (--compression) of every record batch produced.
	attrs     protocol.Attributes
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

// topicPartitions is a topic's partition ids, ascending, and their leaders' broker ids (by
// partition id), as metadata said until expires.
type topicPartitions struct {
	ids     []int
	leaders map[int]int32
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
	if cfg.Kafka.SASLMechanism != "" {
		if mech, err = kafkaauth.SASL(cfg.Kafka.SASLMechanism, cfg.Kafka.SASLUsername, cfg.Kafka.SASLPassword); err != nil {
			return nil, fmt.Errorf("--kafka-sasl-mechanism %s: %w", cfg.Kafka.SASLMechanism, err)
		}
	}
	p := &kafkaPublisher{
		addr:     kafka.TCP(cfg.Kafka.Brokers...),
		topic:    probeTopic(cfg),
		budget:   publishCallBytes(cfg.MaxPayloadBytes),
		attrs:    compressionAttrs(cfg.Compression),
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
		return cfg.DeadLetterTopic // "" where headers name every topic: probe asks for none
	}
	return topics[0]
}

func (p *kafkaPublisher) callBytes() int { return p.budget }

// compressionAttrs returns the record batch attributes of the codec c (none: no attribute).
func compressionAttrs(c contract.Compression) protocol.Attributes {
	var codec compress.Compression
	_ = codec.UnmarshalText([]byte(c)) // Validate checked the name; kafka-go spells them as the contract, "none" too
	return protocol.Attributes(codec)
}

// probe asks the brokers for one of the relay's topics' metadata: whether they can be reached at
// all, with the relay's TLS and SASL settings.
func (p *kafkaPublisher) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// A transport of its own: the publisher's serves metadata from its cache, brokers gone or not.
	tr := &kafka.Transport{DialTimeout: 5 * time.Second, ClientID: p.transport.ClientID, TLS: p.transport.TLS, SASL: p.transport.SASL}
	defer tr.CloseIdleConnections()
	c := &kafka.Client{Addr: p.addr, Transport: tr}
	var topics []string // none: the brokers answer with the topics the relay may describe
	if p.topic != "" {
		topics = []string{p.topic}
	}
	_, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
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
	now := time.Now() // the CreateTime of the records that carry none of their own
	scratch.reset()
	// Assign the messages to partitions, and group them by partition in order.
	for i := range msgs {
		m := &msgs[i]
		t, ok := scratch.topics[m.Topic]
		if !ok {
			var tp topicPartitions
			tp, t.err = p.partitionsRetried(ctx, m.Topic)
			t.ids, t.leaders = tp.ids, tp.leaders
			scratch.topics[m.Topic] = t
		}
		if t.err != nil {
			errs[i] = t.err
			continue
		}
		key := topicPartition{m.Topic, p.balancer.Balance(*m, t.ids...)}
		m.Partition = key.partition // the caller's message says where it went (tracing)
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
			scratch.groups[g].leader = t.leaders[key.partition]
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
			if m.Time.IsZero() {
				m.Time = now
			}
			scratch.recs = append(scratch.recs, m)
		}
		grp.recs = scratch.recs[start:len(scratch.recs):len(scratch.recs)]
	}
	p.produceAll(ctx, scratch)
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

// produceAll sends the call's groups: one produce request per leader for the groups it leads,
// the leaders' requests concurrently; a group that failed is retried on its own (retry).
func (p *kafkaPublisher) produceAll(ctx context.Context, scratch *writeScratch) {
	var reqs [][]*produceGroup // by leader
	byLeader := map[int32]int{}
	for g := range scratch.groups {
		grp := &scratch.groups[g]
		i, ok := byLeader[grp.leader]
		if !ok {
			i = len(reqs)
			byLeader[grp.leader] = i
			reqs = append(reqs, nil)
		}
		reqs[i] = append(reqs[i], grp)
	}
	var wg sync.WaitGroup
	for _, grps := range reqs[min(1, len(reqs)):] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.produceLed(ctx, grps)
		}()
	}
	if len(reqs) > 0 {
		p.produceLed(ctx, reqs[0])
	}
	wg.Wait()
}

// produceLed sends grps, the groups of partitions one broker leads, in one produce request,
// and retries those that failed, each on its own and concurrently.
func (p *kafkaPublisher) produceLed(ctx context.Context, grps []*produceGroup) {
	if len(grps) == 1 {
		p.retry(ctx, grps[0], 1, p.produceOnce(ctx, grps[0]))
		return
	}
	p.produceTogether(ctx, grps)
	var wg sync.WaitGroup
	for _, grp := range grps {
		if grp.err == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.retry(ctx, grp, 1, grp.err)
		}()
	}
	wg.Wait()
}

// produceTogether sends grps in one produce request, a record batch per group, and stores each
// group's outcome in it: the request's error, or its partition's.
func (p *kafkaPublisher) produceTogether(ctx context.Context, grps []*produceGroup) {
	req := &produceAPI.Request{Acks: int16(kafka.RequireAll), Timeout: int32(requestTimeout / 2 / time.Millisecond)}
	topicAt := map[string]int{}
	for _, grp := range grps {
		grp.err, grp.recErrs = nil, nil
		i, ok := topicAt[grp.topic]
		if !ok {
			i = len(req.Topics)
			topicAt[grp.topic] = i
			req.Topics = append(req.Topics, produceAPI.RequestTopic{Topic: grp.topic})
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, produceAPI.RequestPartition{
			Partition: int32(grp.partition),
			RecordSet: protocol.RecordSet{Attributes: p.attrs, Records: &recordReader{msgs: grp.recs}},
		})
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	m, err := p.transport.RoundTrip(rctx, p.addr, req)
	if err != nil {
		for _, grp := range grps {
			grp.err = fmt.Errorf("kafka produce: %w", err)
		}
		return
	}
	res, _ := m.(*produceAPI.Response)
	parts := map[topicPartition]*produceAPI.ResponsePartition{}
	if res != nil {
		for t := range res.Topics {
			for k := range res.Topics[t].Partitions {
				rp := &res.Topics[t].Partitions[k]
				parts[topicPartition{res.Topics[t].Topic, int(rp.Partition)}] = rp
			}
		}
	}
	for _, grp := range grps {
		rp, ok := parts[grp.topicPartition]
		switch {
		case !ok:
			grp.err = fmt.Errorf("kafka produce: no answer for %s[%d]", grp.topic, grp.partition)
		case rp.ErrorCode != 0:
			grp.err = kafka.Error(rp.ErrorCode)
			if rp.ErrorMessage != "" {
				grp.err = fmt.Errorf("%w: %s", grp.err, rp.ErrorMessage)
			}
			for _, re := range rp.RecordErrors {
				if grp.recErrs == nil {
					grp.recErrs = map[int]error{}
				}
				grp.recErrs[int(re.BatchIndex)] = errors.New(re.BatchIndexErrorMessage)
			}
		}
	}
}

// produceOnce sends grp's messages in one produce request of their own, and returns the error
// (the broker's errors of single records in grp.recErrs).
func (p *kafkaPublisher) produceOnce(ctx context.Context, grp *produceGroup) error {
	grp.recErrs = nil
	res, err := p.client.Produce(ctx, &kafka.ProduceRequest{
		Topic:        grp.topic,
		Partition:    grp.partition,
		RequiredAcks: kafka.RequireAll,
		Compression:  p.attrs.Compression(),
		Records:      &recordReader{msgs: grp.recs},
	})
	if err == nil && res.Error != nil {
		err, grp.recErrs = res.Error, res.RecordErrors
	}
	return err
}

// retry takes err, the outcome of grp's attempt, and sends grp again on its own while the error
// is temporary, up to produceAttempts attempts in all, with the topic's metadata asked for again
// before each retry; it stores the outcome in grp.
func (p *kafkaPublisher) retry(ctx context.Context, grp *produceGroup, attempt int, err error) {
	delay := produceBackoffMin
	for ; ; attempt++ {
		grp.err = err
		if err == nil {
			return
		}
		p.forget(grp.topic)
		// The broker saying it has no such topic or partition, while the metadata the request
		// was routed by said it had, is retried like the Writer did; the metadata asked for
		// before the retry tells a topic that is gone (a refusal) from one not known yet. A
		// request whose partitions had different leaders by the transport's metadata (which
		// changed since ours) is retried too.
		retry := transient(err) || errors.Is(err, kafka.UnknownTopicOrPartition) || errors.Is(err, kafka.NotLeaderForPartition) ||
			strings.Contains(err.Error(), "mismatching leaders")
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
		err = p.produceOnce(ctx, grp)
	}
}

// partitionsRetried is partitions, tried up to produceAttempts times while the error is
// temporary (a topic just created automatically has no leader for a moment).
func (p *kafkaPublisher) partitionsRetried(ctx context.Context, topic string) (topicPartitions, error) {
	delay := produceBackoffMin
	for attempt := 1; ; attempt++ {
		tp, err := p.partitions(ctx, topic)
		if err == nil || attempt >= produceAttempts || !transient(err) || ctx.Err() != nil {
			return tp, err
		}
		if !sleepCtx(ctx, delay) {
			return topicPartitions{}, err
		}
		delay = min(2*delay, produceBackoffMax)
	}
}

// partitions returns topic's partition ids, ascending, and their leaders: from the cache while
// fresh, or else from a metadata request that, as kafka-go's Writer's did, lets the broker create
// the topic when its auto.create.topics.enable says so. A topic that does not exist is
// kafka.UnknownTopicOrPartition.
func (p *kafkaPublisher) partitions(ctx context.Context, topic string) (topicPartitions, error) {
	p.mu.Lock()
	tp, ok := p.topics[topic]
	p.mu.Unlock()
	if ok && time.Now().Before(tp.expires) {
		return tp, nil
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	// The transport answers from the cluster layout it keeps (and refreshes) when it knows the
	// topic, and asks the broker otherwise.
	r, err := p.transport.RoundTrip(ctx, p.addr, &metadataAPI.Request{TopicNames: []string{topic}, AllowAutoTopicCreation: true})
	if err != nil {
		return topicPartitions{}, err
	}
	var ids []int
	leaders := map[int]int32{}
	found := false
	for _, t := range r.(*metadataAPI.Response).Topics {
		if t.Name != topic {
			continue
		}
		if t.ErrorCode != 0 {
			return topicPartitions{}, kafka.Error(t.ErrorCode)
		}
		found = true
		ids = make([]int, len(t.Partitions))
		for i := range t.Partitions {
			ids[i] = int(t.Partitions[i].PartitionIndex)
			leaders[ids[i]] = t.Partitions[i].LeaderID
		}
	}
	switch {
	case !found:
		return topicPartitions{}, kafka.UnknownTopicOrPartition
	case len(ids) == 0:
		return topicPartitions{}, kafka.LeaderNotAvailable // being created
	}
	slices.Sort(ids)
	tp = topicPartitions{ids: ids, leaders: leaders, expires: time.Now().Add(partitionsTTL)}
	p.mu.Lock()
	p.topics[topic] = tp
	p.mu.Unlock()
	return tp, nil
}

// forget drops topic's cached partition list: the next call asks for it again.
func (p *kafkaPublisher) forget(topic string) {
	p.mu.Lock()
	delete(p.topics, topic)
	p.mu.Unlock()
}
