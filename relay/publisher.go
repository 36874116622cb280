package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// publisher writes messages with kafka-go Writers: Murmur2Balancer (the Java client's
// partitioner), acks from all in-sync replicas, a 1 ms batch timeout and batch limits matched to
// each call, so that the messages of one partition in one call go out as one produce request and
// succeed or fail together.
//
// kafka-go allocates every partition batch with room for BatchSize messages. One Writer with
// BatchSize = the relay's batch would allocate that much for every partition of every call, also
// when a call carries a handful of events (the steady trickle of a quiet outbox), and keep the
// garbage collector busy. So the publisher holds a Writer per size class, all sharing one
// Transport (its connections and metadata), and a call goes to the smallest class that holds all
// of its messages: no partition can receive more than that in one call.
type publisher struct {
	classes []sizedWriter // ascending batch size; the last is the relay's batch size
	// callBytes bounds the summed messageSize of one write call, so that kafka-go never splits
	// a partition's messages of one call over two requests (see chunking in the relay).
	callBytes int
	transport *kafka.Transport
	addr      net.Addr // the brokers
	topic     string   // a topic of the relay's, for probe
}

type sizedWriter struct {
	size int
	w    *kafka.Writer
}

// writerClasses returns the batch sizes of the publisher's writers: powers of 8 from 8 below
// batchSize, then batchSize.
func writerClasses(batchSize int) []int {
	var sizes []int
	for n := 8; n < batchSize; n *= 8 {
		sizes = append(sizes, n)
	}
	return append(sizes, batchSize)
}

// writerFor returns the writer of the smallest class that holds n messages.
func (p *publisher) writerFor(n int) *kafka.Writer {
	for _, c := range p.classes {
		if n <= c.size {
			return c.w
		}
	}
	return p.classes[len(p.classes)-1].w
}

// publishCallBytes is the byte budget of one write call: Kafka's default message.max.bytes
// (1 MiB per record batch) with headroom, or more when --max-payload-bytes asks for it.
func publishCallBytes(maxPayload int) int {
	return max(1_000_000, maxPayload+100_000)
}

func newPublisher(cfg *Config) (*publisher, error) {
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
	p := &publisher{
		addr:      kafka.TCP(cfg.Kafka.Brokers...),
		topic:     probeTopic(cfg),
		callBytes: publishCallBytes(cfg.MaxPayloadBytes),
		transport: &kafka.Transport{
			DialTimeout: 5 * time.Second,
			IdleTimeout: time.Minute,
			ClientID:    "outbox-relay",
			TLS:         tlsCfg,
			SASL:        mech,
		},
	}
	// A write call's messages for one partition must go in one produce request (one record
	// batch), so that the broker accepts or refuses them together: split in two, a later event of
	// an aggregate could be accepted after an earlier one was refused. The largest class holds a
	// whole fetch: --batch-size rows, or SnapshotFetchFactor times that under snapshot tracking.
	maxBatch := cfg.BatchSize
	if cfg.Tracking == TrackSnapshot {
		maxBatch *= SnapshotFetchFactor
	}
	for _, size := range writerClasses(maxBatch) {
		p.classes = append(p.classes, sizedWriter{size: size, w: &kafka.Writer{
			Addr:         kafka.TCP(cfg.Kafka.Brokers...),
			Balancer:     kafka.Murmur2Balancer{},
			RequiredAcks: kafka.RequireAll,
			BatchTimeout: time.Millisecond,
			BatchSize:    size,
			BatchBytes:   int64(p.callBytes),
			// kafka-go retries a failed produce request itself; keep that short and let the relay's
			// backoff (with its bookkeeping on the rows) do the rest.
			MaxAttempts:            3,
			WriteBackoffMin:        50 * time.Millisecond,
			WriteBackoffMax:        500 * time.Millisecond,
			ReadTimeout:            10 * time.Second,
			WriteTimeout:           10 * time.Second,
			AllowAutoTopicCreation: true, // the broker's auto.create.topics.enable decides
			Transport:              p.transport,
		}})
	}
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

// probe asks the brokers for one of the relay's topics' metadata: whether they can be reached at
// all, with the relay's TLS and SASL settings.
func (p *publisher) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// A transport of its own: the writers' serves metadata from its cache, brokers gone or not.
	tr := &kafka.Transport{DialTimeout: 5 * time.Second, ClientID: p.transport.ClientID, TLS: p.transport.TLS, SASL: p.transport.SASL}
	defer tr.CloseIdleConnections()
	c := &kafka.Client{Addr: p.addr, Transport: tr}
	_, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{p.topic}})
	return err
}

func (p *publisher) close() error {
	var errs []error
	for _, c := range p.classes {
		errs = append(errs, c.w.Close())
	}
	p.transport.CloseIdleConnections()
	return errors.Join(errs...)
}

