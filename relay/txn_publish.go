// Exactly-once delivery's publication (txn_track.go): a batch's events and its cursor record in
// one Kafka transaction, again without the aggregates whose messages the broker refused, and the
// producer that publishes no more (fenced, an unknown commit outcome, an aborted transaction).

package relay

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
)

// publishTxn publishes b in one transaction with its cursor record. A message the broker refuses
// for itself (failEvent) aborts the transaction; its aggregate's messages are then left out
// (the failed one keeps its error and is parked; the others wait behind it) and the rest goes in
// a new transaction, until one commits or the cluster fails them all (an outage: b is fetched
// again). A producer that can publish no more (fenced, an unknown commit outcome, a
// transaction the broker aborted) fails every message as the cluster's, and b.txn.lost ends the
// tenure.
func (r *Relay) publishTxn(ctx context.Context, b *batch) {
	defer close(b.done)
	tb := b.txn
	start := time.Now()
	defer func() { // one span per event, as its last transaction left it
		r.trace.spans(b.msgs, b.errs, b.rows, b.msgRows, start, attribute.String("outbox.transactional_id", tb.shard))
	}()
	n := len(b.msgs)
	b.errs = append(b.errs[:0], make([]error, n)...)
	out := map[string]error{} // the aggregates left out, by the error of their failed message
	for {
		idx := make([]int, 0, n)
		for k := range b.msgs {
			if err := b.preErr(k); err != nil {
				b.errs[k] = err
				continue
			}
			if _, left := out[string(b.rows[b.msgRows[k]].aggID)]; left {
				if b.errs[k] == nil {
					b.errs[k] = errSkipped
				}
				continue
			}
			idx = append(idx, k)
		}
		recs := kgoRecords(b.msgs, idx)
		parked := b.txnParked(out)
		unparked := tb.unparked
		var newUnparked []int64
		if b.pos.parked {
			for _, k := range idx {
				newUnparked = append(newUnparked, b.rows[b.msgRows[k]].id)
			}
			unparked = append(append([]int64(nil), unparked...), newUnparked...)
		}
		var newDead []txnDead
		for _, k := range idx {
			if row := &b.rows[b.msgRows[k]]; r.deadLetter(row) {
				newDead = append(newDead, txnDead{ID: row.id, EventID: string(row.eventID), AggID: string(row.aggID), Error: row.errText})
			}
		}
		dead := append(slices.Clip(tb.dead), newDead...)
		rec := txnCursor{V: txnCursorVersion, Shard: tb.shard, Groups: tb.groups, Parked: parked, Unparked: unparked, Dead: dead}
		errs, committed, err := tb.p.publish(ctx, recs, &kgo.Record{Topic: tb.topic, Key: []byte(tb.shard), Value: rec.encode()})
		if err != nil {
			if txnLost(err) {
				tb.lost = err
				r.log.Warn("exactly-once: the shard's producer publishes no more; the tenure ends and the next one fences the shard and reads its committed cursor",
					"transactional_id", tb.shard, "err", r.red.Error(err))
			}
			for _, k := range idx {
				b.errs[k] = err
			}
			return
		}
		if committed {
			for j, k := range idx {
				b.errs[k] = nil
				b.msgs[k].Partition = int(recs[j].Partition)
			}
			if !b.pos.parked {
				tb.newParked = parked[len(tb.parked):]
			}
			tb.newUnparked, tb.newDead = newUnparked, newDead
			return
		}
		progress := false
		var clusterErr error
		for j, e := range errs {
			if e == nil {
				continue
			}
			k := idx[j]
			if r.classify(e).clusters() {
				clusterErr = e
				continue
			}
			agg := string(b.rows[b.msgRows[k]].aggID)
			if _, left := out[agg]; !left {
				out[agg] = e
				progress = true
			}
			b.errs[k] = e
		}
		if !progress {
			if clusterErr == nil {
				clusterErr = errors.New("kafka: the transaction aborted")
			}
			for _, k := range idx {
				b.errs[k] = clusterErr
			}
			return
		}
	}
}

// txnParked is what b's cursor record says is parked: the unconfirmed parks before it and, for a
// batch of the stream, its rows that the transaction does not carry (failed, held back, or
// waiting behind parked events).
func (b *batch) txnParked(out map[string]error) []txnRow {
	parked := append([]txnRow(nil), b.txn.parked...)
	if b.pos.parked {
		return parked
	}
	sent := make([]bool, len(b.rows))
	for k := range b.msgs {
		if b.preErr(k) != nil {
			continue
		}
		if _, left := out[string(b.rows[b.msgRows[k]].aggID)]; left {
			continue
		}
		sent[b.msgRows[k]] = true
	}
	for i := range b.rows {
		if !sent[i] {
			parked = append(parked, txnRow{ID: b.rows[i].id, Created: b.rows[i].createdAt})
		}
	}
	return parked
}

// kgoRecords are the messages msgs[k], k in idx, as franz-go's records: each one's partition
// picked again by the producer (murmur2 of the key, as Murmur2Balancer). The records and their
// headers are each held in one slice (a drain's transaction carries thousands).
func kgoRecords(msgs []kafka.Message, idx []int) []*kgo.Record {
	headers := 0
	for _, k := range idx {
		headers += len(msgs[k].Headers)
	}
	store := make([]kgo.Record, len(idx))
	hs := make([]kgo.RecordHeader, 0, headers)
	recs := make([]*kgo.Record, len(idx))
	for i, k := range idx {
		m := &msgs[k]
		rec := &store[i]
		rec.Topic, rec.Key, rec.Value, rec.Timestamp = m.Topic, m.Key, m.Value, m.Time
		if len(m.Headers) > 0 {
			from := len(hs)
			for _, h := range m.Headers {
				hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: h.Value})
			}
			rec.Headers = hs[from:len(hs):len(hs)]
		}
		recs[i] = rec
	}
	return recs
}

// lostTxn is why b's exactly-once producer publishes no more (fenced, a commit whose outcome is
// unknown, a transaction the broker aborted), once b's publication has ended; nil at-least-once
// and while the producer publishes. Such a batch's outcome is neither settled nor recorded: the
// committed cursor record says what became of it, and the next tenure follows it.
func (b *batch) lostTxn() error {
	if b.txn == nil {
		return nil
	}
	return b.txn.lost
}

// txnLost reports whether err ended an exactly-once producer: not the event's fault (nothing is
// charged); the tenure ends.
func txnLost(err error) bool {
	return errors.Is(err, errFenced) || errors.Is(err, errUnknownOutcome) || errors.Is(err, errTxnAborted)
}
