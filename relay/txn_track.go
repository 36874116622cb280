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
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
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
	dead     map[int64]txnDead
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
	dead     []txnDead
	// committed: the rows the transaction parked, unparked and dead-lettered (to confirm once
	// the database wrote them); lost: the producer publishes no more (the tenure ends).
	newParked   []txnRow
	newUnparked []int64
	newDead     []txnDead
	lost        error
}

// exactlyOnce reports whether the relay publishes exactly once.
func (r *Relay) exactlyOnce() bool { return r.cfg.Delivery == contract.DeliveryExactlyOnce }

// txnStartTimeout bounds the Kafka side of a tenure's start: fencing, waiting for the cursor
// topic's open transactions to end (stableEnds) and reading the cursors.
const txnStartTimeout = 2*requestTimeout + stableEndsWait

// txnStart is what a tenure's exactly-once side reads before it takes its cursor rows: its
// producer (the shard's transactional id fenced), its shard's committed record (nil: none), and
// the last committed records of the table's earlier layouts (their ids fenced too).
type txnStart struct {
	t   *txnTrack
	own *txnCursor
	old []txnCursor
}

// openTxn starts a tenure's exactly-once side, before it takes its cursor rows: it fences the
// shard's transactional id (which ends a previous holder's open transaction and refuses its
// commits) and those of the table's earlier layouts (after a reshard: a relay of the old layout
// cut off without knowing it commits nothing more), then reads the committed cursor records of
// the table, to the end: its shard's, reconciled once the cursor rows are taken (reconcileTxn),
// and the earlier layouts', which the database's cursor rows adopt where they are ahead before
// any is split or merged (absorbLayouts).
func (r *Relay) openTxn(conn *pgx.Conn, ten *tenure) (*txnStart, error) {
	ctx, cancel := context.WithTimeout(context.Background(), txnStartTimeout)
	defer cancel()
	var sys string
	if err := conn.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sys); err != nil {
		return nil, err
	}
	count := max(ten.count, 1)
	prefix := txnTablePrefix(sys, r.cfg.Table.String())
	shard := txnShardID(sys, r.cfg.Table.String(), ten.gen, int(ten.buckets[0])%count, count)
	p, err := newTxnProducer(r.cfg.Kafka, r.cfg.Compression, shard)
	if err != nil {
		return nil, err
	}
	s := &txnStart{t: &txnTrack{p: p, shard: shard, parked: map[int64]time.Time{}, unparked: map[int64]struct{}{}, dead: map[int64]txnDead{}}}
	if err := s.read(ctx, r, prefix, ten.gen); err != nil {
		p.close()
		return nil, err
	}
	return s, nil
}

func (s *txnStart) read(ctx context.Context, r *Relay, prefix string, gen int64) error {
	if err := s.t.p.fence(ctx); err != nil {
		return err
	}
	fenced, err := fenceLayouts(ctx, r.cfg.Kafka, prefix, gen)
	if err != nil {
		return err
	}
	got, err := readCursors(ctx, r.cfg.Kafka, r.cfg.CursorTopic, func(key string) bool {
		g, ok := txnGeneration(prefix, key)
		return key == s.t.shard || ok && g < gen
	})
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		// Not ready, saying what to do, until it exists (each tenure's start looks again).
		return &errCursor{msg: fmt.Sprintf("exactly-once: the cursor topic %s does not exist: create it with cleanup.policy=compact, "+
			"or let the operator create it (spec.kafka.topics.policy: Create)", r.cfg.CursorTopic)}
	}
	if err != nil {
		return err
	}
	for key, v := range got {
		rec, err := decodeCursor(key, v)
		if err != nil {
			return &errCursor{msg: "exactly-once: " + err.Error()}
		}
		if key == s.t.shard {
			s.own = &rec
		} else {
			s.old = append(s.old, rec)
		}
	}
	if len(fenced) > 0 || len(s.old) > 0 {
		r.log.Info("exactly-once: fenced the transactional ids of the table's earlier layouts and read their cursor records",
			"transactional_id", s.t.shard, "fenced", len(fenced), "records", len(s.old))
	}
	return nil
}

// absorbLayouts, in the transaction that takes a tenure's cursor rows and under the cursor
// table's lock, makes the database's cursor rows (all of the table's) follow the earlier
// layouts' committed records where those are ahead (an earlier layout's shard ended between a
// commit and the database's copy), with the parks those records carry, and deletes from the
// parked table the events they say were published from it. The first tenure of a new layout
// does it; the ones after find the rows current.
func (r *Relay) absorbLayouts(ctx context.Context, tx pgx.Tx, sql *cursorSQL, old []txnCursor) error {
	if len(old) == 0 {
		return nil
	}
	all := &tenure{buckets: make([]int16, outboxdb.Buckets)}
	for i := range all.buckets {
		all.buckets[i] = int16(i)
	}
	got, err := r.readCursorRows(ctx, tx, all, sql)
	if err != nil {
		return err
	}
	st := &snapState{q: newSnapQueries(r.cfg.Table, false, r.snapFetchSize())}
	for _, rd := range got {
		if rd.sameSystem && rd.forward { // the others stop the tenure that claims them (claimCursorRows)
			g := rd.g
			st.groups = append(st.groups, &g)
		}
	}
	adopt, from, _, err := reconcileCursor(st.groups, old)
	if err != nil {
		return &errCursor{msg: fmt.Sprintf("exactly-once: %v (the records of %s's earlier layouts)", err, r.cfg.Table)}
	}
	var pb pgx.Batch
	adoptPositions(st, adopt)
	r.queueCursorWrites(&pb, st, true, false)
	parked := 0
	for _, i := range from {
		parked += queuePark(&pb, st, old[i].Parked, nil)
	}
	unparked := 0
	for _, rec := range old {
		queueDead(&pb, st, rec.Dead) // whatever the positions say (reconcileTxn)
		if len(rec.Unparked) > 0 {
			pb.Queue(st.q.unpark, rec.Unparked)
			unparked += len(rec.Unparked)
		}
	}
	if pb.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, &pb).Close(); err != nil {
		return err
	}
	if len(adopt) > 0 {
		r.log.Info("exactly-once: the cursor records of the table's earlier layouts were ahead of the database's cursor rows; the database follows them",
			"rows", len(adopt), "parked", parked, "unparked", unparked)
	}
	return nil
}

