package relay

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// queueOpen queues the statement that opens the next batch of the active group (it checks the
// session's mark into same) and, when its bounds are known, the fetch of its first rows in the
// same round trip.
func (r *Relay) queueOpen(pb *pgx.Batch, st *snapState, into *batch, same *bool) {
	sharded, size := st.sharded, r.snapFetchSize()
	g, from, resume, targeted, args := st.openArgs()
	if sharded {
		args = append(args, g.buckets)
	}
	fused := !targeted && from.text != "" && from.floor >= 0
	pb.Queue(st.q.openFor(from, fused), append(args, r.session)...).QueryRow(func(row pgx.Row) error {
		rng, err := scanRange(row, g, from, resume, fused, same)
		if err != nil {
			return err
		}
		st.rng = rng
		if rng.done { // empty: the cursor moves to its snapshot once the batches before are recorded
			into.pos = snapPos{g: g, from: from, to: rng.to, complete: true}
		}
		return nil
	})
	if fused {
		// The batch's bounds are known but for the new snapshot and its ceiling, which the
		// open statement leaves in the session: its first rows come in this round trip.
		r.queueFusedFetch(pb, st, g, from, resume, into, sharded, size)
	}
}

// queueChunk queues the fetch of the next rows of the batch being fetched (st.rng): first the
// events of the transactions in progress at its start, up to the bound, then by id.
func (r *Relay) queueChunk(pb *pgx.Batch, st *snapState, into *batch) {
	sharded, size := st.sharded, r.snapFetchSize()
	rng := st.rng
	if rng.from.text != "" && rng.last < rng.bound {
		// The events of the transactions in progress at from, up to the bound.
		args := []any{rng.to.text, rng.last, rng.xip, rng.bound}
		if sharded {
			args = append(args, rng.g.buckets)
		}
		pb.Queue(st.q.fetchOpen, args...).Query(func(rows pgx.Rows) error {
			if err := scanInto(rows, into); err != nil {
				return err
			}
			st.endChunk(rng, into, rng.bound, false, len(rng.xip) > 1, size)
			return nil
		})
		return
	}
	upTo := rng.hi
	if sharded {
		upTo = min(rng.hi, rng.last+st.win) // the window this fetch reads
	}
	sql, args := st.q.fetch, []any{rng.to.text, rng.last, rng.bound, upTo, rng.from.text}
	if rng.from.text == "" {
		sql, args = st.q.first, []any{rng.to.text, rng.last, upTo}
	}
	if sharded {
		args = append(args, rng.g.buckets)
	}
	pb.Queue(sql, args...).Query(func(rows pgx.Rows) error {
		if err := scanInto(rows, into); err != nil {
			return err
		}
		st.endChunk(rng, into, upTo, sharded, sharded, size)
		return nil
	})
}

// queueParkedFetch queues the fetch of the parked events of the aggregates due.
func (r *Relay) queueParkedFetch(pb *pgx.Batch, st *snapState, due []string, into *batch) {
	size := r.snapFetchSize()
	pb.Queue(st.q.parkedFetch, due).Query(func(rows pgx.Rows) error {
		if err := scanInto(rows, into); err != nil {
			return err
		}
		into.pos = snapPos{g: st.groups[0], parked: true}
		if len(into.rows) < size {
			// Every parked event of these aggregates is here: one with none left (its count
			// ran ahead of the table, e.g. a park that met a row parked before) is not parked.
			found := map[string]bool{}
			for i := range into.rows {
				found[string(into.rows[i].aggID)] = true
			}
			for _, agg := range due {
				if !found[agg] {
					delete(st.parked, agg)
				}
			}
			r.metrics.parked.Set(float64(len(st.parked)))
		}
		return nil
	})
}

// queueFusedFetch queues the first fetch of the batch the open statement before it opens from
// from: the same statements as a chunk's, reading the new snapshot and its ceiling from the
// session (snapQueries.fetchFused).
func (r *Relay) queueFusedFetch(pb *pgx.Batch, st *snapState, g *cursorGroup, from snapMark, resume int64, into *batch, sharded bool, size int) {
	_, xip, err := parseSnapshot(from.text)
	if err != nil {
		return // the open statement reports it
	}
	bound := from.floor
	open := 0 // rows of the transactions in progress at from, up to the bound
	if len(xip) > 0 && resume < bound {
		args := []any{resume, xip, bound}
		if sharded {
			args = append(args, g.buckets)
		}
		pb.Queue(st.q.fetchOpenFused, args...).Query(func(rows pgx.Rows) error {
			err := scanInto(rows, into)
			open = len(into.rows)
			return err
		})
	}
	var window any // unsharded: up to the ceiling
	if sharded {
		window = max(resume, bound) + st.win
	}
	args := []any{max(resume, bound), window, from.text}
	if sharded {
		args = append(args, g.buckets)
	}
	pb.Queue(st.q.fetchFused, args...).Query(func(rows pgx.Rows) error {
		if err := scanInto(rows, into); err != nil {
			return err
		}
		rng := st.rng
		switch {
		case rng == nil || rng.done:
			into.rows = into.rows[:0] // none: the batch is empty
		case open >= size:
			// The first part fills the fetch: the second is read again after it.
			into.rows = into.rows[:open]
			st.endChunk(rng, into, bound, false, len(xip) > 1, size)
		default:
			upTo := rng.hi
			if sharded {
				upTo = min(rng.hi, window.(int64))
			}
			st.endChunk(rng, into, upTo, sharded, true, size)
		}
		return nil
	})
}

