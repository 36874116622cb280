package main

// The txncost scenario: what a Kafka transaction costs the broker, against a plain produce of the
// same records, at the cadence an exactly-once relay commits them (one transaction per batch,
// a batch every latency budget). It isolates the broker's side of exactly-once delivery from
// PostgreSQL, the relay and the writers: one franz-go client, the run's broker, nothing else.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/relay"
)

// TxnCostResult is the txncost scenario: each variant's calls (a produce, or a transaction
// with its cursor record) at Rate a second, Records events each, spread over Partitions.
type TxnCostResult struct {
	Rate       int     `json:"rate"`
	Records    int     `json:"records"`
	Partitions int     `json:"partitions"`
	Rounds     int     `json:"rounds"`
	Round      float64 `json:"roundSeconds"`
	// Drain is the back-to-back variants' events per call.
	Drain int           `json:"drain"`
	Rows  []*TxnCostRow `json:"rows"`
	Err   string        `json:"err,omitempty"`
}

// TxnCostRow is one variant, summed over its rounds.
type TxnCostRow struct {
	Key     string `json:"key"`
	Name    string `json:"name"`
	Records int    `json:"records"`
	// Read: a consumer read the topic meanwhile.
	Read  bool    `json:"read,omitempty"`
	Calls int     `json:"calls"`
	Wall  float64 `json:"wall"`
	// BrokerCPU is the broker JVM's CPU seconds over the variant's rounds.
	BrokerCPU float64 `json:"brokerCPU"`
	// P50 and P99 are a call's latency, ms: the produce acknowledged, or the transaction
	// committed.
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	// Requests are the client's requests per call, by Kafka API.
	Requests map[string]float64 `json:"requests"`
	Err      string             `json:"err,omitempty"`
}

// txnCostVariant is a way of sending: an idempotent produce (what an at-least-once publisher
// with Kafka's producer defaults sends), or a transaction as the exactly-once relay makes one
// (relay/txn_producer.go: transaction.version 1 requests, CONCURRENT_TRANSACTIONS retried at
// 1 ms) or as a client allowed transaction.version 2 would; paced at a steady rate's cadence
// with a steady rate's batch, or back to back with a drain's; read meanwhile, or not, by a
// consumer (read_committed for transactions) that follows the topic's end, as the benchmark's
// consumers and an application's do.
type txnCostVariant struct {
	key, name string
	txn, v2   bool
	records   int
	paced     bool
	read      bool
	// ids: transactions alternate between this many transactional ids, each a client of its own
	// (0 or 1: one), one transaction at a time.
	ids int
}

var txnCostVariants = []txnCostVariant{
	{"produce", "produce (idempotent, acks=all), paced", false, false, txnCostRecords, true, false, 1},
	{"txn", "transaction, as the relay (transaction.version 1), paced", true, false, txnCostRecords, true, false, 1},
	{"txn-v2", "transaction, transaction.version 2 (KIP-890), paced", true, true, txnCostRecords, true, false, 1},
	{"produce-read", "produce, paced, read by a consumer", false, false, txnCostRecords, true, true, 1},
	{"txn-read", "transaction, paced, read by a read_committed consumer", true, false, txnCostRecords, true, true, 1},
	{"txn-2ids", "transaction, two transactional ids in turn, paced", true, false, txnCostRecords, true, false, 2},
	{"txn-v2-2ids", "transaction, transaction.version 2, two transactional ids in turn, paced", true, true, txnCostRecords, true, false, 2},
	{"produce-drain", "produce, back to back", false, false, txnCostDrainRecords, false, false, 1},
	{"txn-drain", "transaction, as the relay, back to back", true, false, txnCostDrainRecords, false, false, 1},
	{"txn-v2-drain", "transaction, transaction.version 2, back to back", true, true, txnCostDrainRecords, false, false, 1},
	{"txn-2ids-drain", "transaction, two transactional ids in turn, back to back", true, false, txnCostDrainRecords, false, false, 2},
	{"txn-v2-2ids-drain", "transaction, transaction.version 2, two transactional ids in turn, back to back", true, true, txnCostDrainRecords, false, false, 2},
	{"produce-drain-read", "produce, back to back, read by a consumer", false, false, txnCostDrainRecords, false, true, 1},
	{"txn-drain-read", "transaction, back to back, read by a read_committed consumer", true, false, txnCostDrainRecords, false, true, 1},
}

