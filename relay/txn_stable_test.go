package relay

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/test/kafkatest"
)

// A shard's committed cursor record written while another shard's transaction was open on the
// same partition stands past the partition's last stable offset until that transaction ends: a
// read to the last stable offset, as the cursor read did, returns the record before it (and the
// shard would publish that batch again). The read waits instead for the transactions open when
// it came to end, and returns the last record; a transaction that does not end in time keeps the
// relay from starting, saying so (errCursor), rather than letting it read short. The broker's
// offsets (kadm, the observer) show the partition held while the other transaction is open.
func TestReadCursorsWaitsForOpenTransactions(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	cursors := kafkatest.UniqueTopic("relay.txn.stable")
	compact := "compact"
	k.CreateTopicWithConfig(t, cursors, 1, map[string]*string{"cleanup.policy": &compact})
	cfg := KafkaConfig{Brokers: k.Brokers}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	own := fencedProducer(t, ctx, cfg, "test-own-"+cursors)
	publish := func(v string) {
		t.Helper()
		if _, committed, err := own.publish(ctx, nil, cursorRecord(cursors, "shard-0", v)); err != nil || !committed {
			t.Fatalf("cursor %s: committed %v, %v", v, committed, err)
		}
	}
	publish("v1")
	other, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.TransactionalID("test-other-"+cursors), kgo.TransactionTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := other.ProduceSync(ctx, cursorRecord(cursors, "shard-1", "open")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	publish("v2")

	adm, err := kadm.NewOptClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	stable, err := adm.ListCommittedOffsets(ctx, cursors)
	if err != nil {
		t.Fatal(err)
	}
	end, err := adm.ListEndOffsets(ctx, cursors)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := stable.Lookup(cursors, 0)
	e, _ := end.Lookup(cursors, 0)
	if s.Offset >= e.Offset-1 {
		t.Fatalf("last stable offset %d, end %d: the open transaction does not hold back v2's record", s.Offset, e.Offset)
	}
	t.Logf("partition 0: last stable offset %d, end %d, with the other shard's transaction open", s.Offset, e.Offset)

	own0 := func(key string) bool { return key == "shard-0" }
	_, err = readCursorsWithin(ctx, cfg, cursors, own0, 2*time.Second, nil)
	var ec *errCursor
	if !errors.As(err, &ec) || !strings.Contains(ec.msg, "has not ended in 2s") || !strings.Contains(ec.msg, "partition 0 at ") {
		t.Fatalf("a read while the transaction stays open: %v, want an errCursor naming the held partition", err)
	}
	t.Logf("read while it stays open: %v", err)

	var once sync.Once
	held := false
	got, err := readCursorsWithin(ctx, cfg, cursors, own0, time.Minute, func(int32, int64, int64) {
		once.Do(func() {
			held = true
			if err := other.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Errorf("the other shard's commit: %v", err)
			}
		})
	})
	if err != nil || string(got["shard-0"]) != "v2" {
		t.Fatalf("read while the other transaction commits: %q, %v; want v2", got["shard-0"], err)
	}
	if !held {
		t.Error("the read never found the partition held")
	}
}
