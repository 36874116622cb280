package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-operator/outbox-operator/test/kafkatest"
)

// keyedMessages returns n messages to topic, the keys agg-0 .. agg-<aggs-1> in turn, each
// carrying its aggregate's sequence number in a header.
func keyedMessages(topic string, aggs, n int, seq map[string]int) []kafka.Message {
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		agg := fmt.Sprintf("agg-%d", i%aggs)
		seq[agg]++
		msgs[i] = kafka.Message{Topic: topic, Key: []byte(agg), Value: []byte(agg + "/" + strconv.Itoa(seq[agg])),
			Headers: []kafka.Header{{Key: "seq", Value: []byte(strconv.Itoa(seq[agg]))}}}
	}
	return msgs
}

// The publisher puts every message on the partition kafka-go's Murmur2Balancer (the Java
// client's partitioner, TestMurmur2MatchesJavaClient) picks for its key among the topic's
// partitions, an aggregate's messages in order, with their key, value and headers, and a
// CreateTime of the call; an independent franz-go consumer reads them back.
func TestPublisherPartitionsKeys(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	topic := kafkatest.UniqueTopic("relay.publisher")
	k.CreateTopic(t, topic, 6)
	cfg := testConfig("postgres://localhost/db", k.Brokers, topic)
	p, err := newKafkaPublisher(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.close() })

	seq := map[string]int{}
	sent := 0
	before := time.Now().Add(-time.Millisecond) // the broker keeps milliseconds
	// Calls of one message up to calls that put several messages of several aggregates on every
	// partition.
	for _, n := range []int{1, 7, 60, 300} {
		msgs := keyedMessages(topic, 37, n, seq)
		errs := make([]error, n)
		if !p.write(context.Background(), msgs, errs) {
			t.Fatal("write returned false")
		}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("message %d of %d: %v", i, n, err)
			}
		}
		sent += n
	}
	after := time.Now().Add(time.Millisecond)

	recs := k.NewConsumer(t, topic).ReadN(t, sent, 30*time.Second)
	all := []int{0, 1, 2, 3, 4, 5}
	got := map[string]int{}
	partitions := map[int32]bool{}
	for _, r := range recs {
		want := kafka.Murmur2Balancer{}.Balance(kafka.Message{Key: []byte(r.Key)}, all...)
		if int(r.Partition) != want {
			t.Errorf("key %s on partition %d, Murmur2Balancer picks %d", r.Key, r.Partition, want)
		}
		partitions[r.Partition] = true
		got[r.Key]++
		if s := strconv.Itoa(got[r.Key]); r.Headers["seq"] != s || string(r.Value) != r.Key+"/"+s {
			t.Errorf("key %s: record %d has header seq %q and value %q", r.Key, got[r.Key], r.Headers["seq"], r.Value)
		}
		if r.Timestamp.Before(before) || r.Timestamp.After(after) {
			t.Errorf("key %s: record time %s, not that of the call (between %s and %s)", r.Key, r.Timestamp, before, after)
		}
	}
	if len(recs) != sent || len(partitions) != 6 {
		t.Errorf("%d records on %d partitions, want %d on 6", len(recs), len(partitions), sent)
	}
}

