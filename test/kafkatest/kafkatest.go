// Package kafkatest gives tests a Kafka broker and an independent client to check what reached it.
//
// Two brokers are available: the real Apache Kafka broker (single node, KRaft, started by
// hack/kafka.sh from jars fetched from Maven Central) and franz-go's in-process kfake cluster.
// A test asks for one through Start; the environment variable OUTBOX_TEST_KAFKA=apache|kfake
// forces the choice for every test, and the test log states which broker ran.
// OUTBOX_TEST_KAFKA_BROKERS=host:port points the Apache choice at a broker that is already
// running (make test starts one for the whole suite).
//
// Records are read back with franz-go, never with the code under test.
package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// Kind names a broker implementation.
type Kind string

const (
	Apache Kind = "apache" // the real Apache Kafka broker
	Kfake  Kind = "kfake"  // franz-go's in-process fake
)

// EnvKind forces the broker kind for every test.
const EnvKind = "OUTBOX_TEST_KAFKA"

// EnvBrokers names an already running Apache Kafka broker to use instead of starting one.
const EnvBrokers = "OUTBOX_TEST_KAFKA_BROKERS"

// Cluster is a running broker.
type Cluster struct {
	Kind    Kind
	Version string
	Brokers []string

	dir   string // state of a broker started by hack/kafka.sh
	port  int    // its listener port
	cport int    // its controller port
	fake  *kfake.Cluster
	owned bool
	env   []string // for hack/kafka.sh start (the secure broker's extra properties)
}

var (
	sharedMu    sync.Mutex
	sharedApach *Cluster
	sharedErr   error
)

// Run runs the package's tests and stops the package's shared broker afterwards.
func Run(m *testing.M) int {
	code := m.Run()
	StopShared()
	return code
}

// StopShared stops the package's shared broker, if one was started. Packages whose TestMain
// runs through another helper (pgtest.Run) call it after the tests.
func StopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedApach != nil {
		sharedApach.Close()
		sharedApach = nil
	}
}

// Start returns a broker of the preferred kind, unless OUTBOX_TEST_KAFKA forces another.
// Apache brokers are shared by the tests of a package; kfake clusters are one per call.
func Start(t testing.TB, prefer Kind) *Cluster {
	t.Helper()
	kind := prefer
	if v := os.Getenv(EnvKind); v != "" {
		kind = Kind(v)
	}
	var c *Cluster
	switch kind {
	case Apache:
		c = SharedApache(t)
	case Kfake:
		c = NewKfake(t)
	default:
		t.Fatalf("kafkatest: %s=%q: want %q or %q", EnvKind, kind, Apache, Kfake)
	}
	t.Logf("kafka broker: %s", c)
	return c
}

func (c *Cluster) String() string {
	return fmt.Sprintf("%s %s at %s", c.Kind, c.Version, strings.Join(c.Brokers, ","))
}

// NewKfake starts an in-process kfake cluster for this test.
func NewKfake(t testing.TB) *Cluster {
	t.Helper()
	fc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(6))
	if err != nil {
		t.Fatalf("kafkatest: start kfake: %v", err)
	}
	t.Cleanup(fc.Close)
	return &Cluster{Kind: Kfake, Version: "kfake (franz-go)", Brokers: fc.ListenAddrs(), fake: fc}
}

// SharedApache returns the package's Apache Kafka broker, starting it on first use.
func SharedApache(t testing.TB) *Cluster {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedApach == nil && sharedErr == nil {
		if b := os.Getenv(EnvBrokers); b != "" {
			sharedApach = &Cluster{Kind: Apache, Version: apacheVersion(), Brokers: strings.Split(b, ",")}
		} else {
			sharedApach, sharedErr = StartApache()
		}
	}
	if sharedErr != nil {
		t.Fatalf("kafkatest: cannot start Apache Kafka: %v", sharedErr)
	}
	return sharedApach
}

// NewApache starts a dedicated Apache Kafka broker for this test (one that the test may stop
// and start again), and removes it when the test ends.
func NewApache(t testing.TB) *Cluster {
	t.Helper()
	c, err := StartApache()
	if err != nil {
		t.Fatalf("kafkatest: cannot start Apache Kafka: %v", err)
	}
	t.Cleanup(c.Close)
	t.Logf("kafka broker: %s", c)
	return c
}

