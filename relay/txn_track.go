// Exactly-once delivery's side of snapshot tracking (--delivery exactly-once): each batch's
// events, and the shard's cursor as it stands once they are published, go to Kafka in one
// transaction (txn_producer.go, txn_cursor.go); the database's cursor rows, parks and unparks
// are written after the commit, as a copy that is never ahead of it.

package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// txnTrack is one snapshot tenure's exactly-once state: its producer, the shard it names, and
// the events parked (from the stream) or unparked (published from the parked table) by
// committed transactions whose database writes are not confirmed yet: every cursor record
// carries them until they are, so that a crash in between parks or unparks them again.
type txnTrack struct {
	p        *txnProducer
	shard    string
	parked   map[int64]time.Time // id -> created_at
	unparked map[int64]struct{}
}

// txnBatch is what an exactly-once batch carries to its publication, prepared on the loop's
// goroutine (the publishing goroutine reads nothing of the tracker's): the cursor's groups as
// they stand once the batch is published, the unconfirmed parks and unparks before it, and,
// after its publication, the transaction's outcome.
type txnBatch struct {
	p        *txnProducer
	shard    string
	topic    string
	groups   []txnCursorGroup
	parked   []txnRow
	unparked []int64
	// committed: the rows the transaction parked and unparked (to confirm once the database
	// wrote them); lost: the producer publishes no more (the tenure ends).
	newParked   []txnRow
	newUnparked []int64
	lost        error
}

// exactlyOnce reports whether the relay publishes exactly once.
func (r *Relay) exactlyOnce() bool { return r.cfg.Delivery == contract.DeliveryExactlyOnce }

// txnTimeouts bounds the Kafka side of a tenure's start: fencing and reading the cursor.
const txnStartTimeout = 2 * requestTimeout

// beginTxn starts a tenure's exactly-once side, before its first fetch: it fences the shard's
// transactional id (which ends a previous holder's open transaction and refuses its commits),
// reads the shard's committed cursor record to its end and reconciles the database's cursor rows
// with it: a record ahead of them (a crash between a commit and the database's copy) is written
// to them, with the parks and unparks it carries.
func (r *Relay) beginTxn(conn *pgx.Conn, ten *tenure, st *snapState) (*txnTrack, error) {
	ctx, cancel := context.WithTimeout(context.Background(), txnStartTimeout)
	defer cancel()
	var sys string
	if err := conn.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sys); err != nil {
		return nil, err
	}
	count := max(ten.count, 1)
	if count > 1 {
		// Resharding under exactly-once (the old layout's ids fenced and their cursors merged
		// before the switch) is not built yet: a shard of several would read no record of the
		// layout before it.
		return nil, &errCursor{msg: fmt.Sprintf("exactly-once delivery runs one shard; the layout of %s has %d: run it at-least-once, or with one shard",
			r.cfg.Table, count)}
	}
	shard := txnShardID(sys, r.cfg.Table.String(), ten.gen, int(ten.buckets[0])%count, count)
	p, err := newTxnProducer(r.cfg.Kafka, r.cfg.Compression, shard)
	if err != nil {
		return nil, err
	}
	t := &txnTrack{p: p, shard: shard, parked: map[int64]time.Time{}, unparked: map[int64]struct{}{}}
	if err := r.reconcileTxn(ctx, conn, t, st); err != nil {
		p.close()
		return nil, err
	}
	return t, nil
}

func (r *Relay) reconcileTxn(ctx context.Context, conn *pgx.Conn, t *txnTrack, st *snapState) error {
	if err := t.p.fence(ctx); err != nil {
		return err
	}
	v, found, err := readCursor(ctx, r.cfg.Kafka, r.cfg.CursorTopic, []byte(t.shard))
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		// Not ready, saying what to do, until it exists (each tenure's start looks again).
		return &errCursor{msg: fmt.Sprintf("exactly-once: the cursor topic %s does not exist: create it with cleanup.policy=compact, "+
			"or let the operator create it (spec.kafka.topics.policy: Create)", r.cfg.CursorTopic)}
	}
	if err != nil || !found {
		return err
	}
	rec, err := decodeCursor(t.shard, v)
	if err != nil {
		return &errCursor{msg: err.Error()}
	}
	adopt, behind, err := reconcileCursor(st.groups, &rec) // behind: the database published at-least-once since
	if err != nil {
		return &errCursor{msg: fmt.Sprintf("exactly-once: %v (shard %s)", err, t.shard)}
	}
	if behind && len(adopt) == 0 {
		r.log.Info("exactly-once: the database's cursor is past the shard's cursor record (published at-least-once since); it stands",
			"transactional_id", t.shard)
		return nil
	}
	var pb pgx.Batch
	for i, k := range adopt {
		g := st.groups[i]
		g.snap = snapMark{text: k.Snap, floor: k.SnapFloor, ceil: -1}
		g.next = snapMark{text: k.Next, floor: k.NextFloor, ceil: k.NextCeil}
		g.last = k.Last
		g.dirty = true
	}
	r.queueCursorWrites(&pb, st, true, false)
	if len(adopt) > 0 && len(rec.Parked) > 0 {
		ids, created, attempts, errs := make([]int64, 0, len(rec.Parked)), make([]time.Time, 0, len(rec.Parked)), make([]int32, 0, len(rec.Parked)), make([]string, 0, len(rec.Parked))
		for _, p := range rec.Parked {
			ids, created, attempts, errs = append(ids, p.ID), append(created, p.Created), append(attempts, 0), append(errs, heldBack)
		}
		pb.Queue(st.q.park, ids, created, attempts, errs).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var agg string
				if err := rows.Scan(&agg); err != nil {
					return err
				}
				st.parked[agg]++
			}
			return rows.Err()
		})
	}
	if len(rec.Unparked) > 0 {
		pb.Queue(st.q.unpark, rec.Unparked).Query(func(rows pgx.Rows) error { return r.unparked(st, rows) })
	}
	if pb.Len() == 0 {
		return nil
	}
	if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
		return err
	}
	r.log.Info("exactly-once: the shard's cursor record was ahead of the database's; the database follows it",
		"transactional_id", t.shard, "groups", len(adopt), "parked", len(rec.Parked), "unparked", len(rec.Unparked))
	return nil
}

