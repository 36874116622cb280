package relay

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/internal/kafkaauth"
)

// txnProducer is exactly-once delivery's producer for one shard (txn_track.go): franz-go's
// transactional producer (kafka-go has none), with the relay's TLS and SASL.
// Each batch's events and the shard's cursor record go to Kafka in one transaction (publish),
// so that a read_committed consumer sees the events and the position past them together or
// neither. A producer is made for one tenure: fence, at its start, makes the transactional id
// its own (the broker completes or aborts the previous holder's open transaction and refuses
// that holder's later commits); only then is the committed cursor read (readCursor), from the
// cursor topic, to its end. Partitions are picked as the at-least-once publisher picks them
// (murmur2 of the key, the Java client's), so an aggregate's events stay on one partition
// whichever delivery publishes them.
type txnProducer struct {
	cl   *kgo.Client
	id   string
	once sync.Once // close
	// dead is why the producer publishes no more (fenced, a commit whose outcome is unknown, a
	// transaction the broker aborted): every later call returns it. The relay then closes it
	// and gives the shard up; the next producer of the shard fences the id and reads the
	// committed cursor.
	dead error
	// beforeCommit, for tests, runs between a batch's produce and its commit: the moment the
	// transaction is open with its records in the log.
	beforeCommit func()
}

// txnTimeout is the transaction timeout the producer asks for (transaction.timeout.ms): a
// transaction open longer is aborted by the broker, and until then holds back every
// read_committed consumer of its partitions (the last stable offset). A batch's transaction
// lasts a produce and a commit.
const txnTimeout = 30 * time.Second

// errFenced is a publish or fence refused because the transactional id has a newer epoch:
// another producer took the shard, or the broker aborted a transaction of this one that outlived
// transaction.timeout.ms (which bumps the epoch too); either way the relay must give the shard
// up and publish nothing more.
var errFenced = errors.New("fenced: the shard's transactional id has a newer epoch (another relay took the shard, or the broker aborted a transaction that outlived its timeout)")

func newTxnProducer(k KafkaConfig, compression contract.Compression, id string, extra ...kgo.Opt) (*txnProducer, error) {
	opts, err := franzOpts(k)
	if err != nil {
		return nil, err
	}
	opts = append(opts,
		kgo.TransactionalID(id),
		kgo.TransactionTimeout(txnTimeout),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), // murmur2 of the key, as the Java client
		kgo.ProducerLinger(0),
		kgo.ProducerBatchCompression(franzCodec(compression)),
		kgo.ProduceRequestTimeout(requestTimeout),
		kgo.ConcurrentTransactionsBackoff(txnRetryMin),
		// Transactions as before KIP-890's second part (transaction.version 2): the client adds
		// each partition to the transaction itself (AddPartitionsToTxn) and retries a
		// CONCURRENT_TRANSACTIONS at txnRetryMin. Under version 2 the broker adds it while it
		// appends the produce, and retries that itself every add.partitions.to.txn.retry.backoff.ms
		// (20 ms by default): a transaction begun while the previous one's markers are written,
		// as one per batch is at a few thousand events a second, took 22 ms instead of 2.4 ms
		// (p50 of 1,500 back-to-back transactions on the test broker).
		kgo.MaxVersions(kversion.V3_9_0()),
	)
	cl, err := kgo.NewClient(append(opts, extra...)...)
	if err != nil {
		return nil, err
	}
	return &txnProducer{cl: cl, id: id}, nil
}

// txnRetryMin is the backoff of a transactional request that met CONCURRENT_TRANSACTIONS: a
// transaction begun right after the previous one's commit meets it while the broker writes the
// previous one's markers (a millisecond or two); franz-go's default, 20 ms, would add its
// overshoot to the batch's latency (it backs off longer by itself once the error lasts a second).
const txnRetryMin = time.Millisecond

// franzCodec is franz-go's codec for the relay's --compression.
func franzCodec(c contract.Compression) kgo.CompressionCodec {
	switch c {
	case contract.CompressionGzip:
		return kgo.GzipCompression()
	case contract.CompressionSnappy:
		return kgo.SnappyCompression()
	case contract.CompressionLz4:
		return kgo.Lz4Compression()
	case contract.CompressionZstd:
		return kgo.ZstdCompression()
	}
	return kgo.NoCompression()
}

