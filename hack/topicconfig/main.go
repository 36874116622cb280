// Command topicconfig creates a Kafka topic if it is missing and sets one of its configs (the
// demo uses it to make the broker refuse, then accept, an event): no JVM tool needed.
//
//	go run ./hack/topicconfig -brokers host:port -topic T -set max.message.bytes=1024
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:39092", "bootstrap brokers, comma separated")
	topic := flag.String("topic", "", "the topic")
	set := flag.String("set", "", "key=value of the topic config to set")
	flag.Parse()
	key, value, ok := strings.Cut(*set, "=")
	if *topic == "" || !ok || key == "" {
		fmt.Fprintln(os.Stderr, "usage: topicconfig -brokers host:port -topic T -set key=value")
		os.Exit(2)
	}
	if err := run(strings.Split(*brokers, ","), *topic, key, value); err != nil {
		fmt.Fprintln(os.Stderr, "topicconfig:", err)
		os.Exit(1)
	}
}

func run(brokers []string, topic, key, value string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{key: &value}, topic); err == nil {
		fmt.Printf("created topic %s with %s=%s\n", topic, key, value)
		return nil
	}
	res, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: key, Value: &value}}, topic)
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.Err != nil {
			return fmt.Errorf("%s: %w", r.Name, r.Err)
		}
	}
	fmt.Printf("topic %s: %s=%s\n", topic, key, value)
	return nil
}
