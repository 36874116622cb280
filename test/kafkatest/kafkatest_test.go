package kafkatest_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-operator/outbox-operator/test/kafkatest"
)

func TestMain(m *testing.M) { os.Exit(kafkatest.Run(m)) }

// A message produced with kafka-go arrives, as franz-go reads it, with its key, headers and the
// partition the Java client's murmur2 partitioner would choose.
func TestProduceWithKafkaGoReadWithFranzGo(t *testing.T) {
	for _, kind := range []kafkatest.Kind{kafkatest.Apache, kafkatest.Kfake} {
		t.Run(string(kind), func(t *testing.T) {
			if forced := os.Getenv(kafkatest.EnvKind); forced != "" && forced != string(kind) {
				t.Skipf("%s=%s", kafkatest.EnvKind, forced)
			}
			c := kafkatest.Start(t, kind)
			if kind == kafkatest.Apache && !strings.HasPrefix(c.Version, "Apache Kafka 4.4.0") {
				t.Fatalf("broker version %q, want Apache Kafka 4.4.0", c.Version)
			}
			topic := kafkatest.UniqueTopic("smoke")
			c.CreateTopic(t, topic, 6)

			w := &kafka.Writer{
				Addr:         kafka.TCP(c.Brokers...),
				Topic:        topic,
				Balancer:     &kafka.Murmur2Balancer{},
				RequiredAcks: kafka.RequireAll,
				BatchTimeout: time.Millisecond,
			}
			defer w.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := w.WriteMessages(ctx, kafka.Message{
				Key:     []byte("customer-9"),
				Value:   []byte(`{"total":10}`),
				Headers: []kafka.Header{{Key: "event_id", Value: []byte("e1")}, {Key: "traceparent", Value: []byte("00-abc-def-01")}},
			})
			if err != nil {
				t.Fatalf("produce: %v", err)
			}
			recs := c.NewConsumer(t, topic).ReadN(t, 1, 30*time.Second)
			r := recs[0]
			// Kafka Java client: Utils.toPositive(Utils.murmur2("customer-9".getBytes(UTF_8))) % 6 == 5
			const wantPartition = 5
			if r.Key != "customer-9" || string(r.Value) != `{"total":10}` || r.Headers["event_id"] != "e1" ||
				r.Headers["traceparent"] != "00-abc-def-01" || r.Partition != wantPartition {
				t.Fatalf("got key=%q value=%q headers=%v partition=%d", r.Key, r.Value, r.Headers, r.Partition)
			}
			t.Logf("%s: read back key=%s partition=%d offset=%d headers=%v", c, r.Key, r.Partition, r.Offset, r.Headers)
		})
	}
}

func TestApacheBrokerStopAndStartKeepsData(t *testing.T) {
	if forced := os.Getenv(kafkatest.EnvKind); forced == string(kafkatest.Kfake) {
		t.Skipf("%s=%s", kafkatest.EnvKind, forced)
	}
	c := kafkatest.NewApache(t)
	topic := kafkatest.UniqueTopic("restart")
	c.CreateTopic(t, topic, 1)
	w := &kafka.Writer{Addr: kafka.TCP(c.Brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx := context.Background()
	if err := w.WriteMessages(ctx, kafka.Message{Key: []byte("k"), Value: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAgain(); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteMessages(ctx, kafka.Message{Key: []byte("k"), Value: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	recs := c.NewConsumer(t, topic).ReadN(t, 2, 60*time.Second)
	if string(recs[0].Value) != "before" || string(recs[1].Value) != "after" {
		t.Fatalf("got %q, %q", recs[0].Value, recs[1].Value)
	}
}
