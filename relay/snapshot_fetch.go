// Snapshot tracking's fetches (snapshot.go): the statements that open a batch and fetch its rows,
// chunk by chunk, or the parked events due, queued in a round trip (snapRoundTrip,
// snapshot_record.go), and the reading of their results.

package relay

import (
	"cmp"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

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
