package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
)

// txnRecords returns n records to topic, keyed agg-0 .. agg-<aggs-1> in turn, valued tag/i.
func txnRecords(topic, tag string, aggs, n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte("agg-" + strconv.Itoa(i%aggs)), Value: []byte(tag + "/" + strconv.Itoa(i))}
	}
	return recs
}

func cursorRecord(topic, key, value string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value)}
}

// A batch and its cursor record commit together: an independent read_committed consumer reads
// every event of two batches, each on the partition kafka-go's Murmur2Balancer (the
// at-least-once publisher's) picks for its key, and the cursor read back from the compacted
// cursor topic is the second batch's. A batch with an event the broker refuses (larger than the
// topic's max.message.bytes) aborts whole: that event has its error, none of the batch's events
// is visible read_committed (a read_uncommitted consumer counts the aborted ones), and the cursor
// stays where the second batch left it.
func TestTxnProducerCommitsBatchWithCursor(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	events, cursors := kafkatest.UniqueTopic("relay.txn"), kafkatest.UniqueTopic("relay.txn.cursor")
	limit := "2000"
	k.CreateTopicWithConfig(t, events, 6, map[string]*string{"max.message.bytes": &limit})
	compact := "compact"
	k.CreateTopicWithConfig(t, cursors, 3, map[string]*string{"cleanup.policy": &compact})
	cfg := KafkaConfig{Brokers: k.Brokers}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	p := fencedProducer(t, ctx, cfg, "test-"+events)
	if _, found, err := readCursor(ctx, cfg, cursors, []byte("shard-0")); err != nil || found {
		t.Fatalf("cursor before any batch: found %v, %v", found, err)
	}
	for b, n := range []int{40, 25} {
		errs, committed, err := p.publish(ctx, txnRecords(events, "batch"+strconv.Itoa(b), 7, n), cursorRecord(cursors, "shard-0", "after batch "+strconv.Itoa(b)))
		if err != nil || !committed {
			t.Fatalf("batch %d: committed %v, %v", b, committed, err)
		}
		for i, e := range errs {
			if e != nil {
				t.Fatalf("batch %d, record %d: %v", b, i, e)
			}
		}
	}
	// Another shard's cursor on the same topic does not hide this one's.
	if _, committed, err := p.publish(ctx, nil, cursorRecord(cursors, "shard-1", "other")); err != nil || !committed {
		t.Fatalf("shard-1's cursor: committed %v, %v", committed, err)
	}

	bad := txnRecords(events, "poisoned", 7, 10)
	bad[4].Value = []byte(strings.Repeat("x", 5000)) // no codec: the batch is over the limit as it is
	errs, committed, err := p.publish(ctx, bad, cursorRecord(cursors, "shard-0", "after the poisoned batch"))
	if err != nil || committed {
		t.Fatalf("poisoned batch: committed %v, %v; want aborted without a producer error", committed, err)
	}
	if !errors.Is(errs[4], kerr.MessageTooLarge) {
		t.Errorf("the oversized record's error: %v, want Message Too Large", errs[4])
	}
	for i, e := range errs {
		if e != nil && i != 4 {
			t.Logf("record %d (%s), in the oversized record's record batch: %v", i, bad[i].Key, e)
		}
	}
	// After an abort the producer goes on: a last batch commits.
	if _, committed, err := p.publish(ctx, txnRecords(events, "batch2", 7, 5), cursorRecord(cursors, "shard-0", "after batch 2")); err != nil || !committed {
		t.Fatalf("batch after the abort: committed %v, %v", committed, err)
	}

	got := k.NewCommittedConsumer(t, events).ReadN(t, 70, time.Minute)
	var balancer kafka.Murmur2Balancer
	parts := []int{0, 1, 2, 3, 4, 5}
	perBatch := map[string]int{}
	for _, r := range got {
		if want := balancer.Balance(kafka.Message{Key: []byte(r.Key)}, parts...); int(r.Partition) != want {
			t.Errorf("%s (key %s) on partition %d, Murmur2Balancer picks %d", r.Value, r.Key, r.Partition, want)
		}
		batch, _, _ := strings.Cut(string(r.Value), "/")
		perBatch[batch]++
	}
	if perBatch["batch0"] != 40 || perBatch["batch1"] != 25 || perBatch["batch2"] != 5 || len(got) != 70 {
		t.Errorf("read committed %v (%d records), want batch0 40, batch1 25, batch2 5", perBatch, len(got))
	}
	// read_uncommitted: what the aborted batch left in the log (the records the broker took
	// before the abort), counted.
	ends := k.EndOffsets(t, events)
	var total int64
	for _, e := range ends {
		total += e
	}
	t.Logf("log: %d offsets (records and transaction markers) for 70 committed records", total)

	value, found, err := readCursor(ctx, cfg, cursors, []byte("shard-0"))
	if err != nil || !found || string(value) != "after batch 2" {
		t.Fatalf("cursor: %q (found %v, %v), want %q", value, found, err, "after batch 2")
	}
}