// StartApache starts a new Apache Kafka broker on free ports with hack/kafka.sh.
func StartApache() (*Cluster, error) {
	dir, err := os.MkdirTemp("", "outbox-kafkatest-")
	if err != nil {
		return nil, err
	}
	port, err := pgtest.FreePort()
	if err != nil {
		return nil, err
	}
	cport, err := pgtest.FreePort()
	if err != nil || cport == port {
		cport = port + 1
	}
	c := &Cluster{Kind: Apache, dir: dir, port: port, cport: cport, owned: true}
	if err := c.StartAgain(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c.Version = apacheVersion()
	c.Brokers = []string{"127.0.0.1:" + strconv.Itoa(port)}
	return c, nil
}

// Stop stops a broker started by this package (clean shutdown), keeping its data.
func (c *Cluster) Stop() error {
	if !c.owned {
		return fmt.Errorf("kafkatest: broker %s was not started by this test", c)
	}
	_, err := kafkaScript(c.port, c.cport, nil, "stop", c.dir)
	return err
}

// Kill kills a broker started by this package with SIGKILL (no shutdown: its open transactions
// and unflushed state as a crash leaves them), keeping its data, and returns once it is gone.
func (c *Cluster) Kill() error {
	if !c.owned {
		return fmt.Errorf("kafkatest: broker %s was not started by this test", c)
	}
	b, err := os.ReadFile(filepath.Join(c.dir, "broker.pid"))
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for syscall.Kill(pid, 0) == nil {
		if ctx.Err() != nil {
			return fmt.Errorf("kafkatest: broker %d still there after SIGKILL", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// StartAgain starts a stopped broker on the same port with the same data.
func (c *Cluster) StartAgain() error {
	if !c.owned {
		return fmt.Errorf("kafkatest: broker %s was not started by this test", c)
	}
	// The broker dies with this process (hack/kafka.sh's watchdog), even when it is killed
	// before its cleanups run.
	if _, err := kafkaScript(c.port, c.cport, append([]string{"KAFKA_OWNER_PID=" + strconv.Itoa(os.Getpid())}, c.env...), "start", c.dir); err != nil {
		return err
	}
	if c.Brokers == nil {
		return nil // a new broker has no topics yet
	}
	// The broker accepts connections before it has elected leaders for the partitions it
	// had: until then a producer gets "topic partition has no leader". A restarted broker is
	// ready when every partition it had has a leader again.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.waitForAllLeaders(ctx)
}

// waitForAllLeaders polls metadata until every partition of every topic has a leader.
func (c *Cluster) waitForAllLeaders(ctx context.Context) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var last error
	for {
		md, err := adm.Metadata(ctx)
		if err == nil {
			for name, td := range md.Topics {
				if err = topicReady(td, int32(len(td.Partitions))); err != nil {
					err = fmt.Errorf("topic %s: %w", name, err)
					break
				}
			}
		}
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkatest: partitions without a leader after restart: %w", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close stops the broker and removes its data.
func (c *Cluster) Close() {
	if c.fake != nil {
		c.fake.Close()
		return
	}
	if c.owned {
		_, _ = kafkaScript(c.port, c.cport, nil, "clean", c.dir)
	}
}

// kafkaScript runs hack/kafka.sh with args, its ports and env (NAME=value) in its environment.
func kafkaScript(port, cport int, env []string, args ...string) (string, error) {
	script, err := repoFile("hack/kafka.sh")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
	cmd.Env = append(os.Environ(), "KAFKA_PORT="+strconv.Itoa(port), "KAFKA_CONTROLLER_PORT="+strconv.Itoa(cport))
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/kafka.sh %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

func apacheVersion() string {
	out, err := kafkaScript(0, 0, nil, "version")
	if err != nil || out == "" {
		return "Apache Kafka (unknown version)"
	}
	return "Apache Kafka " + out
}

// repoFile finds a file relative to the repository root (the directory holding go.mod).
func repoFile(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, rel), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("kafkatest: no go.mod above the working directory, cannot find %s", rel)
		}
		dir = parent
	}
}

// UniqueTopic returns a topic name no other test uses.
func UniqueTopic(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "." + hex.EncodeToString(b)
}

// CreateTopic creates a topic with the given number of partitions through franz-go's admin client
// and returns once every partition has a leader.
func (c *Cluster) CreateTopic(t testing.TB, topic string, partitions int32) {
	t.Helper()
	c.CreateTopicWithConfig(t, topic, partitions, nil)
}

// CreateTopicWithConfig is CreateTopic with topic-level configuration (for example max.message.bytes).
func (c *Cluster) CreateTopicWithConfig(t testing.TB, topic string, partitions int32, configs map[string]*string) {
	t.Helper()
	ctx, adm, done := c.admin(t)
	defer done()
	resp, err := adm.CreateTopic(ctx, partitions, 1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("kafkatest: create topic %s: %v", topic, err)
	}
	// CreateTopics returns once the controller committed the topic; the broker that serves
	// producers learns of it a moment later. Until then a producer that asks for metadata gets
	// UNKNOWN_TOPIC_OR_PARTITION, so wait until every partition has a leader.
	if err := WaitForLeaders(ctx, adm, topic, partitions); err != nil {
		t.Fatalf("kafkatest: topic %s: %v", topic, err)
	}
}

// WaitForLeaders polls metadata until every partition of topic has a leader, or ctx ends.
func WaitForLeaders(ctx context.Context, adm *kadm.Client, topic string, partitions int32) error {
	var last error
	for {
		md, err := adm.Metadata(ctx, topic)
		if err == nil {
			err = topicReady(md.Topics[topic], partitions)
		}
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("partitions without a leader after creation: %w", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func topicReady(td kadm.TopicDetail, partitions int32) error {
	if td.Err != nil {
		return td.Err
	}
	if int32(len(td.Partitions)) != partitions {
		return fmt.Errorf("metadata lists %d of %d partitions", len(td.Partitions), partitions)
	}
	for _, p := range td.Partitions {
		if p.Err != nil {
			return fmt.Errorf("partition %d: %w", p.Partition, p.Err)
		}
		if p.Leader < 0 {
			return fmt.Errorf("partition %d has no leader", p.Partition)
		}
	}
	return nil
}

// Record is a message as an independent client (franz-go) read it from the broker.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	Value     []byte
	Headers   map[string]string
	// HeaderKeys are the headers' keys in record order, repeats included.
	HeaderKeys []string
	Timestamp  time.Time
}

// Consumer reads topics from the beginning with franz-go.
type Consumer struct {
	cl *kgo.Client
}

// NewConsumer starts reading the topics from their beginning (read_uncommitted: a transaction's
// records as soon as they are written, aborted ones too).
func (c *Cluster) NewConsumer(t testing.TB, topics ...string) *Consumer {
	t.Helper()
	return c.newConsumer(t, kgo.ReadUncommitted(), topics)
}

// NewCommittedConsumer starts reading the topics from their beginning, read_committed: only
// records outside transactions and those of committed transactions, once committed.
func (c *Cluster) NewCommittedConsumer(t testing.TB, topics ...string) *Consumer {
	t.Helper()
	return c.newConsumer(t, kgo.ReadCommitted(), topics)
}

func (c *Cluster) newConsumer(t testing.TB, level kgo.IsolationLevel, topics []string) *Consumer {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.Brokers...),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(level),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.MetadataMinAge(250*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &Consumer{cl: cl}
}

// Poll returns the records that arrive within wait (possibly none).
func (c *Consumer) Poll(ctx context.Context, wait time.Duration) ([]Record, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	fetches := c.cl.PollFetches(ctx)
	var errs []error
	fetches.EachError(func(topic string, p int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("%s[%d]: %w", topic, p, err))
		}
	})
	var out []Record
	fetches.EachRecord(func(r *kgo.Record) {
		h := make(map[string]string, len(r.Headers))
		keys := make([]string, 0, len(r.Headers))
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
			keys = append(keys, kv.Key)
		}
		out = append(out, Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
			Key: string(r.Key), Value: r.Value, Headers: h, HeaderKeys: keys, Timestamp: r.Timestamp})
	})
	if len(errs) > 0 && len(out) == 0 {
		return nil, errs[0]
	}
	return out, nil
}

// ReadN reads until n records arrived or the timeout passed, and fails the test in that case.
func (c *Consumer) ReadN(t testing.TB, n int, timeout time.Duration) []Record {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var all []Record
	for len(all) < n {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("kafkatest: read %d of %d records within %s", len(all), n, timeout)
		}
		recs, err := c.Poll(context.Background(), min(left, time.Second))
		if err != nil {
			t.Logf("kafkatest: poll: %v", err)
		}
		all = append(all, recs...)
	}
	return all
}

// EndOffsets returns the end offset (the offset the next record will get) of every partition of
// topic, as the broker reports it: what a consumer has to reach to have read everything written.
func (c *Cluster) EndOffsets(t testing.TB, topic string) map[int32]int64 {
	t.Helper()
	ctx, adm, done := c.admin(t)
	defer done()
	offs, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		t.Fatalf("kafkatest: end offsets of %s: %v", topic, err)
	}
	out := map[int32]int64{}
	offs.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// SetTopicConfig sets one topic-level configuration (for example max.message.bytes) and returns
// once the broker describes the topic with the new value (the test clusters have one broker).
// AlterConfigs returns once the
// controller committed the change; a broker applies it when it replays the record, a moment later,
// and a producer's request served meanwhile still meets the old value (TestActsByHand saw a retry
// refused as too large after the limit was raised).
func (c *Cluster) SetTopicConfig(t testing.TB, topic, name, value string) {
	t.Helper()
	ctx, adm, done := c.admin(t)
	defer done()
	resp, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: name, Value: &value}}, topic)
	if err == nil {
		_, err = resp.On(topic, nil)
	}
	if err != nil {
		t.Fatalf("kafkatest: set %s=%s on %s: %v", name, value, topic, err)
	}
	for {
		described, err := adm.DescribeTopicConfigs(ctx, topic)
		got := ""
		if err == nil {
			var rc kadm.ResourceConfig
			if rc, err = described.On(topic, nil); err == nil {
				for _, cfg := range rc.Configs {
					if cfg.Key == name && cfg.Value != nil {
						got = *cfg.Value
					}
				}
			}
		}
		if got == value {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("kafkatest: %s of %s still %q, want %q (%v)", name, topic, got, value, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// admin returns an admin client of the cluster and a context of 30 s for its requests, and the
// function that releases both.
func (c *Cluster) admin(t testing.TB) (context.Context, *kadm.Client, func()) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	return ctx, kadm.NewClient(cl), func() { cancel(); cl.Close() }
}

// CountBatches reads topic from its beginning to its end offsets now, as an independent client,
// and returns the records and the record batches it holds. A producer writes one record batch
// per partition per produce request, so batches counts the produce requests that carried the
// records (per partition).
func (c *Cluster) CountBatches(t testing.TB, topic string) (records, batches int) {
	t.Helper()
	records, codecs := c.readBatches(t, topic)
	for _, n := range codecs {
		batches += n
	}
	return records, batches
}

// BatchCodecs reads topic as CountBatches does and returns its record batches by compression
// codec, as the broker stores them (its default compression.type=producer keeps the producer's):
// "none", "gzip", "snappy", "lz4" or "zstd".
func (c *Cluster) BatchCodecs(t testing.TB, topic string) map[string]int {
	t.Helper()
	_, codecs := c.readBatches(t, topic)
	return codecs
}

func (c *Cluster) readBatches(t testing.TB, topic string) (records int, codecs map[string]int) {
	t.Helper()
	end := c.EndOffsets(t, topic)
	h := &batchHook{codecs: map[string]int{}}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.Brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.WithHooks(h),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	next := map[int32]int64{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		behind := false
		for p, o := range end {
			behind = behind || next[p] < o
		}
		if !behind {
			h.mu.Lock()
			defer h.mu.Unlock()
			return records, maps.Clone(h.codecs)
		}
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s to its end offsets %v: at %v after a minute", topic, end, next)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if r.Offset < end[r.Partition] {
				records++
			}
			next[r.Partition] = max(next[r.Partition], r.Offset+1)
		})
	}
}

// batchHook counts the record batches a client reads, by compression codec.
type batchHook struct {
	mu     sync.Mutex
	codecs map[string]int
}

var batchCodecNames = []string{"none", "gzip", "snappy", "lz4", "zstd"}

func (h *batchHook) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	name := fmt.Sprintf("codec %d", m.CompressionType)
	if int(m.CompressionType) < len(batchCodecNames) {
		name = batchCodecNames[m.CompressionType]
	}
	h.mu.Lock()
	h.codecs[name]++
	h.mu.Unlock()
}