// prepareTxn gives b, about to be published, what its transaction carries: the groups as b
// leaves them, and the unconfirmed parks and unparks.
func (t *txnTrack) prepareTxn(r *Relay, st *snapState, b *batch) {
	tb := &txnBatch{p: t.p, shard: t.shard, topic: r.cfg.CursorTopic}
	for _, g := range st.groups {
		k := txnGroupOf(g)
		if g == b.pos.g && !b.pos.parked {
			if b.pos.complete {
				k.Snap, k.SnapFloor, k.Next, k.NextFloor, k.NextCeil, k.Last = b.pos.to.text, b.pos.to.floor, "", -1, -1, 0
			} else {
				k.Snap, k.SnapFloor = b.pos.from.text, b.pos.from.floor
				k.Next, k.NextFloor, k.NextCeil, k.Last = b.pos.to.text, b.pos.to.floor, b.pos.to.ceil, b.pos.last
			}
		}
		tb.groups = append(tb.groups, k)
	}
	for id, created := range t.parked {
		tb.parked = append(tb.parked, txnRow{ID: id, Created: created})
	}
	for id := range t.unparked {
		tb.unparked = append(tb.unparked, id)
	}
	b.txn = tb
}

// settledTxn notes a settled batch's committed parks and unparks as unconfirmed.
func (t *txnTrack) settledTxn(b *batch) {
	if b.txn == nil {
		return
	}
	for _, p := range b.txn.newParked {
		t.parked[p.ID] = p.Created
	}
	for _, id := range b.txn.newUnparked {
		t.unparked[id] = struct{}{}
	}
}

// confirmed notes that the batches of record are written to the database: their parks and
// unparks need no record any more.
func (t *txnTrack) confirmed(record []*batch) {
	for _, b := range record {
		if b.txn == nil {
			continue
		}
		for _, p := range b.txn.newParked {
			delete(t.parked, p.ID)
		}
		for _, id := range b.txn.newUnparked {
			delete(t.unparked, id)
		}
	}
}

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
	n := len(b.msgs)
	b.errs = append(b.errs[:0], make([]error, n)...)
	out := map[string]error{} // the aggregates left out, by the error of their failed message
	for {
		var recs []*kgo.Record
		var idx []int
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
			recs = append(recs, kgoRecord(&b.msgs[k]))
			idx = append(idx, k)
		}
		parked := b.txnParked(out)
		unparked := tb.unparked
		var newUnparked []int64
		if b.pos.parked {
			for _, k := range idx {
				newUnparked = append(newUnparked, b.rows[b.msgRows[k]].id)
			}
			unparked = append(append([]int64(nil), unparked...), newUnparked...)
		}
		rec := txnCursor{V: txnCursorVersion, Shard: tb.shard, Groups: tb.groups, Parked: parked, Unparked: unparked}
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
			tb.newUnparked = newUnparked
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
	sent := make(map[int]bool, len(b.msgs))
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

// kgoRecord is m as franz-go's record: its partition picked again by the producer (murmur2 of
// the key, as Murmur2Balancer).
func kgoRecord(m *kafka.Message) *kgo.Record {
	rec := &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value, Timestamp: m.Time}
	if len(m.Headers) > 0 {
		rec.Headers = make([]kgo.RecordHeader, len(m.Headers))
		for i, h := range m.Headers {
			rec.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
		}
	}
	return rec
}

// txnLost reports whether err ended an exactly-once producer: not the event's fault (nothing is
// charged); the tenure ends.
func txnLost(err error) bool {
	return errors.Is(err, errFenced) || errors.Is(err, errUnknownOutcome) || errors.Is(err, errTxnAborted)
}

// end closes the tenure's producer.
func (t *txnTrack) end() { t.p.close() }