// A zombie cannot commit. Relay A publishes a batch, then begins another and produces it (the
// transaction open, its records in the log); relay B, given the shard, fences the transactional
// id: the broker aborts A's open transaction, and A's commit is refused with errFenced. B reads
// the committed cursor (A's first batch's, never the open one's) and publishes. An independent
// read_committed consumer of the single-partition topic reads A's first batch and then B's: A's
// second batch, written before B's records, is never visible; a read_uncommitted consumer sees
// it.
func TestTxnProducerFencesZombie(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	events, cursors := exactlyOnceTopics(t, k, "relay.txnz", 1)
	cfg := KafkaConfig{Brokers: k.Brokers}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := "test-" + events

	a := fencedProducer(t, ctx, cfg, id)
	if _, ok, err := a.publish(ctx, txnRecords(events, "a1", 3, 10), cursorRecord(cursors, "s", "a1")); err != nil || !ok {
		t.Fatalf("A's first batch: committed %v, %v", ok, err)
	}
	// B, given the shard, fences while A's second batch is produced and not committed (the
	// dangerous moment): A's commit is refused.
	b, err := newTxnProducer(cfg, contract.CompressionNone, id)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	hit := false
	a.beforeCommit = func() {
		hit = true
		if err := b.fence(ctx); err != nil {
			t.Errorf("B's fence: %v", err)
		}
	}
	if _, ok, err := a.publish(ctx, txnRecords(events, "a2", 3, 10), cursorRecord(cursors, "s", "a2")); ok || !errors.Is(err, errFenced) {
		t.Fatalf("A's second batch, B having fenced before its commit: committed %v, %v; want errFenced", ok, err)
	}
	if !hit {
		t.Fatal("the fence did not come between A's produce and its commit")
	}
	if _, ok, err := a.publish(ctx, txnRecords(events, "a3", 3, 1), cursorRecord(cursors, "s", "a3")); ok || !errors.Is(err, errFenced) {
		t.Fatalf("A's next batch: committed %v, %v; want errFenced", ok, err)
	}
	value, found, err := readCursor(ctx, cfg, cursors, []byte("s"))
	if err != nil || !found || string(value) != "a1" {
		t.Fatalf("B reads the cursor %q (found %v, %v), want A's committed %q", value, found, err, "a1")
	}
	if _, ok, err := b.publish(ctx, txnRecords(events, "b1", 3, 10), cursorRecord(cursors, "s", "b1")); err != nil || !ok {
		t.Fatalf("B's batch: committed %v, %v", ok, err)
	}

	got := k.NewCommittedConsumer(t, events).ReadN(t, 20, time.Minute)
	for i, r := range got {
		want := "a1"
		if i >= 10 {
			want = "b1"
		}
		if string(r.Value[:2]) != want {
			t.Errorf("read committed record %d: %s, want one of %s", i, r.Value, want)
		}
	}
	uncommitted := k.NewConsumer(t, events).ReadN(t, 30, time.Minute)
	zombie := 0
	for _, r := range uncommitted {
		if string(r.Value[:2]) == "a2" {
			zombie++
		}
	}
	t.Logf("read_uncommitted: %d of the zombie's aborted records in the log, none read committed", zombie)
	if zombie != 10 {
		t.Errorf("read_uncommitted saw %d of A's 10 aborted records: the open transaction was not where the test put it", zombie)
	}
}