// franzOpts are a franz-go client's options for the relay's brokers, TLS and SASL.
func franzOpts(k KafkaConfig) ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...), kgo.ClientID("outbox-relay")}
	if tlsCfg, err := k.tlsConfig(); err != nil {
		return nil, err
	} else if tlsCfg != nil {
		opts = append(opts, kgo.DialTLSConfig(tlsCfg))
	}
	if k.SASLMechanism != "" {
		mech, err := kafkaauth.FranzSASL(k.SASLMechanism, k.SASLUsername, k.SASLPassword)
		if err != nil {
			return nil, fmt.Errorf("--kafka-sasl-mechanism %s: %w", k.SASLMechanism, err)
		}
		opts = append(opts, kgo.SASL(mech))
	}
	return opts, nil
}

// fence makes the transactional id this producer's: the broker bumps the id's epoch, which ends
// the previous holder's open transaction and refuses its later requests.
func (p *txnProducer) fence(ctx context.Context) error {
	if _, _, err := p.cl.ProducerID(ctx); err != nil {
		return fencedOr(fmt.Errorf("initialising transactional id %q: %w", p.id, err))
	}
	return nil
}

// publish produces recs and then cursor in one transaction and commits it. errs holds each
// record's error (nil: in the committed transaction); committed says whether the transaction
// committed. Any record that failed aborts the transaction: none of recs is then visible to a
// read_committed consumer, and the cursor did not move. An error wrapping errFenced means the
// shard is no longer this producer's.
func (p *txnProducer) publish(ctx context.Context, recs []*kgo.Record, cursor *kgo.Record) (errs []error, committed bool, err error) {
	if p.dead != nil {
		return nil, false, p.dead
	}
	errs, committed, err = p.transact(ctx, recs, cursor)
	if err != nil && (errors.Is(err, errFenced) || errors.Is(err, errUnknownOutcome) || errors.Is(err, errTxnAborted)) {
		p.dead = err
	}
	return errs, committed, err
}

var (
	// errUnknownOutcome: a commit's outcome is unknown (the broker did not answer it).
	errUnknownOutcome = errors.New("the transaction's outcome is unknown")
	// errTxnAborted: the broker aborted the transaction before its commit (it outlived
	// transaction.timeout.ms); none of its records is visible.
	errTxnAborted = errors.New("the broker aborted the transaction: it outlived its timeout")
)

func (p *txnProducer) transact(ctx context.Context, recs []*kgo.Record, cursor *kgo.Record) (errs []error, committed bool, err error) {
	if err := p.cl.BeginTransaction(); err != nil {
		return nil, false, fencedOr(err)
	}
	all := make([]*kgo.Record, 0, len(recs)+1)
	all = append(append(all, recs...), cursor)
	results := p.cl.ProduceSync(ctx, all...) // in the order they completed
	var at map[*kgo.Record]int               // each record's index, once one failed
	errs = make([]error, len(recs))
	failed := false
	var cursorErr error
	for _, res := range results {
		if res.Err == nil {
			continue
		}
		if !failed {
			failed = true
			at = make(map[*kgo.Record]int, len(all))
			for i, r := range all {
				at[r] = i
			}
		}
		if i := at[res.Record]; i < len(recs) {
			errs[i] = res.Err
		} else {
			cursorErr = res.Err
		}
	}
	if !failed {
		if p.beforeCommit != nil {
			p.beforeCommit()
		}
		err := p.cl.EndTransaction(ctx, kgo.TryCommit)
		if err == nil {
			return errs, true, nil
		}
		if !errors.Is(err, kerr.OperationNotAttempted) && !errors.Is(err, kerr.TransactionAbortable) {
			// The commit's outcome is unknown: this producer publishes no more. The next one
			// fences the transactional id, which completes or aborts the transaction, and
			// reads the cursor that the broker says was committed.
			err = fmt.Errorf("committing: %w", err)
			if fenced(err) {
				return errs, false, fencedOr(err)
			}
			if errors.Is(err, kerr.InvalidTxnState) {
				// The broker ended the transaction itself: it outlived its timeout (the
				// producer was stuck) and was aborted, the id's epoch bumped.
				return errs, false, fmt.Errorf("%w: %w", errTxnAborted, err)
			}
			return errs, false, fmt.Errorf("%w: %w", errUnknownOutcome, err)
		}
		// A record failed after all (the commit was not attempted): abort below.
	}
	if err := p.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		return errs, false, fencedOr(fmt.Errorf("aborting: %w", err))
	}
	if cursorErr != nil {
		return errs, false, fencedOr(fmt.Errorf("the cursor record: %w", cursorErr))
	}
	for _, e := range errs {
		if e != nil && fenced(e) {
			return errs, false, fencedOr(e)
		}
	}
	return errs, false, nil
}