// txnCostRate, txnCostRecords: a shard at 2,000 events/s with the default latency budget
// commits about one batch of 16 events every 8 ms. txnCostDrainRecords: a snapshot relay's
// batch in a drain (its fetch: relay.SnapshotFetchFactor times the default --batch-size), one
// transaction under exactly-once.
const (
	txnCostRate         = int(time.Second / contract.MaxDelay)
	txnCostRecords      = 16
	txnCostDrainRecords = relay.SnapshotFetchFactor * relay.DefaultBatchSize
)

func (e *env) scenarioTxnCost(ctx context.Context, res *Results) {
	rounds, round := 2, time.Duration(float64(20*time.Second)*e.cfg.scale)
	round = max(round, 3*time.Second)
	tr := &TxnCostResult{Rate: txnCostRate, Records: txnCostRecords, Partitions: int(e.cfg.partitions), Rounds: rounds, Round: round.Seconds(),
		Drain: txnCostDrainRecords}
	res.TxnCost = tr
	progress("txncost: %d calls/s of %d records, %d rounds of %s per variant, interleaved", tr.Rate, tr.Records, rounds, round)
	events, err := e.newTopic(ctx, "txncost")
	if err != nil {
		tr.Err = err.Error()
		return
	}
	defer e.deleteTopic(context.Background(), events)
	compact := "compact"
	cursors, err := e.newTopicWith(ctx, "txncost.cursors", map[string]*string{"cleanup.policy": &compact})
	if err != nil {
		tr.Err = err.Error()
		return
	}
	defer e.deleteTopic(context.Background(), cursors)
	kpid := findKafkaPid(e.kafka.Brokers)
	if kpid == 0 {
		tr.Err = "the broker's process was not found: its CPU cannot be measured"
		return
	}
	rows := map[string]*TxnCostRow{}
	lat := map[string][]time.Duration{}
	for _, v := range txnCostVariants {
		rows[v.key] = &TxnCostRow{Key: v.key, Name: v.name, Records: v.records, Read: v.read, Requests: map[string]float64{}}
		tr.Rows = append(tr.Rows, rows[v.key])
	}
	// A warm-up round of each first (the broker's JIT), not counted.
	for r := -1; r < rounds && ctx.Err() == nil; r++ {
		for _, v := range txnCostVariants {
			row := rows[v.key]
			if row.Err != "" {
				continue
			}
			d := round
			if r < 0 {
				d = round / 2
			}
			got, err := e.txnCostRound(ctx, v, events, cursors, kpid, d)
			if err != nil {
				row.Err = err.Error()
				continue
			}
			if r < 0 {
				continue
			}
			row.Calls += got.calls
			row.Wall += got.wall.Seconds()
			row.BrokerCPU += got.broker.Seconds()
			for k, n := range got.requests {
				row.Requests[k] += float64(n)
			}
			lat[v.key] = append(lat[v.key], got.lat...)
		}
	}
	for _, row := range tr.Rows {
		if row.Calls == 0 {
			continue
		}
		for k := range row.Requests {
			row.Requests[k] /= float64(row.Calls)
		}
		l := lat[row.Key]
		slices.Sort(l)
		row.P50, row.P99 = ms(l[len(l)/2]), ms(l[(len(l)-1)*99/100])
		progress("txncost: %s: %.0f calls/s, broker %.0f µs per call, p50 %.1f ms, p99 %.1f ms", row.Name, float64(row.Calls)/row.Wall,
			row.BrokerCPU/float64(row.Calls)*1e6, row.P50, row.P99)
	}
}

type txnCostGot struct {
	calls        int
	wall, broker time.Duration
	lat          []time.Duration
	requests     map[string]int
}

