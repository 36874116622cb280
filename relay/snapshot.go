package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// Snapshot tracking (Config.Tracking = TrackSnapshot; docs/architecture.md "Tracking progress").
// The relay never updates an event row: it publishes the events committed between two
// snapshots, in id order, and records its position in the cursor row of its buckets once the
// broker has acknowledged a batch, on the lock connection that holds the buckets' locks. An
// event that cannot be published, and every later event of its aggregate, is parked: copied to
// <table>_parked in the same transaction that moves the cursor past it, and retried from there
// with backoff while the shard goes on.

// cursorGroup is one cursor row of the tenure: its buckets and its recorded position. A tenure
// has one; right after a reshard it may have several (the parts of the old layout's rows), which
// it brings to one common snapshot and merges.
type cursorGroup struct {
	id      int64
	buckets []int16
	// The position (see the cursor table): snap "" is NULL (before the first batch), next "" is
	// NULL (between batches).
	snap, next snapMark
	last       int64
	// dirty: the position moved and is not written yet; events: past published events too (not
	// only empty batches), so it is written within cursorFlushEvery (snapshot_record.go).
	dirty, events bool
	writtenAt     time.Time
}

// at reports whether the group stands at the target snapshot, between batches.
func (g *cursorGroup) at(target string) bool { return g.next.text == "" && g.snap.text == target }

// snapMark is a snapshot in text form ("" for none) with the values of the id sequence around it
// (migration 00008_shard_reads.sql), -1 where not known: every event the snapshot shows
// committed has an id at or below ceil; every event of a transaction at or above the snapshot's
// xmax (widened by the relay to the next transaction id) has an id above floor.
type snapMark struct {
	text        string
	floor, ceil int64
}

func unmarked(text string) snapMark { return snapMark{text: text, floor: -1, ceil: -1} }

// nullableMark returns v for a statement argument, nil (NULL) when not known.
func nullableMark(v int64) any {
	if v < 0 {
		return nil
	}
	return v
}

// snapRange is the batch being fetched: the events of g committed in to and not in from.
//
// Its rows come in two parts, one after the other in id order: up to bound, the events of the
// transactions in progress at from (xip(from)), read by transaction id; above bound, every event
// from then on committed in to and not in from, read by id (bucket by bucket when sharded). The
// bound is floor(from): an event of a transaction that began after from has a higher id.
type snapRange struct {
	g        *cursorGroup
	from, to snapMark // from.text "" is the first batch
	xip      []string // xip(from)
	bound    int64
	hi       int64 // ceil(to): no row of the batch lies above
	last     int64 // every row of the batch up to this id is fetched
	done     bool  // every row fetched
}

// snapPos is where a fetched batch leaves its cursor row once it is recorded.
type snapPos struct {
	g        *cursorGroup
	from, to snapMark
	last     int64
	complete bool // the batch ends its range: the cursor moves to (to, between batches)
	parked   bool // the batch was read from the parked table
	// noAdvance: the batch was not published (every broker was unreachable); it is fetched again.
	noAdvance bool
}

// snapState is the snapshot tracking state of one tenure.
type snapState struct {
	cur    *cursorSQL // the cursor table's statements (snapMode's)
	q      snapQueries
	groups []*cursorGroup
	target string // the common snapshot the groups catch up to (len(groups) > 1)
	rng    *snapRange
	parked map[string]int // parked events per aggregate
	// sharded: the fetches read only the active group's buckets. A tenure of a layout of more
	// than one shard always is; one of a single shard is while its buckets come from several
	// cursor rows (after a reshard), each of which must read only its own buckets' events up to
	// the common snapshot: read unfiltered, every group would publish the others' events again.
	sharded bool
	// merging: every group stands at target; the next round trip merges them.
	merging bool
	// win is the width of the id window a sharded fetch reads (its buckets' rows only, bucket by
	// bucket): adapted so that a window holds about a fetch.
	win int64
}

// SnapshotFetchFactor: under snapshot tracking a round trip fetches up to this many times
// --batch-size events. Without a mark per row, a larger fetch costs PostgreSQL nothing more, and
// a batch is published (one produce request per partition at a time, acknowledged by the broker)
// before the next one starts, so fewer, larger batches spend less time waiting for the broker
// (measured on a 100k drain: 97k events/s with 500 per fetch, 130k with 2,000).
const SnapshotFetchFactor = 4

func (r *Relay) snapFetchSize() int { return SnapshotFetchFactor * r.cfg.BatchSize }