// write publishes msgs and stores each message's outcome in errs (nil: acknowledged). The
// messages of each topic go through their own concurrent WriteMessages call, so that a topic
// that is missing or forbidden fails its own messages only. It reports whether every call
// returned, false when ctx ended first (kafka-go may then still hold the messages).
func (p *publisher) write(ctx context.Context, msgs []kafka.Message, errs []error, scratch *writeScratch) bool {
	clear(errs)
	if len(msgs) == 0 {
		return true
	}
	single := true
	for i := 1; i < len(msgs); i++ {
		if msgs[i].Topic != msgs[0].Topic {
			single = false
			break
		}
	}
	if single {
		return p.writeGroup(ctx, msgs, errs)
	}
	// Group by topic, keeping each topic's messages in order.
	scratch.reset()
	for i := range msgs {
		g, ok := scratch.index[msgs[i].Topic]
		if !ok {
			g = len(scratch.groups)
			scratch.index[msgs[i].Topic] = g
			scratch.groups = append(scratch.groups, nil)
		}
		scratch.groups[g] = append(scratch.groups[g], i)
	}
	scratch.msgs = scratch.msgs[:0]
	scratch.order = scratch.order[:0]
	bounds := make([]int, 0, len(scratch.groups)+1)
	for _, g := range scratch.groups {
		bounds = append(bounds, len(scratch.msgs))
		for _, i := range g {
			scratch.msgs = append(scratch.msgs, msgs[i])
			scratch.order = append(scratch.order, i)
		}
	}
	bounds = append(bounds, len(scratch.msgs))
	gerrs := make([]error, len(scratch.msgs))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		complete = true
	)
	for g := 0; g+1 < len(bounds); g++ {
		lo, hi := bounds[g], bounds[g+1]
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !p.writeGroup(ctx, scratch.msgs[lo:hi], gerrs[lo:hi]) {
				mu.Lock()
				complete = false
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for k, i := range scratch.order {
		errs[i] = gerrs[k]
	}
	return complete
}

func (p *publisher) writeGroup(ctx context.Context, msgs []kafka.Message, errs []error) bool {
	err := p.writerFor(len(msgs)).WriteMessages(ctx, msgs...)
	if err == nil {
		return true
	}
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) && len(werrs) == len(msgs) {
		copy(errs, werrs)
		return true
	}
	for i := range errs {
		errs[i] = err
	}
	return ctx.Err() == nil
}

// writeScratch is reused between write calls.
type writeScratch struct {
	index  map[string]int
	groups [][]int
	msgs   []kafka.Message
	order  []int
}

func (s *writeScratch) reset() {
	if s.index == nil {
		s.index = map[string]int{}
	}
	clear(s.index)
	s.groups = s.groups[:0]
}

// transient reports whether err says that the brokers could not be reached or were not ready
// (the event itself is fine), as opposed to a broker refusing this event or its topic.
// refused reports whether err is the cluster refusing the relay itself rather than one event:
// its credentials (SASL), its permissions (ACLs), its TLS settings (an unknown CA, a name the
// certificate does not cover, TLS against a plaintext listener, a client certificate refused), or
// a topic that does not exist (auto-creation off, or a topic map naming the wrong one). Every
// event of the relay, or of that topic, fails alike until someone fixes it: no event is charged
// an attempt, and when nothing gets through the relay backs off as a whole and says why.
func refused(err error) bool {
	if err == nil {
		return false
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		switch ke {
		case kafka.SASLAuthenticationFailed, kafka.UnsupportedSASLMechanism, kafka.IllegalSASLState,
			kafka.TopicAuthorizationFailed, kafka.ClusterAuthorizationFailed, kafka.TransactionalIDAuthorizationFailed,
			kafka.UnknownTopicOrPartition, kafka.InvalidTopic:
			return true
		}
		return false
	}
	var (
		unknownCA  x509.UnknownAuthorityError
		wrongHost  x509.HostnameError
		badCert    x509.CertificateInvalidError
		unverified *tls.CertificateVerificationError
		notTLS     tls.RecordHeaderError
		alert      tls.AlertError
	)
	// An alert the broker sent (its type is unexported): "remote error: tls: bad certificate".
	return errors.As(err, &unknownCA) || errors.As(err, &wrongHost) || errors.As(err, &badCert) ||
		errors.As(err, &unverified) || errors.As(err, &notTLS) || errors.As(err, &alert) ||
		strings.Contains(err.Error(), "remote error: tls: ")
}

func transient(err error) bool {
	if err == nil {
		return false
	}
	if refused(err) {
		return false
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		if ke == kafka.InvalidMessage {
			return false // a corrupt message: the event's
		}
		return ke.Temporary()
	}
	var tooLarge kafka.MessageTooLargeError
	if errors.As(err, &tooLarge) {
		return false
	}
	if errors.Is(err, protocol.ErrNoLeader) {
		// The client's metadata names no leader for the partition: a broker coming back or a
		// leader election, the cluster's state, not the event's.
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.ErrClosedPipe) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}
