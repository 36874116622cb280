package relay

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// cursorWriteEvery bounds how often a cursor that moved past empty batches only is written:
// an idle relay does not write its cursor on every poll.
const cursorWriteEvery = time.Second

// heldBack is the error recorded for a parked event that did not fail itself.
const heldBack = "held back: an earlier event of its aggregate is parked"

// snapRoundTrip sends, in one round trip and one implicit transaction on the lock connection,
// the outcome of the batches in record (parked events and cursor positions) and the step's
// fetch into into.
func (r *Relay) snapRoundTrip(conn *pgx.Conn, ten *tenure, st *snapState, record []*batch, step snapStep, due []string, into *batch) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	var pb pgx.Batch
	write := false
	for _, b := range record {
		if r.queueSnapRecord(&pb, st, b) {
			write = true
		}
	}
	r.queueCursorWrites(&pb, st, write, false)
	var merged func()
	if st.merging {
		ids := make([]int64, len(st.groups))
		for i, g := range st.groups {
			ids[i] = g.id
		}
		var id int64
		pb.Queue(r.curSQL.merge, ids, ten.buckets, st.target).QueryRow(func(row pgx.Row) error { return row.Scan(&id) })
		target := st.target
		merged = func() {
			st.groups = []*cursorGroup{{id: id, buckets: ten.buckets, snap: target, writtenAt: time.Now()}}
			st.target, st.merging, st.rng = "", false, nil
			r.log.Info("the shard's cursor rows stand at one snapshot: merged them", "rows", len(ids))
		}
	}
	wakeDone := r.queueWake(&pb, step != stepNone)
	switch step {
	case stepOpen:
		g, from, _, resume, args := st.openArgs()
		if ten.count > 1 {
			args = append(args, g.buckets)
		}
		pb.Queue(st.q.open, args...).QueryRow(func(row pgx.Row) error {
			rng, err := scanRange(row, g, from, resume)
			if err != nil {
				return err
			}
			st.rng = rng
			if rng.done { // empty: the cursor moves to its snapshot once the batches before are recorded
				into.pos = snapPos{g: g, from: from, to: rng.to, complete: true}
			}
			return nil
		})
	case stepChunk:
		rng := st.rng
		var (
			sql  string
			args []any
		)
		if rng.from == "" {
			sql, args = st.q.first, []any{rng.to, rng.last, rng.hi}
		} else {
			sql, args = st.q.fetch, []any{rng.to, rng.last, rng.lo, rng.hi, rng.xmax}
		}
		if ten.count > 1 {
			args = append(args, rng.g.buckets)
		}
		size := r.snapFetchSize()
		open := 0 // rows of the transactions open at from, fetched first
		if len(rng.xip) > 0 {
			oargs := []any{rng.to, rng.last, rng.xip}
			if ten.count > 1 {
				oargs = append(oargs, rng.g.buckets)
			}
			pb.Queue(st.q.fetchOpen, oargs...).Query(func(rows pgx.Rows) error {
				err := scanInto(rows, into)
				open = len(into.rows)
				return err
			})
		}
		pb.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			if err := scanInto(rows, into); err != nil {
				return err
			}
			// Either part may have more rows past its limit: the batch is done only when both
			// together returned fewer than a fetch.
			full := len(into.rows) >= size
			if open > 0 {
				slices.SortFunc(into.rows, func(a, b row) int { return cmp.Compare(a.id, b.id) })
				if len(into.rows) > size {
					into.rows = into.rows[:size] // the rest comes with the next fetch
				}
			}
			if n := len(into.rows); n > 0 {
				rng.last = into.rows[n-1].id
			}
			rng.done = !full
			into.pos = snapPos{g: rng.g, from: rng.from, to: rng.to, last: rng.last, complete: rng.done}
			return nil
		})
		if st.target == "" && rng.hi-rng.last <= int64(r.snapFetchSize()) {
			// This fetch probably ends the batch: open the next one in the same round trip, so
			// that it is fetched while this one is published. Used only if the fetch did end the
			// batch and the next one has events.
			args := []any{rng.to, nil}
			if ten.count > 1 {
				args = append(args, rng.g.buckets)
			}
			pb.Queue(st.q.open, args...).QueryRow(func(row pgx.Row) error {
				next, err := scanRange(row, rng.g, rng.to, 0)
				if err != nil {
					return err
				}
				if rng.done && !next.done {
					st.rng = next
				}
				return nil
			})
		}
	case stepParked:
		pb.Queue(st.q.parkedFetch, due).Query(func(rows pgx.Rows) error {
			if err := scanInto(rows, into); err != nil {
				return err
			}
			into.pos = snapPos{g: st.groups[0], parked: true}
			if len(into.rows) < r.snapFetchSize() {
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
	if pb.Len() == 0 {
		return nil
	}
	if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
		return err
	}
	wakeDone()
	if merged != nil {
		merged()
	}
	return nil
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
// written now: a batch from the stream parks the events it did not publish; a batch of parked
// events deletes those it published and records the failures of the others.
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
			pb.Queue(st.q.unpark, sent).Query(func(rows pgx.Rows) error { return r.countParked(st, rows, -1) })
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
	return len(b.rows) > 0 && slices.Contains(st.groups, b.pos.g)
}

// queueCursorWrites writes the position of every group that moved: at once when now, else
// when it last wrote more than cursorWriteEvery ago.
func (r *Relay) queueCursorWrites(pb *pgx.Batch, st *snapState, now, force bool) {
	t := time.Now()
	for _, g := range st.groups {
		if !g.dirty || !now && !force && t.Sub(g.writtenAt) < cursorWriteEvery {
			continue
		}
		pb.Queue(st.q.advance, g.id, nullable(g.snap), nullable(g.next), g.last)
		g.dirty, g.writtenAt = false, t
	}
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
// resume) to the snapshot it took, done when it holds no event.
func scanRange(row pgx.Row, g *cursorGroup, from string, resume int64) (*snapRange, error) {
	var (
		to                   string
		lo, hi, aLo, firstHi *int64
	)
	if err := row.Scan(&to, &lo, &hi, &aLo, &firstHi); err != nil {
		return nil, err
	}
	rng := &snapRange{g: g, from: from, to: to, last: resume}
	if from == "" {
		rng.lo, rng.hi = 1, derefInt(firstHi, 0)
		rng.done = firstHi == nil || *firstHi <= rng.last
		return rng, nil
	}
	var err error
	if rng.xmax, rng.xip, err = parseSnapshot(from); err != nil {
		return nil, err
	}
	if lo == nil {
		rng.lo, rng.hi = 1, 0 // no transaction that began after from wrote an event
	} else {
		rng.lo, rng.hi = *lo, derefInt(hi, 0)
	}
	rng.done = lo == nil && aLo == nil
	return rng, nil
}