// setQueries sets whether st's fetches read only the active group's buckets, and its statements.
func (st *snapState) setQueries(r *Relay, sharded bool) {
	st.sharded, st.q = sharded, newSnapQueries(r.cfg.Table, sharded, r.snapFetchSize())
}

// errCursor is a cursor that cannot be trusted: the relay stops publishing and says why.
type errCursor struct{ msg string }

func (e *errCursor) Error() string { return e.msg }

// takeCursor sets up the cursor rows of ten's buckets, in one transaction under the cursor
// table's lock: the first snapshot relay of a table creates the row of every bucket; a relay
// whose buckets share a row with buckets it does not hold (after a reshard) splits that row.
// It then loads the parked aggregates of its buckets. first, when not nil, runs in that
// transaction before the rows are read (exactly-once: absorbLayouts).
func (r *Relay) takeCursor(conn *pgx.Conn, ten *tenure, sql *cursorSQL, first func(context.Context, pgx.Tx) error) (*snapState, error) {
	// Not the tenure's context: a stand-down requested meanwhile is seen by the pump.
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	st := &snapState{cur: sql, parked: map[string]int{},
		win: int64(r.snapFetchSize()) * outboxdb.Buckets / int64(max(len(ten.buckets), 1))}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sql.lock); err != nil {
			return err
		}
		var cache int64
		if err := tx.QueryRow(ctx, sql.seqCache).Scan(&cache); err != nil {
			return err
		}
		if cache > 1 {
			// Each session would draw ids from its own cached range: ids would no longer follow
			// the order in which they are drawn, which per-aggregate order and the id bounds of
			// a batch rely on.
			return &errCursor{msg: fmt.Sprintf("the id sequence of %s caches %d values per session: snapshot tracking needs "+
				"ids drawn in order; run ALTER SEQUENCE %s CACHE 1", r.cfg.Table, cache, r.cfg.Table.Derived("id_seq"))}
		}
		if _, err := tx.Exec(ctx, sql.init); err != nil {
			return err
		}
		if first != nil {
			if err := first(ctx, tx); err != nil {
				return err
			}
		}
		got, err := r.readCursorRows(ctx, tx, ten, sql)
		if err != nil {
			return err
		}
		st.groups, err = r.claimCursorRows(ctx, tx, ten, sql, got)
		return err
	})
	if err != nil {
		return nil, err
	}
	st.setQueries(r, ten.count > 1 || len(st.groups) > 1)
	if len(st.groups) > 1 {
		// Bring every part to one snapshot taken now (after each part's own), then merge.
		if err := conn.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&st.target); err != nil {
			return nil, err
		}
		r.log.Info("the shard's buckets come from several cursor rows (a reshard): bringing them to one snapshot",
			"rows", len(st.groups))
	}
	if err := r.loadParked(ctx, conn, st, ten); err != nil {
		return nil, err
	}
	return st, nil
}

// cursorRead is a cursor row as takeCursor reads it, with whether it belongs to this cluster and
// does not lie ahead of its transaction ids.
type cursorRead struct {
	g                   cursorGroup
	sameSystem, forward bool
}

