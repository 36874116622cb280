package relay

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// cursorWriteEvery bounds how often a cursor that moved past empty batches only is written:
// an idle relay does not write its cursor on every poll.
const cursorWriteEvery = time.Second

// cursorFlushEvery bounds how often a cursor that moved past published events is written, and
// how long it may go unwritten: the writes of the batches within it are coalesced into one (at
// steady rates a cursor write per batch was most of the relay's transaction ids, WAL and dead
// tuples on the database). It is the most a crash of the relay (or a lost lock) can publish
// again, beside the batch in flight: the events published in the last cursorFlushEvery. A
// batch that parks or dead-letters events writes the cursor at once, in the same transaction
// as its park, and so does a relay that stops publishing (flushCursor).
const cursorFlushEvery = 100 * time.Millisecond

// heldBack is the error recorded for a parked event that did not fail itself.
const heldBack = outboxdb.HeldBackError

// snapRoundTrip sends, in one round trip and one implicit transaction on the lock connection,
// the outcome of the batches in record (parked events and cursor positions) and the step's
// fetch into into.
func (r *Relay) snapRoundTrip(conn *pgx.Conn, ten *tenure, st *snapState, record []*batch, step snapStep, due []string, into *batch) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	var pb pgx.Batch
	sharded := st.sharded
	size := r.snapFetchSize()
	// A fetch that probably ends its batch opens the next one in the same round trip, so that it
	// is fetched while this one is published; used only if the fetch did end the batch and the
	// next one has events.
	speculate := step == stepChunk && st.target == "" && st.rng.hi-st.rng.last <= st.span(sharded, size)
	// The open statement comes before anything else in this transaction takes a transaction id
	// (openSQL) and answers the check of the session's mark: a statement fewer in most round
	// trips at steady rates, where every batch is opened. Only a claim to be woken comes before
	// it (it must precede the snapshot, and takes the id): the floor is then read first.
	opens := step == stepOpen || speculate
	claims := r.claims(step != stepNone)
	if claims && opens {
		pb.Queue(st.q.floor)
	}
	wakeDone := func() {}
	if claims {
		wakeDone = r.queueWake(&pb, true)
	}
	var same bool
	sessionDone := sessionChecked(&same)
	var next *snapRange // speculate: the batch after this one
	switch {
	case step == stepOpen:
		r.queueOpen(&pb, st, into, &same)
	case speculate:
		rng := st.rng
		args := []any{rng.to.text, nil, nullableMark(rng.to.floor), nil, nil}
		if sharded {
			args = append(args, rng.g.buckets)
		}
		pb.Queue(st.q.openFor(rng.to, false), append(args, r.session)...).QueryRow(func(row pgx.Row) error {
			var err error
			next, err = scanRange(row, rng.g, rng.to, 0, false, &same)
			return err
		})
	case step != stepNone:
		sessionDone = r.queueSessionCheck(&pb)
	default:
		sessionDone = func() error { return nil }
	}
	write := false
	for _, b := range record {
		if r.queueSnapRecord(&pb, st, b) {
			write = true
		}
	}
	r.queueCursorWrites(&pb, st, write, false)
	merged := r.queueMerge(&pb, ten, st)
	if !claims {
		wakeDone = r.queueWake(&pb, step != stepNone)
	}
	switch step {
	case stepChunk:
		r.queueChunk(&pb, st, into)
	case stepParked:
		r.queueParkedFetch(&pb, st, due, into)
	}
	if step != stepNone {
		r.queueLSN(&pb, into)
	}
	if pb.Len() == 0 {
		return nil
	}
	if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
		return err
	}
	if err := sessionDone(); err != nil {
		return err
	}
	if next != nil && st.rng.done && !next.done {
		st.rng = next // the fetch ended its batch, and the next one has events
	}
	wakeDone()
	if merged != nil {
		merged()
	}
	return nil
}

// queueMerge queues, when every cursor row of the tenure stands at the common target snapshot,
// the statement that merges them into one, and returns what applies the merge to st once the
// round trip succeeded (nil when there is nothing to merge).
func (r *Relay) queueMerge(pb *pgx.Batch, ten *tenure, st *snapState) func() {
	if !st.merging {
		return nil
	}
	ids := make([]int64, len(st.groups))
	for i, g := range st.groups {
		ids[i] = g.id
	}
	var id int64
	pb.Queue(st.cur.merge, ids, ten.buckets, st.target).QueryRow(func(row pgx.Row) error { return row.Scan(&id) })
	target := st.target
	return func() {
		st.groups = []*cursorGroup{{id: id, buckets: ten.buckets, snap: unmarked(target), writtenAt: time.Now()}}
		st.target, st.merging, st.rng = "", false, nil
		if ten.count == 1 {
			st.setQueries(r, false) // the shard holds every bucket: no filter
		}
		r.log.Info("the shard's cursor rows stand at one snapshot: merged them", "rows", len(ids))
	}
}