// The transactional producer connects as the at-least-once publisher does, SCRAM over TLS and
// mutual TLS, on a broker that enforces ACLs: without Write on its transactional ids the broker
// refuses it (Transactional Id Authorization Failed, no secret in the error); with Write and
// Describe on them (a prefixed ACL), Write on its topics and Read on the cursor topic, it
// fences, commits batches with their cursor, and reads the cursor back. An independent
// read_committed consumer reads the events.
func TestTxnProducerSecurity(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker of its own")
	}
	k := kafkatest.StartSecure(t, kafkatest.SecureOptions{NoAutoCreate: true})
	k.SetSCRAM(t, "relay", "relay-secret")
	events, cursors := exactlyOnceTopics(t, k.Cluster, "relay.txnsec", 3)
	configs := map[string]KafkaConfig{
		"User:relay": {Brokers: []string{k.SASLSSL}, TLS: true, TLSCAFile: k.CAFile,
			SASLMechanism: "scram-sha-512", SASLUsername: "relay", SASLPassword: "relay-secret"},
		"User:CN=relay": {Brokers: []string{k.SSL}, TLS: true, TLSCAFile: k.CAFile, TLSCertFile: k.ClientCertFile, TLSKeyFile: k.ClientKeyFile},
	}
	for principal := range configs {
		k.AllowProduce(t, principal, events, cursors)
		k.AllowRead(t, principal, cursors)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	denied, err := newTxnProducer(configs["User:relay"], contract.CompressionNone, "outbox-relay/test/denied")
	if err != nil {
		t.Fatal(err)
	}
	err = denied.fence(ctx)
	denied.close()
	if !errors.Is(err, kerr.TransactionalIDAuthorizationFailed) || strings.Contains(err.Error(), "relay-secret") {
		t.Fatalf("fencing without an ACL on the transactional id: %v, want Transactional Id Authorization Failed", err)
	}
	t.Logf("refused as it should be: %v", err)

	n := 0
	for principal, cfg := range configs {
		k.AllowTransactions(t, principal, "outbox-relay/")
		p, err := newTxnProducer(cfg, contract.CompressionNone, "outbox-relay/test/"+principal)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.fence(ctx); err != nil {
			t.Fatalf("%s: %v", principal, err)
		}
		if _, ok, err := p.publish(ctx, txnRecords(events, principal, 3, 5), cursorRecord(cursors, principal, "5 published")); err != nil || !ok {
			t.Fatalf("%s: committed %v, %v", principal, ok, err)
		}
		n += 5
		p.close()
		// Read back as a relay's next tenure reads it: after fencing the id, which returns once
		// the broker has written the commit's markers (read at once, the cursor topic's last
		// stable offset could still stand before the record: found false in one CI run).
		again, err := newTxnProducer(cfg, contract.CompressionNone, "outbox-relay/test/"+principal)
		if err != nil {
			t.Fatal(err)
		}
		if err := again.fence(ctx); err != nil {
			t.Fatalf("%s fences its id again: %v", principal, err)
		}
		again.close()
		// Read as a relay's tenure reads it (readCursors: the end offsets too, waiting for the
		// transactions open on the topic to end), with the same ACLs.
		got, err := readCursors(ctx, cfg, cursors, func(key string) bool { return key == principal })
		if v := got[principal]; err != nil || string(v) != "5 published" {
			t.Fatalf("%s reads its cursor: %q, %v", principal, v, err)
		}
		// A relay of a new layout lists and fences the ids of the earlier layouts with the same
		// ACLs: the earlier layout's producer is refused from then on.
		old, err := newTxnProducer(cfg, contract.CompressionNone, txnShardID("sec", "public.outbox", 1, 0, 1))
		if err != nil {
			t.Fatal(err)
		}
		if err := old.fence(ctx); err != nil {
			t.Fatalf("%s: %v", principal, err)
		}
		fenced, err := fenceLayouts(ctx, cfg, txnTablePrefix("sec", "public.outbox"), 2)
		if err != nil || !slices.Equal(fenced, []string{old.id}) {
			t.Fatalf("%s fences the earlier layouts: %v, %v; want [%s]", principal, fenced, err, old.id)
		}
		if _, _, err := old.publish(ctx, txnRecords(events, "old layout", 1, 1), cursorRecord(cursors, "old", "x")); !errors.Is(err, errFenced) {
			t.Fatalf("%s: the earlier layout's producer published after the fence: %v", principal, err)
		}
		old.close()
	}
	k.NewCommittedConsumer(t, events).ReadN(t, n, time.Minute)
}