// A call's messages to a topic that does not exist (auto-creation off) fail with the error the
// relay takes for a refusal (no attempt charged); those of the other topic in the same call are
// published. Once the topic exists, the next call publishes to it: the publisher does not keep
// a topic's absence.
func TestPublisherMissingTopic(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker of its own")
	}
	k := kafkatest.StartSecure(t, kafkatest.SecureOptions{NoAutoCreate: true})
	there, missing := kafkatest.UniqueTopic("relay.there"), kafkatest.UniqueTopic("relay.missing")
	k.CreateTopic(t, there, 3)
	cfg := testConfig("postgres://localhost/db", k.Brokers, there) // the plaintext listener
	p, err := newKafkaPublisher(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.close() })

	seq := map[string]int{}
	// Alternating topics: agg-0, 2, 4 to the topic that exists, agg-1, 3, 5 to the missing one.
	call := func() ([]kafka.Message, []error) {
		msgs := keyedMessages(there, 6, 24, seq)
		for i := range msgs {
			if i%2 == 1 {
				msgs[i].Topic = missing
			}
		}
		errs := make([]error, len(msgs))
		if !p.write(context.Background(), msgs, errs) {
			t.Fatal("write returned false")
		}
		return msgs, errs
	}
	msgs, errs := call()
	for i, err := range errs {
		switch {
		case msgs[i].Topic == there && err != nil:
			t.Errorf("message %d to %s: %v", i, there, err)
		case msgs[i].Topic == missing && (!errors.Is(err, kafka.UnknownTopicOrPartition) || !refused(err) || transient(err)):
			t.Errorf("message %d to the missing topic: %v, want Unknown Topic Or Partition, a refusal", i, err)
		}
	}
	recs := k.NewConsumer(t, there).ReadN(t, 12, 30*time.Second)
	for _, r := range recs {
		if r.Topic != there {
			t.Errorf("a record on %s", r.Topic)
		}
	}

	k.CreateTopic(t, missing, 3)
	msgs, errs = call()
	for i, err := range errs {
		if err != nil {
			t.Errorf("message %d to %s after the topic was created: %v", i, msgs[i].Topic, err)
		}
	}
	k.NewConsumer(t, missing).ReadN(t, 12, 30*time.Second)
}

// The record batches of the partitions one broker leads travel in one produce request, and the
// broker answers each partition on its own: in a call over two topics of one broker, where one
// topic takes records of at most 1,200 bytes (max.message.bytes), that topic's large messages
// fail with Message Size Too Large, not retried, and every other message of the same request,
// including the small ones of the same topic on other partitions, is published. An independent
// consumer counts the record batches (one per partition per request) and the records.
func TestPublisherOneRequestPerBroker(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	wide, narrow := kafkatest.UniqueTopic("relay.wide"), kafkatest.UniqueTopic("relay.narrow")
	k.CreateTopic(t, wide, 3)
	limit := "1200"
	k.CreateTopicWithConfig(t, narrow, 3, map[string]*string{"max.message.bytes": &limit})
	cfg := testConfig("postgres://localhost/db", k.Brokers, wide)
	p, err := newKafkaPublisher(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.close() })

	seq := map[string]int{}
	msgs := keyedMessages(wide, 6, 30, seq)
	big := map[string]bool{} // the aggregate whose messages to narrow are too large
	for i := range msgs {
		if i%3 != 0 {
			continue
		}
		msgs[i].Topic = narrow
		if agg := string(msgs[i].Key); agg == "agg-0" || big[agg] {
			big[agg] = true
			msgs[i].Value = make([]byte, 2000)
		}
	}
	errs := make([]error, len(msgs))
	if !p.write(context.Background(), msgs, errs) {
		t.Fatal("write returned false")
	}
	var ok, tooLarge int
	for i, err := range errs {
		large := msgs[i].Topic == narrow && big[string(msgs[i].Key)]
		switch {
		case large && (!errors.Is(err, kafka.MessageSizeTooLarge) || transient(err)):
			t.Errorf("message %d (2,000 bytes to %s): %v, want Message Size Too Large", i, narrow, err)
		case large:
			tooLarge++
		case err != nil:
			t.Errorf("message %d to %s: %v", i, msgs[i].Topic, err)
		default:
			ok++
		}
	}
	if tooLarge == 0 {
		t.Fatal("no message was too large: the test tests nothing")
	}
	published := 0
	for _, topic := range []string{wide, narrow} {
		records, batches := k.CountBatches(t, topic)
		t.Logf("%s: %d records in %d record batches", topic, records, batches)
		published += records
	}
	if published != ok {
		t.Errorf("%d records on the topics, want the %d messages published", published, ok)
	}
}