// queueSnapRecord queues what b's outcome writes, and reports whether its cursor row must be
// written now, in the same transaction (it parked or dead-lettered events): a batch from the
// stream parks the events it did not publish; a batch of parked events deletes those it
// published and records the failures of the others. A batch that published all its events
// leaves its cursor to the next write due (cursorFlushEvery).
func (r *Relay) queueSnapRecord(pb *pgx.Batch, st *snapState, b *batch) bool {
	if b.pos.g == nil || b.pos.noAdvance {
		return false
	}
	var dIDs []int64
	var dEvents, dAggs, dErrs []string
	for i := range b.rows {
		if row := &b.rows[i]; row.state == rowDeadSent {
			dIDs = append(dIDs, row.id)
			dEvents = append(dEvents, string(row.eventID))
			dAggs = append(dAggs, string(row.aggID))
			dErrs = append(dErrs, row.errText)
		}
	}
	if len(dIDs) > 0 {
		pb.Queue(st.q.deadLettered, dIDs, dEvents, dAggs, dErrs)
	}
	if b.pos.parked {
		var (
			sent  []int64
			fIDs  []int64
			fInc  []int32
			fErrs []string
		)
		for i := range b.rows {
			row := &b.rows[i]
			switch row.state {
			case rowSent, rowDeadSent:
				sent = append(sent, row.id)
			case rowFailed:
				fIDs = append(fIDs, row.id)
				fInc = append(fInc, row.inc)
				fErrs = append(fErrs, row.errText)
			}
		}
		if len(sent) > 0 {
			pb.Queue(st.q.unpark, sent).Query(func(rows pgx.Rows) error { return r.unparked(st, rows) })
		}
		if len(fIDs) > 0 {
			pb.Queue(st.q.parkedRecord, fIDs, fInc, fErrs)
		}
		return false
	}
	var (
		ids      []int64
		created  []time.Time
		attempts []int32
		errs     []string
	)
	for i := range b.rows {
		row := &b.rows[i]
		if row.state == rowSent || row.state == rowDeadSent {
			continue
		}
		ids = append(ids, row.id)
		created = append(created, row.createdAt)
		attempts = append(attempts, row.attempts+row.inc)
		msg := row.errText
		if msg == "" {
			msg = heldBack
		}
		errs = append(errs, msg)
	}
	if len(ids) > 0 {
		pb.Queue(st.q.park, ids, created, attempts, errs) // counted when the batch settled (snapSettled)
		r.log.Warn("parked events: they and the later events of their aggregates are retried from the parked table",
			"events", len(ids), "first_id", ids[0], "first_error", errs[0])
	}
	// A batch carried over from an earlier tenure parks its rows but no longer moves a cursor.
	return (len(ids) > 0 || len(dIDs) > 0) && slices.Contains(st.groups, b.pos.g)
}

// queueCursorWrites writes the position of every group that moved: at once when now or force,
// else when it last wrote more than cursorFlushEvery ago (past events) or cursorWriteEvery ago
// (past empty batches only).
func (r *Relay) queueCursorWrites(pb *pgx.Batch, st *snapState, now, force bool) {
	t := time.Now()
	for _, g := range st.groups {
		if !g.dirty || !now && !force && t.Before(g.writeDue()) {
			continue
		}
		pb.Queue(st.q.advance, g.id, nullable(g.snap.text), nullable(g.next.text), g.last,
			nullableMark(g.snap.floor), nullableMark(g.next.floor), nullableMark(g.next.ceil))
		g.dirty, g.events, g.writtenAt = false, false, t
	}
}

// writeDue is when g's position, if it moved, is to be written.
func (g *cursorGroup) writeDue() time.Time {
	if g.events {
		return g.writtenAt.Add(cursorFlushEvery)
	}
	return g.writtenAt.Add(cursorWriteEvery)
}

// flushBy is when the earliest position that moved past published events is to be written
// (zero when none is): an idle relay wakes for it, so that the cursor, and what the database
// says is pending, follow the published events within cursorFlushEvery.
func (st *snapState) flushBy() time.Time {
	var by time.Time
	for _, g := range st.groups {
		if g.dirty && g.events && (by.IsZero() || g.writeDue().Before(by)) {
			by = g.writeDue()
		}
	}
	return by
}

// flushCursor writes the positions not written yet, when the relay stops publishing.
func (r *Relay) flushCursor(conn *pgx.Conn, st *snapState) error {
	var pb pgx.Batch
	r.queueCursorWrites(&pb, st, false, true)
	if pb.Len() == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	return conn.SendBatch(ctx, &pb).Close()
}