// fenced reports whether err says another producer took the transactional id.
func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)
}

// fencedOr wraps err with errFenced when it says the producer was fenced.
func fencedOr(err error) error {
	if err != nil && fenced(err) {
		return fmt.Errorf("%w: %w", errFenced, err)
	}
	return err
}

func (p *txnProducer) close() { p.once.Do(p.cl.Close) }

// readCursor returns the last committed value of key on the cursor topic (nil, false when it has
// none) that can be read now: to the last stable offset as it stands, without waiting for the
// transactions open on the topic (the tests' observer of what a killed relay committed, whose
// open transaction nobody ends until the next relay fences it).
func readCursor(ctx context.Context, k KafkaConfig, topic string, key []byte) ([]byte, bool, error) {
	got, err := readCursorsWithin(ctx, k, topic, func(s string) bool { return s == string(key) }, -1, nil)
	v, found := got[string(key)]
	return v, found, err
}

// readCursors returns the last committed value of each key of the cursor topic that match
// accepts: it reads, read_committed, every partition from its start to its last stable offset,
// once that has reached the partition's end as it stood when called (stableEnds). Called after
// fence (and fenceLayouts), no transaction of an earlier holder of those keys is open; but the
// other shards' transactions write to the same partitions, and one open when the reader came
// holds the last stable offset below the records committed after it began: this shard's last
// cursor record among them (read short, it would publish that batch again). The topic is
// compacted: a key's earlier values go once their segment is closed and cleaned (the operator
// creates it with small segments).
func readCursors(ctx context.Context, k KafkaConfig, topic string, match func(key string) bool) (map[string][]byte, error) {
	return readCursorsWithin(ctx, k, topic, match, stableEndsWait, nil)
}

// stableEndsWait bounds how long readCursors waits for the transactions open on the cursor
// topic's partitions to end: the broker aborts one open longer than its timeout (txnTimeout,
// the relays'), at its next check for them (transaction.abort.timed.out.transaction.cleanup.interval.ms,
// 10 s by default).
const stableEndsWait = txnTimeout + 15*time.Second

