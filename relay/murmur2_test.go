package relay

import (
	"bufio"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestMurmur2MatchesJavaClient checks that the relay's partitioner, kafka-go's Murmur2Balancer,
// picks the same partition as the Apache Kafka Java client (Utils.toPositive(Utils.murmur2(key))
// % partitions) for every key and partition count in testdata/murmur2_java.tsv, which
// testdata/Murmur2Table.java generated with kafka-clients 4.4.0.
func TestMurmur2MatchesJavaClient(t *testing.T) {
	f, err := os.Open("testdata/murmur2_java.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg := DefaultConfig()
	cfg.Kafka.Brokers = []string{"127.0.0.1:9092"}
	cfg.setDefaults()
	pub, err := newKafkaPublisher(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.close()
	balancer := pub.balancer // the partitioner the relay publishes with
	counts := map[int]int{}
	rows := 0
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if strings.HasPrefix(text, "#") || text == "" {
			continue
		}
		cols := strings.Split(text, "\t")
		if len(cols) != 5 {
			t.Fatalf("line %d: %d columns", line, len(cols))
		}
		key := []byte{}
		if cols[0] != "-" {
			if key, err = hex.DecodeString(cols[0]); err != nil {
				t.Fatalf("line %d: %v", line, err)
			}
		}
		n, err1 := strconv.Atoi(cols[2])
		want, err2 := strconv.Atoi(cols[3])
		if err1 != nil || err2 != nil {
			t.Fatalf("line %d: bad numbers", line)
		}
		partitions := make([]int, n)
		for i := range partitions {
			partitions[i] = i
		}
		if got := balancer.Balance(kafka.Message{Key: key}, partitions...); got != want {
			t.Errorf("key %q with %d partitions: kafka-go picks %d, the Java client %d", key, n, got, want)
		}
		counts[n]++
		rows++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 3, 6, 7, 12, 32, 100} {
		if counts[n] < 100 {
			t.Errorf("only %d rows for %d partitions", counts[n], n)
		}
	}
	t.Logf("%d (key, partition count) pairs agree with the Java client", rows)
}