// requestCounter counts a client's requests by Kafka API.
type requestCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *requestCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err != nil {
		return
	}
	c.mu.Lock()
	c.n[kmsg.NameForKey(key)]++
	c.mu.Unlock()
}

// txnCostRound runs variant for d on a client of its own (its set-up not counted) and measures
// the broker's CPU over it.
func (e *env) txnCostRound(ctx context.Context, v txnCostVariant, events, cursors string, kpid int, d time.Duration) (*txnCostGot, error) {
	counter := &requestCounter{n: map[string]int{}}
	opts := []kgo.Opt{kgo.SeedBrokers(e.kafka.Brokers...), kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), kgo.WithHooks(counter)}
	txn := v.txn
	clients := make([]*kgo.Client, max(v.ids, 1))
	base := "bench-txncost-" + v.key + "-" + strconv.FormatUint(rand.Uint64(), 36)
	for i := range clients {
		o := opts
		if txn {
			o = append(slices.Clone(opts), kgo.TransactionalID(base+"-"+strconv.Itoa(i)), kgo.ConcurrentTransactionsBackoff(time.Millisecond))
			if !v.v2 {
				o = append(o, kgo.MaxVersions(kversion.V3_9_0()))
			}
		}
		c, err := kgo.NewClient(o...)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		clients[i] = c
	}
	turn := 0
	value := []byte(strings.Repeat("x", 300))
	call := func() error {
		cl := clients[turn%len(clients)]
		turn++
		recs := make([]*kgo.Record, 0, v.records+1)
		for range v.records {
			recs = append(recs, &kgo.Record{Topic: events, Key: []byte("order-" + strconv.Itoa(rand.IntN(100000))), Value: value})
		}
		if !txn {
			return cl.ProduceSync(ctx, recs...).FirstErr()
		}
		recs = append(recs, &kgo.Record{Topic: cursors, Key: []byte("shard-0"), Value: value[:120]})
		if err := cl.BeginTransaction(); err != nil {
			return err
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			_ = cl.EndTransaction(ctx, kgo.TryAbort)
			return err
		}
		return cl.EndTransaction(ctx, kgo.TryCommit)
	}
	for range clients { // the connections, the producer ids and the coordinator
		if err := call(); err != nil {
			return nil, fmt.Errorf("%s: %w", v.key, err)
		}
	}
	counter.mu.Lock()
	counter.n = map[string]int{} // the set-up's requests are not counted
	counter.mu.Unlock()
	got := &txnCostGot{}
	var read *topicReader
	if v.read {
		var err error
		if read, err = e.startTopicReader(ctx, events, txn); err != nil {
			return nil, err
		}
		defer read.stop()
	}
	tick := time.NewTicker(time.Second / time.Duration(txnCostRate))
	defer tick.Stop()
	cpu0, _, err := procTimes(kpid)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	for time.Since(start) < d && ctx.Err() == nil {
		if v.paced {
			<-tick.C
		}
		t := time.Now()
		if err := call(); err != nil {
			return nil, fmt.Errorf("%s: %w", v.key, err)
		}
		got.lat = append(got.lat, time.Since(t))
		got.calls++
	}
	if read != nil {
		// The consumer's work is the broker's too: it is measured until it has read every
		// event of the round (or 10 s).
		read.await(int64(got.calls*v.records), 10*time.Second)
	}
	got.wall = time.Since(start)
	cpu1, _, err := procTimes(kpid)
	if err != nil {
		return nil, err
	}
	got.broker = cpu1 - cpu0
	counter.mu.Lock()
	got.requests = counter.n
	counter.mu.Unlock()
	return got, nil
}