// The broker killed with SIGKILL between a batch's produce and its commit (its records in the
// log, the transaction open): the relay's commit fails and its producer publishes no more. With
// the broker back, the next holder of the shard fences the transactional id, which aborts the
// open transaction, reads the cursor of the last committed batch, and goes on. An independent
// read_committed consumer of the single-partition topic reads the first batch and then the
// next holder's: the killed transaction's records, written before them, are never visible; a
// read_uncommitted consumer counts them.
func TestTxnProducerBrokerKilledMidTransaction(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker of its own")
	}
	k := kafkatest.NewApache(t)
	events, cursors := exactlyOnceTopics(t, k, "relay.txnkill", 1)
	cfg := KafkaConfig{Brokers: k.Brokers}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := "test-" + events

	a := fencedProducer(t, ctx, cfg, id)
	if _, ok, err := a.publish(ctx, txnRecords(events, "a1", 3, 10), cursorRecord(cursors, "s", "a1")); err != nil || !ok {
		t.Fatalf("the first batch: committed %v, %v", ok, err)
	}
	killed := false
	a.beforeCommit = func() {
		if err := k.Kill(); err != nil {
			t.Errorf("killing the broker: %v", err)
		}
		killed = true
	}
	// The relay bounds a commit by its request timeout; here the broker stays down through it.
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	_, ok, err := a.publish(cctx, txnRecords(events, "a2", 3, 10), cursorRecord(cursors, "s", "a2"))
	ccancel()
	if !killed {
		t.Fatal("the broker was not killed between the produce and the commit")
	}
	if ok || err == nil {
		t.Fatalf("the commit with the broker killed: committed %v, %v", ok, err)
	}
	t.Logf("the commit with the broker killed: %v", err)
	if _, ok, err := a.publish(ctx, txnRecords(events, "a3", 3, 1), cursorRecord(cursors, "s", "a3")); ok || !errors.Is(err, errUnknownOutcome) {
		t.Fatalf("the producer after an unknown outcome: committed %v, %v; want it to publish no more", ok, err)
	}

	if !errors.Is(err, errUnknownOutcome) {
		t.Fatalf("the commit with the broker killed: %v, want its outcome unknown", err)
	}
	a.close() // the relay gives the shard up

	if err := k.StartAgain(); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	b := fencedProducer(t, ctx, cfg, id)
	t.Logf("the next holder fenced the id %s after the broker's restart", time.Since(started).Round(time.Millisecond))
	value, _, err := readCursor(ctx, cfg, cursors, []byte("s"))
	if err != nil || string(value) != "a1" {
		t.Fatalf("the cursor after the broker's restart: %q, %v; want the last committed, a1", value, err)
	}
	if _, ok, err := b.publish(ctx, txnRecords(events, "b1", 3, 10), cursorRecord(cursors, "s", "b1")); err != nil || !ok {
		t.Fatalf("the next holder's batch: committed %v, %v", ok, err)
	}
	for i, r := range k.NewCommittedConsumer(t, events).ReadN(t, 20, time.Minute) {
		if want := map[bool]string{true: "a1", false: "b1"}[i < 10]; string(r.Value[:2]) != want {
			t.Errorf("read committed record %d: %s, want one of %s", i, r.Value, want)
		}
	}
	aborted := 0
	for _, r := range k.NewConsumer(t, events).ReadN(t, 30, time.Minute) {
		if string(r.Value[:2]) == "a2" {
			aborted++
		}
	}
	t.Logf("read_uncommitted: %d records of the killed transaction in the log, none read committed", aborted)
}