// readCursorsWithin is readCursors waiting at most wait for the stable ends (below 0: not at
// all, reading to the last stable offsets as they stand); held, when not nil, is told each time a
// partition is found held (tests).
func readCursorsWithin(ctx context.Context, k KafkaConfig, topic string, match func(key string) bool, wait time.Duration,
	held func(partition int32, stable, end int64)) (map[string][]byte, error) {
	opts, adm, err := franzAdmin(k)
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	var ends map[int32]int64
	if wait < 0 {
		ends, err = listedOffsets(topic)(adm.ListCommittedOffsets(ctx, topic))
	} else {
		ends, err = stableEnds(ctx, adm, topic, wait, held)
	}
	if err != nil {
		return nil, err
	}
	end := map[int32]int64{}
	from := map[int32]kgo.Offset{}
	for p, o := range ends {
		if o > 0 {
			end[p] = o
			from[p] = kgo.NewOffset().AtStart()
		}
	}
	got := map[string][]byte{}
	if len(end) == 0 {
		return got, nil
	}
	cl, err := kgo.NewClient(append(opts,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// The transactions' markers too: the last one's offset is the end's, where no data
		// record may follow.
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	next := map[int32]int64{} // the offset after the last record read, by partition
	for p, e := range end {
		for next[p] < e {
			fetches := cl.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("reading cursor topic %s: %w", topic, err)
			}
			var fetchErr error
			fetches.EachError(func(_ string, _ int32, err error) { fetchErr = err })
			if fetchErr != nil {
				return nil, fmt.Errorf("reading cursor topic %s: %w", topic, fetchErr)
			}
			fetches.EachRecord(func(r *kgo.Record) {
				next[r.Partition] = max(next[r.Partition], r.Offset+1)
				if !r.Attrs.IsControl() && match(string(r.Key)) {
					got[string(r.Key)] = r.Value
				}
			})
		}
	}
	return got, nil
}

// stableEnds returns the last stable offset of each partition of topic once it has reached the
// partition's end (high watermark) as it stood at the call: every transaction open then has
// ended (committed, aborted, or aborted by the broker past its timeout); those begun since do
// not hold it back. It polls, and gives up after wait with an errCursor naming the partitions
// still held: a transaction that neither ends nor times out, which a broker killed while writing
// a commit's markers left behind in tests (README, known issues).
func stableEnds(ctx context.Context, adm *kadm.Client, topic string, wait time.Duration, held func(partition int32, stable, end int64)) (map[int32]int64, error) {
	listed := listedOffsets(topic)
	ends, err := listed(adm.ListEndOffsets(ctx, topic))
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		stable, err := listed(adm.ListCommittedOffsets(ctx, topic))
		if err != nil {
			return nil, err
		}
		var behind []string
		for p, e := range ends {
			if stable[p] < e {
				behind = append(behind, fmt.Sprintf("partition %d at %d of %d", p, stable[p], e))
				if held != nil {
					held(p, stable[p], e)
				}
			}
		}
		if len(behind) == 0 {
			return stable, nil
		}
		if time.Now().After(deadline) {
			slices.Sort(behind)
			return nil, &errCursor{msg: fmt.Sprintf("exactly-once: the cursor topic %s has a transaction that has not ended in %s "+
				"(last stable offset below the end: %s): its committed cursor records past it cannot be read; the broker aborts a "+
				"transaction open longer than its timeout, so this one is hung: find its producer with kafka-transactions.sh "+
				"describe-producers (README, known issues)", topic, wait, strings.Join(behind, ", "))}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cursor topic %s: waiting for its open transactions to end: %w", topic, ctx.Err())
		case <-time.After(pause):
		}
	}
}

// listedOffsets returns a function that takes a listing of topic's offsets and returns them by
// partition, or its error.
func listedOffsets(topic string) func(kadm.ListedOffsets, error) (map[int32]int64, error) {
	return func(l kadm.ListedOffsets, err error) (map[int32]int64, error) {
		if err == nil {
			err = l.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("cursor topic %s: %w", topic, err)
		}
		out := map[int32]int64{}
		l.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
		return out, nil
	}
}

// fenceLayouts fences the transactional ids of the table's earlier layouts (prefix, generations
// below gen) that the brokers know (ListTransactions: ids that never committed too), so that a
// relay of an earlier layout that lost its shard without knowing it (frozen, cut off) can commit
// nothing from here on: its open transaction is aborted, its later ones refused. It returns the
// ids fenced. An id unused for transactional.id.expiration.ms is forgotten by the brokers, with
// any producer of it.
func fenceLayouts(ctx context.Context, k KafkaConfig, prefix string, gen int64) ([]string, error) {
	opts, adm, err := franzAdmin(k)
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	// The pattern narrows the listing on Kafka 4.1+; older brokers list every id (filtered here).
	listed, err := adm.ListTransactionsByTxPattern(ctx, nil, nil, "^"+regexp.QuoteMeta(prefix)+".*")
	if err != nil {
		return nil, fmt.Errorf("listing the transactional ids of earlier layouts: %w", err)
	}
	var fenced []string
	for _, tx := range listed.Sorted() {
		if g, ok := txnGeneration(prefix, tx.TxnID); !ok || g >= gen {
			continue
		}
		cl, err := kgo.NewClient(append(opts, kgo.TransactionalID(tx.TxnID), kgo.TransactionTimeout(txnTimeout))...)
		if err != nil {
			return fenced, err
		}
		_, _, err = cl.ProducerID(ctx)
		cl.Close()
		if err != nil {
			return fenced, fmt.Errorf("fencing transactional id %q of an earlier layout: %w", tx.TxnID, err)
		}
		fenced = append(fenced, tx.TxnID)
	}
	return fenced, nil
}

// franzAdmin returns the options of a franz-go client for k and an admin client made with them
// (to close).
func franzAdmin(k KafkaConfig) ([]kgo.Opt, *kadm.Client, error) {
	opts, err := franzOpts(k)
	if err != nil {
		return nil, nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, nil, err
	}
	return opts, kadm.NewClient(cl), nil
}