// writeTxnCost writes the txncost section.
func writeTxnCost(b *strings.Builder, res *Results) {
	tr := res.TxnCost
	if tr == nil {
		return
	}
	fmt.Fprintf(b, "## What a Kafka transaction costs the broker\n\n")
	if tr.Err != "" {
		fmt.Fprintf(b, "Not measured: %s\n\n", tr.Err)
		return
	}
	fmt.Fprintf(b, "One franz-go client and the run's broker, nothing else running, each call %s events of 300 bytes on random keys "+
		"over the topic's %d partitions: *paced*, %s calls a second of %d events (an exactly-once shard at 2,000 events/s "+
		"with the default latency budget, %d ms, commits a batch of about 16 events every 8 ms), and *back to back*, calls of %s "+
		"events, each sent once the last one ended (a snapshot relay's batch in a drain). *produce* is one idempotent produce "+
		"(acks=all) per call; each transaction also carries the shard's cursor record to a compacted topic, as the relay's "+
		"does, and commits. *Read* variants have a consumer follow the topic's end meanwhile (read_committed for "+
		"transactions), as the benchmark's consumers and an application's do; the round lasts until it has read every "+
		"event. *Two transactional ids in turn* alternate each transaction between two clients of their own, one at a time "+
		"(a design not in the relay: a transaction of one id need not wait for the markers of the other's last one). Each variant runs %d interleaved rounds of %.0f s, after a warm-up round of each; *vs produce* compares "+
		"with the produce of the same shape. Broker CPU is the JVM's, from `/proc`; requests are the producer's per call.\n\n",
		"16 or "+fmtInt(float64(tr.Drain)), tr.Partitions, fmtInt(float64(tr.Rate)), tr.Records, contract.MaxDelay.Milliseconds(), fmtInt(float64(tr.Drain)),
		tr.Rounds, tr.Round)
	fmt.Fprintf(b, "| variant | events per call | calls/s | events/s | broker CPU µs per call | per event | vs produce | broker, %% of a core | p50 / p99 ms | requests per call |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	type shape struct{ drain, read bool }
	base := map[shape]float64{}
	for _, row := range tr.Rows {
		if strings.HasPrefix(row.Key, "produce") && row.Calls > 0 {
			base[shape{row.Records == tr.Drain, row.Read}] = row.BrokerCPU / float64(row.Calls)
		}
	}
	for _, row := range tr.Rows {
		if row.Err != "" || row.Calls == 0 {
			fmt.Fprintf(b, "| %s | %d | | | | | | | | %s |\n", row.Name, row.Records, orDash(firstLine(row.Err, 80)))
			continue
		}
		per := row.BrokerCPU / float64(row.Calls)
		vs := "-"
		if p := base[shape{row.Records == tr.Drain, row.Read}]; p > 0 {
			vs = fmt.Sprintf("%.2fx", per/p)
		}
		var reqs []string
		for k, n := range row.Requests {
			if n >= 0.01 {
				reqs = append(reqs, fmt.Sprintf("%s %.2f", k, n))
			}
		}
		slices.Sort(reqs)
		calls := float64(row.Calls) / row.Wall
		fmt.Fprintf(b, "| %s | %s | %s | %s | %.0f | %.1f | %s | %.1f%% | %.1f / %.1f | %s |\n", row.Name, fmtInt(float64(row.Records)),
			fmtInt(calls), fmtInt(calls*float64(row.Records)), per*1e6, per*1e6/float64(row.Records), vs, 100*row.BrokerCPU/row.Wall,
			row.P50, row.P99, strings.Join(reqs, ", "))
	}
	fmt.Fprintf(b, "\nA transaction is three appends to the transaction log (the partitions added, the commit prepared, the commit "+
		"complete), the coordinator's marker request to the partitions' leader and a marker in each partition, beside the "+
		"records' own produce: the broker's work per transaction is fixed, whatever the events in it. Paced, the broker's CPU "+
		"per event under exactly-once therefore falls only with the events per transaction, which at a steady rate are the "+
		"rate times the latency budget: fewer transactions a second cost latency one for one, whether by a longer budget or "+
		"by transactions spanning several batches. Back to back, a transaction begins while the previous one's markers are "+
		"being written: under transaction.version 1 its first request is refused (CONCURRENT_TRANSACTIONS) and retried every "+
		"millisecond, under version 2 the broker retries it itself every `add.partitions.to.txn.retry.backoff.ms` (20 ms): "+
		"the ceiling of one producer's transactions a second, and so of an exactly-once shard's drain.\n\n")
}