// endChunk applies a fetch of rng's rows up to upTo, now in into, to rng and into. The rows
// come from parts (each bucket, each transaction in progress at from) that each returned their
// first rows, at most a fetch (sort: more than one part): the first fetch of them all, in id
// order, are the batch's next rows. With fewer, everything up to upTo is read.
func (st *snapState) endChunk(rng *snapRange, into *batch, upTo int64, window, sort bool, size int) {
	n := len(into.rows)
	if sort {
		slices.SortFunc(into.rows, func(a, b row) int { return cmp.Compare(a.id, b.id) })
	}
	if n >= size {
		into.rows = into.rows[:size] // the rest comes with the next fetch
		rng.last = into.rows[size-1].id
	} else {
		rng.last = max(rng.last, upTo)
	}
	if window {
		st.adaptWindow(n, size)
	}
	rng.done = rng.last >= rng.hi && rng.last >= rng.bound
	into.pos = snapPos{g: rng.g, from: rng.from, to: rng.to, last: rng.last, complete: rng.done}
}

func scanInto(rows pgx.Rows, into *batch) error {
	var fds []pgconn.FieldDescription
	for rows.Next() {
		if fds == nil {
			fds = rows.FieldDescriptions()
		}
		if err := into.scanRow(rows.RawValues(), fds); err != nil {
			return err
		}
	}
	return rows.Err()
}

func derefInt(p *int64, def int64) int64 {
	if p == nil {
		return def
	}
	return *p
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

// scanRange reads the row of the open statement: the batch of g from from (resuming after id
// resume) to the snapshot it took, done when it holds no event; and into same the check of the
// session's mark. fused: the statement was openFused, which does not look up the events of the
// transactions in progress at from; where there may be some, the fetch in its round trip tells
// whether the batch has events (queueFusedFetch).
func scanRange(row pgx.Row, g *cursorGroup, from snapMark, resume int64, fused bool, same *bool) (*snapRange, error) {
	var (
		to                            string
		floor, ceil, lo, aLo, firstLo *int64
		set                           string // the session settings the fused fetch reads
	)
	if err := row.Scan(&to, &floor, &ceil, &lo, &aLo, &firstLo, &set, same); err != nil {
		return nil, err
	}
	rng := &snapRange{g: g, from: from, to: snapMark{text: to, floor: derefInt(floor, -1), ceil: derefInt(ceil, -1)}, last: resume}
	rng.hi = max(rng.to.ceil, 0)
	if from.text == "" {
		if firstLo != nil {
			rng.last = max(resume, *firstLo-1)
		}
		rng.done = firstLo == nil || rng.hi <= rng.last
		return rng, nil
	}
	var err error
	if _, rng.xip, err = parseSnapshot(from.text); err != nil {
		return nil, err
	}
	switch {
	case from.floor >= 0:
		rng.bound = from.floor
	case lo != nil: // floor(from) not known: below the lowest id of the transactions after from
		rng.bound = *lo - 1
	default: // no transaction that began after from wrote an event
		rng.bound = rng.hi
	}
	rng.bound = min(rng.bound, rng.hi)
	if fused && len(rng.xip) > 0 && resume < rng.bound {
		return rng, nil // not known: the fetch reads from resume
	}
	rng.done = rng.bound >= rng.hi && aLo == nil
	if !rng.done {
		start := rng.bound
		if aLo != nil && *aLo <= rng.bound {
			start = *aLo - 1
		}
		rng.last = max(resume, start)
	}
	return rng, nil
}

// span is how far past the last id read a fetch reads: sharded, the adapted window; unsharded,
// a fetch's worth of ids (for deciding whether a fetch probably ends its batch).
func (st *snapState) span(sharded bool, size int) int64 {
	if sharded {
		return st.win
	}
	return int64(size)
}

// adaptWindow widens the window of a sharded fetch that read few rows and narrows one that read
// more than a fetch, so that a window holds about a fetch of the shard's rows.
func (st *snapState) adaptWindow(n, size int) {
	switch {
	case n < size/4:
		st.win = min(st.win*4, 1<<40)
	case n > size*2:
		st.win = max(st.win/2, int64(size))
	}
}
