package kafkatest_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
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
	// Every partition has a leader again (StartAgain waits for it), but a client's metadata may
	// still say otherwise for a moment: what must hold is that the broker takes writes again and
	// kept the data, so the write is retried until a deadline.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := w.WriteMessages(ctx, kafka.Message{Key: []byte("k"), Value: []byte("after")})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write accepted within 30 s of the restart: %v", err)
		}
		t.Logf("write after the restart: %v; again", err)
		time.Sleep(100 * time.Millisecond)
	}
	recs := c.NewConsumer(t, topic).ReadN(t, 2, 60*time.Second)
	if string(recs[0].Value) != "before" || string(recs[1].Value) != "after" {
		t.Fatalf("got %q, %q", recs[0].Value, recs[1].Value)
	}
}

// A broker started by a test binary stops when that binary is killed before its cleanups run
// (hack/kafka.sh's watchdog), instead of running on after it.
func TestBrokerDiesWithKilledTestBinary(t *testing.T) {
	if os.Getenv("KAFKATEST_CHILD") == "1" {
		c, err := kafkatest.StartApache()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("broker %s\n", c.Brokers[0])
		time.Sleep(2 * time.Minute) // killed by the parent long before
		return
	}
	if forced := os.Getenv(kafkatest.EnvKind); forced != "" && forced != string(kafkatest.Apache) {
		t.Skipf("%s=%s", kafkatest.EnvKind, forced)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestBrokerDiesWithKilledTestBinary$")
	cmd.Env = append(os.Environ(), "KAFKATEST_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var addr string
	if _, err := fmt.Fscanf(bufio.NewReader(out), "broker %s\n", &addr); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child did not report its broker: %v", err)
	}
	if c, err := net.Dial("tcp", addr); err != nil {
		t.Fatalf("child's broker is not listening: %v", err)
	} else {
		c.Close()
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	start := time.Now()
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Logf("broker on %s gone %s after its test binary was killed", addr, time.Since(start).Round(100*time.Millisecond))
			return
		}
		c.Close()
		if time.Since(start) > time.Minute {
			t.Fatalf("broker on %s still listening a minute after its test binary was killed", addr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