// readCursorRows reads the cursor rows that hold ten's buckets.
func (r *Relay) readCursorRows(ctx context.Context, tx pgx.Tx, ten *tenure, sql *cursorSQL) ([]cursorRead, error) {
	rows, err := tx.Query(ctx, sql.read, ten.buckets)
	if err != nil {
		return nil, err
	}
	var got []cursorRead
	for rows.Next() {
		var (
			rd                             cursorRead
			snap, next                     *string
			snapFloor, nextFloor, nextCeil *int64
		)
		if err := rows.Scan(&rd.g.id, &rd.g.buckets, &snap, &next, &rd.g.last, &rd.sameSystem, &rd.forward,
			&snapFloor, &nextFloor, &nextCeil); err != nil {
			rows.Close()
			return nil, err
		}
		rd.g.snap = snapMark{text: derefStr(snap), floor: derefInt(snapFloor, -1), ceil: -1}
		rd.g.next = snapMark{text: derefStr(next), floor: derefInt(nextFloor, -1), ceil: derefInt(nextCeil, -1)}
		got = append(got, rd)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return got, nil
}

// claimCursorRows checks the cursor rows read (this cluster's, not ahead of it, covering every
// bucket of ten) and splits off, from a row shared with buckets ten does not hold (after a
// reshard), the part of ten's buckets: ten's groups.
func (r *Relay) claimCursorRows(ctx context.Context, tx pgx.Tx, ten *tenure, sql *cursorSQL, got []cursorRead) ([]*cursorGroup, error) {
	var groups []*cursorGroup
	covered := map[int16]bool{}
	mine := map[int16]bool{}
	for _, b := range ten.buckets {
		mine[b] = true
	}
	for _, rd := range got {
		if !rd.sameSystem || !rd.forward {
			return nil, &errCursor{msg: fmt.Sprintf("the snapshot cursor of %s belongs to another database or to a point in its past "+
				"(a restore from a dump, another cluster or a point-in-time recovery): transaction ids no longer compare, so the relay "+
				"stops rather than skip or replay events. Reset the cursor with `relay cursor reset --table %s --to now --reason ...` "+
				"(publishes only events committed from now on) or `--to oldest` (publishes every retained event again)",
				r.cfg.Table, r.cfg.Table)}
		}
		g := rd.g
		var ours, theirs []int16
		for _, b := range g.buckets {
			if mine[b] {
				ours = append(ours, b)
				covered[b] = true
			} else {
				theirs = append(theirs, b)
			}
		}
		if len(theirs) > 0 {
			if err := tx.QueryRow(ctx, sql.split, g.id, ours).Scan(&g.id); err != nil {
				return nil, err
			}
			g.buckets = ours
		}
		groups = append(groups, &g)
	}
	if len(covered) != len(ten.buckets) {
		return nil, &errCursor{msg: fmt.Sprintf("the snapshot cursor of %s covers %d of this shard's %d buckets "+
			"(rows of %s were deleted by hand?): reset it with `relay cursor reset --table %s`",
			r.cfg.Table, len(covered), len(ten.buckets), r.cfg.Table.Derived("relay_cursor"), r.cfg.Table)}
	}
	return groups, nil
}

// loadParked loads the parked aggregates of ten's buckets into st.
func (r *Relay) loadParked(ctx context.Context, conn *pgx.Conn, st *snapState, ten *tenure) error {
	rows, err := conn.Query(ctx, st.q.parkedLoad, ten.buckets)
	if err != nil {
		return err
	}
	for rows.Next() {
		var agg string
		var n int
		if err := rows.Scan(&agg, &n); err != nil {
			rows.Close()
			return err
		}
		st.parked[agg] = n
	}
	if err := rows.Err(); err != nil {
		return err
	}
	r.metrics.parked.Set(float64(len(st.parked)))
	return nil
}

func derefStr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// needsSnapRecord reports whether a batch in bs writes something.
func needsSnapRecord(bs []*batch) bool {
	for _, b := range bs {
		if len(b.rows) > 0 && !b.pos.noAdvance {
			return true
		}
	}
	return false
}

// snapSettle settles a published batch (settle) and applies it to the tenure's state.
func (r *Relay) snapSettle(st *snapState, b *batch) (failed map[string]struct{}, outage bool) {
	failed, outage = r.settle(b)
	if outage {
		b.pos.noAdvance = true
	}
	r.snapSettled(st, b)
	return failed, outage
}

// snapSettled applies a settled batch of the stream to its group's position, in batch order;
// the round trip that follows writes it. The aggregates of the rows it parks count as parked at
// once, before that round trip: the next batch, prepared before it, must hold their later events
// back too (a parked retry may just have emptied the aggregate's parked events).
func (r *Relay) snapSettled(st *snapState, b *batch) {
	if b.pos.g == nil || b.pos.noAdvance || b.pos.parked {
		return
	}
	for i := range b.rows {
		if row := &b.rows[i]; row.state != rowSent && row.state != rowDeadSent {
			st.parked[string(row.aggID)]++
		}
	}
	r.metrics.parked.Set(float64(len(st.parked)))
	g := b.pos.g
	if b.pos.complete {
		g.snap, g.next, g.last = b.pos.to, unmarked(""), 0
	} else {
		g.snap, g.next, g.last = b.pos.from, b.pos.to, b.pos.last
	}
	g.dirty = true
	if len(b.rows) > 0 {
		g.events = true
	}
	if st.target != "" && st.active() == nil {
		st.merging = true
	}
}

// unparked applies the aggregates of rows unparked to st: one parked event fewer for each.
func (r *Relay) unparked(st *snapState, rows pgx.Rows) error {
	for rows.Next() {
		var agg string
		if err := rows.Scan(&agg); err != nil {
			return err
		}
		if st.parked[agg]--; st.parked[agg] <= 0 {
			delete(st.parked, agg)
		}
	}
	r.metrics.parked.Set(float64(len(st.parked)))
	return rows.Err()
}