// A transaction left open past its timeout (a relay stuck between its produce and its commit)
// holds back every read_committed consumer of its partitions until the broker aborts it: the
// test measures how long a record another producer wrote after it stays unread, read_committed.
// The broker then aborts the transaction and bumps the id's epoch: the stuck relay's commit is
// refused, its producer publishes no more, and its records are never visible.
func TestTxnProducerTransactionTimesOut(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Apache)
	events, cursors := exactlyOnceTopics(t, k, "relay.txnto", 1)
	cfg := KafkaConfig{Brokers: k.Brokers}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const timeout = 3 * time.Second

	a := fencedProducer(t, ctx, cfg, "test-"+events, kgo.TransactionTimeout(timeout))
	other, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	adm, err := kadm.NewOptClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	var held time.Duration
	var before []kafkatest.Record
	var open string // the broker's offsets while the transaction is open, or why not known
	a.beforeCommit = func() {
		// The broker shows the transaction open: the partition's last stable offset stands
		// below its end.
		stable, err1 := adm.ListCommittedOffsets(ctx, events)
		end, err2 := adm.ListEndOffsets(ctx, events)
		s, _ := stable.Lookup(events, 0)
		e, _ := end.Lookup(events, 0)
		if open = fmt.Sprintf("last stable offset %d, end %d (%v, %v)", s.Offset, e.Offset, err1, err2); err1 == nil && err2 == nil && s.Offset < e.Offset {
			open = ""
		}
		// Stuck with the transaction open: another producer's record after it waits for the
		// broker to abort it.
		written := time.Now()
		if err := other.ProduceSync(ctx, &kgo.Record{Topic: events, Value: []byte("other/0")}).FirstErr(); err != nil {
			t.Errorf("the other producer: %v", err)
			return
		}
		before = k.NewCommittedConsumer(t, events).ReadN(t, 1, time.Minute)
		held = time.Since(written)
	}
	// The broker's abort bumps the id's epoch: the commit is refused as fenced (transactions of
	// KIP-890's first part, which the producer uses), or as an invalid state.
	_, ok, err := a.publish(ctx, txnRecords(events, "a1", 3, 10), cursorRecord(cursors, "s", "a1"))
	if ok || !errors.Is(err, errTxnAborted) && !errors.Is(err, errFenced) {
		t.Fatalf("the commit after the transaction timed out: committed %v, %v; want refused, the transaction aborted", ok, err)
	}
	if _, ok, err := a.publish(ctx, txnRecords(events, "a2", 3, 1), cursorRecord(cursors, "s", "a2")); ok || !txnLost(err) {
		t.Fatalf("the producer after its transaction was aborted: committed %v, %v; want it to publish no more", ok, err)
	}
	if len(before) != 1 || string(before[0].Value) != "other/0" {
		t.Fatalf("read committed %v, want the other producer's record only (the stuck transaction's before it)", before)
	}
	t.Logf("a transaction open past its %s timeout held a read_committed consumer back %s (the broker aborts timed-out transactions on its cleanup interval); the stuck commit: %v",
		timeout, held.Round(time.Millisecond), err)
	if open != "" {
		t.Errorf("before the commit the broker did not show the transaction open: %s", open)
	}
}

// fencedProducer makes a transactional producer for id and fences the id, closed when the test
// ends.
func fencedProducer(t *testing.T, ctx context.Context, cfg KafkaConfig, id string, opts ...kgo.Opt) *txnProducer {
	t.Helper()
	p, err := newTxnProducer(cfg, contract.CompressionNone, id, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	if err := p.fence(ctx); err != nil {
		t.Fatal(err)
	}
	return p
}