// adoptPositions sets st's groups at the positions adopt gives them (by index), to be written.
func adoptPositions(st *snapState, adopt map[int]txnCursorGroup) {
	for i, k := range adopt {
		g := st.groups[i]
		g.snap = snapMark{text: k.Snap, floor: k.SnapFloor, ceil: -1}
		g.next = snapMark{text: k.Next, floor: k.NextFloor, ceil: k.NextCeil}
		g.last = k.Last
		g.dirty = true
	}
}

// queuePark queues the parking of rows (a cursor record's parks, which the database did not
// confirm) and returns how many; counted, when not nil, receives their aggregates.
func queuePark(pb *pgx.Batch, st *snapState, rows []txnRow, counted map[string]int) int {
	if len(rows) == 0 {
		return 0
	}
	ids, created, attempts, errs := make([]int64, 0, len(rows)), make([]time.Time, 0, len(rows)), make([]int32, 0, len(rows)), make([]string, 0, len(rows))
	for _, p := range rows {
		ids, created, attempts, errs = append(ids, p.ID), append(created, p.Created), append(attempts, 0), append(errs, heldBack)
	}
	q := pb.Queue(st.q.park, ids, created, attempts, errs)
	if counted != nil {
		q.Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var agg string
				if err := rows.Scan(&agg); err != nil {
					return err
				}
				counted[agg]++
			}
			return rows.Err()
		})
	}
	return len(rows)
}

// queueDead queues the recording of dead letters (a cursor record's, which the database did not
// confirm; recorded once whatever happens to be there already).
func queueDead(pb *pgx.Batch, st *snapState, dead []txnDead) {
	if len(dead) == 0 {
		return
	}
	ids, events, aggs, errs := make([]int64, 0, len(dead)), make([]string, 0, len(dead)), make([]string, 0, len(dead)), make([]string, 0, len(dead))
	for _, d := range dead {
		ids, events, aggs, errs = append(ids, d.ID), append(events, d.EventID), append(aggs, d.AggID), append(errs, d.Error)
	}
	pb.Queue(st.q.deadLettered, ids, events, aggs, errs)
}

// reconcileTxn reconciles the tenure's cursor rows, once taken, with its shard's committed
// record: a record ahead of them (a crash between a commit and the database's copy) is written
// to them, with the parks and unparks it carries.
func (r *Relay) reconcileTxn(conn *pgx.Conn, t *txnTrack, st *snapState, rec *txnCursor) error {
	if rec == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	adopt, from, behind, err := reconcileCursor(st.groups, []txnCursor{*rec}) // behind: the database published at-least-once since
	if err != nil {
		return &errCursor{msg: fmt.Sprintf("exactly-once: %v (shard %s)", err, t.shard)}
	}
	var pb pgx.Batch
	if behind && len(adopt) == 0 {
		r.log.Info("exactly-once: the database's cursor is past the shard's cursor record (published at-least-once since); it stands",
			"transactional_id", t.shard)
	} else {
		adoptPositions(st, adopt)
		r.queueCursorWrites(&pb, st, true, false)
		if len(from) > 0 {
			queuePark(&pb, st, rec.Parked, st.parked)
		}
		if len(rec.Unparked) > 0 {
			pb.Queue(st.q.unpark, rec.Unparked).Query(func(rows pgx.Rows) error { return r.unparked(st, rows) })
		}
	}
	// The record's dead letters are on the dead-letter topic, committed, whether or not its
	// position is ahead: a batch read from the parked table moves no position, so a relay that
	// ended between its commit and the database's copy left a record level with the database and
	// its dead letters unrecorded (9 of 506 in a run of TestExactlyOnceCrash).
	queueDead(&pb, st, rec.Dead)
	if pb.Len() == 0 {
		return nil
	}
	if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
		return err
	}
	if len(adopt) > 0 || len(rec.Unparked) > 0 {
		r.log.Info("exactly-once: the shard's cursor record was ahead of the database's; the database follows it",
			"transactional_id", t.shard, "groups", len(adopt), "parked", len(rec.Parked), "unparked", len(rec.Unparked), "dead_lettered", len(rec.Dead))
	}
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
	for _, d := range t.dead {
		tb.dead = append(tb.dead, d)
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
	for _, d := range b.txn.newDead {
		t.dead[d.ID] = d
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
		for _, d := range b.txn.newDead {
			delete(t.dead, d.ID)
		}
	}
}

// end closes the tenure's producer.
func (t *txnTrack) end() { t.p.close() }
