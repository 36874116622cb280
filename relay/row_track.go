// Row tracking (Config.Tracking = TrackRow; docs/architecture.md "Tracking progress"): the
// relay marks each published row sent (sent_at) and records the attempts and error of the others,
// in the round trip that fetches the next batch. rowTracker is the publish loop's tracker for it
// (loop.go); row_resume.go keeps where the next fetch reads from.

package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// rowTracker tracks progress by row for one tenure: pos is where the next fetch reads from.
type rowTracker struct {
	r    *Relay
	mode *rowMode
	pos  *resume
	// dropped is the batch the last fetch read whose rows below the floors filled it: not to be
	// published (resume.afterFetch).
	dropped *batch
	quiet   quietPolls
}

// quietPolls is the standing of the quiet check (rowTracker.quietPoll) of a relay that polls.
type quietPolls struct {
	checked bool // the fetch of this round trip follows a check that saw the snapshot move
	misses  int  // checks in a row that saw it move, and the fetch after each found nothing
	skip    int  // polls left that fetch without a check
}

// quietMisses and quietSkip: on a database busy with other work, where the snapshot moves between
// every two polls though nothing comes for this table, a check that is never quiet is one
// statement more per poll; after quietMisses of them in a row the relay polls without checking
// for quietSkip polls, then tries again.
const (
	quietMisses = 3
	quietSkip   = 64
)

// quietSQL is the quiet check: the current snapshot, and the check of the session's mark ($1).
var quietSQL = `SELECT pg_catalog.pg_current_snapshot()::text, ` + sessionMarked("$1")

// quietPoll reports, for an idle poll of a relay that polls, whether nothing can have changed
// since the last fetch: no transaction that held a transaction id has ended since its snapshot
// (the current snapshot is the same, in its text: the same xmax, the same transactions in
// progress), so no row was committed, marked or set back since, and that fetch found everything
// the next would. One small statement (~70 us against ~300-500 us for the fetch of a shard, its
// plan over every partition and index, measured on PostgreSQL 15) instead of the fetch.
func (t *rowTracker) quietPoll(conn *pgx.Conn, record []*batch, cur, into *batch) (bool, error) {
	if into == nil || len(record) > 0 || cur != nil || t.r.cfg.Notify {
		return false, nil // not an idle poll (a relay that listens learns of events otherwise)
	}
	if t.quiet.skip > 0 {
		t.quiet.skip--
		return false, nil
	}
	now := time.Now()
	t.pos.beforeFetch(now, t.r.blockedIDs(now))
	if t.pos.xmax == nil || t.pos.snap == "" {
		return false, nil // the fetch reads from the oldest unsent row: no quiet check stands for it
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.r.cfg.QueryTimeout)
	defer cancel()
	var snap string
	var same bool
	if err := conn.QueryRow(ctx, quietSQL, t.r.session).Scan(&snap, &same); err != nil {
		t.pos.reset()
		return false, err
	}
	if err := sessionChecked(&same)(); err != nil {
		t.pos.reset()
		return false, err
	}
	if snap == t.pos.snap {
		t.quiet.misses = 0
		t.r.metrics.quietPolls.Inc()
		return true, nil
	}
	t.quiet.checked = true
	return false, nil
}

// afterQuietCheck notes the outcome of a fetch that followed a quiet check that saw the
// snapshot move: found nothing (a miss), or found events.
func (t *rowTracker) afterQuietCheck(found bool) {
	if !t.quiet.checked {
		return
	}
	t.quiet.checked = false
	if found {
		t.quiet.misses = 0
		return
	}
	if t.quiet.misses++; t.quiet.misses >= quietMisses {
		t.quiet.misses, t.quiet.skip = 0, quietSkip
	}
}

// plan: every round fetches.
func (t *rowTracker) plan(*pgx.Conn, *batch, []*batch, time.Time) bool { return true }

func (t *rowTracker) mustRoundTrip(record []*batch) bool { return len(record) > 0 }

func (t *rowTracker) roundTrip(conn *pgx.Conn, ten *tenure, record []*batch, cur, into *batch) error {
	if quiet, err := t.quietPoll(conn, record, cur, into); err != nil || quiet {
		return err // quiet: into stays empty, the position as it was
	}
	order, err := t.r.roundTrip(conn, ten, t.pos, record, cur, into)
	if err == nil && into != nil {
		t.afterQuietCheck(len(into.rows) > 0)
		if !t.pos.afterFetch(into, order, t.r.cfg.BatchSize) {
			t.dropped = into
		}
		t.mode.floor.Store(t.pos.lowest(order))
	}
	return err
}

func (t *rowTracker) settle(b *batch) (map[string]struct{}, bool) { return t.r.settle(b) }

// take: a full batch means more rows wait; one whose rows below the floors filled it is not
// published, and the next fetch reads again from the oldest unsent row.
func (t *rowTracker) take(b *batch) (*batch, bool) {
	if b == nil {
		return nil, false
	}
	if b == t.dropped {
		t.dropped = nil
		t.r.putBatch(b)
		return nil, true
	}
	return b, len(b.rows) == t.r.cfg.BatchSize
}

// parked: row tracking parks nothing; a failed event stays in its row.
func (t *rowTracker) parked(*batch) map[string]int { return nil }

// prepared: a row held back here is below the floors the next fetch reads from.
func (t *rowTracker) prepared(b *batch) {
	if b.leftPending() {
		t.pos.reset()
	}
}

// unpublished: poison rows under block have attempts and an error to record.
func (t *rowTracker) unpublished(b *batch) bool {
	if b.hasOutcome() {
		b.settled = true
		return true
	}
	return false
}

func (t *rowTracker) needsRecord(record []*batch) bool { return needsRecord(record) }

func (t *rowTracker) reset() { t.pos.reset() }

func (t *rowTracker) idled() {}

// flushBy: row tracking records each batch as it settles; nothing waits to be written.
func (t *rowTracker) flushBy() time.Time { return time.Time{} }

func (t *rowTracker) stop(*pgx.Conn) error { return nil }

func needsRecord(bs []*batch) bool {
	for _, b := range bs {
		if b.hasOutcome() {
			return true
		}
	}
	return false
}

// roundTrip sends, in one round trip and one implicit transaction on the lock connection, the
// outcome of the batches in record and, when into is not nil, the fetch of the next batch from
// pos, from the buckets in the order it returns.
func (r *Relay) roundTrip(conn *pgx.Conn, ten *tenure, pos *resume, record []*batch, cur, into *batch) ([]int16, error) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	var pb pgx.Batch
	sessionDone := func() error { return nil }
	for _, b := range record {
		r.queueRecord(&pb, ten, b)
	}
	wakeDone := r.queueWake(&pb, into != nil)
	var order []int16
	if into != nil {
		var inflight []int64
		if cur != nil {
			inflight = cur.inflight
		}
		now := time.Now()
		blocked := r.blockedIDs(now)
		pos.beforeFetch(now, blocked)
		var same, positioned bool
		sessionDone = func() error {
			if !positioned {
				return errors.New("the fetch returned no position row")
			}
			return sessionChecked(&same)()
		}
		order = ten.fetchBuckets()
		sql, args := ten.q.fetchArgs(pos, order, inflight, blocked, r.session)
		pb.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			var fds []pgconn.FieldDescription
			for rows.Next() {
				if fds == nil {
					fds = rows.FieldDescriptions() // only valid once the query ran
				}
				vals := rows.RawValues()
				if len(vals) < positionColumns {
					return fmt.Errorf("fetch returned %d columns", len(vals))
				}
				data := len(vals) - positionColumns
				if vals[0] == nil { // the position row (withPosition)
					if err := scanPosition(vals[data:], fds[data:], pos, &same); err != nil {
						return err
					}
					positioned = true
					continue
				}
				if err := into.scanRow(vals[:data], fds[:data]); err != nil {
					return err
				}
			}
			return rows.Err()
		})
	}
	if into != nil {
		r.queueLSN(&pb, into)
	}
	if pb.Len() == 0 {
		return order, nil
	}
	if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
		pos.reset()
		return nil, err
	}
	if err := sessionDone(); err != nil {
		pos.reset()
		return nil, err
	}
	wakeDone()
	return order, nil
}

// queueRecord queues the statements that write b's outcome: sent_at for the acknowledged rows,
// attempts and error (and sent_at for dead-lettered ones) for the others. They are the same
// under every layout; ten is where the relay's statements live.
func (r *Relay) queueRecord(pb *pgx.Batch, ten *tenure, b *batch) {
	var (
		ids      []int64
		lo, hi   time.Time
		fIDs     []int64
		fCreated []time.Time
		fInc     []int32
		fErr     []string
		fSent    []bool
		fLo, fHi time.Time
	)
	for i := range b.rows {
		row := &b.rows[i]
		switch row.state {
		case rowSent:
			if len(ids) == 0 || row.createdAt.Before(lo) {
				lo = row.createdAt
			}
			if len(ids) == 0 || row.createdAt.After(hi) {
				hi = row.createdAt
			}
			ids = append(ids, row.id)
		case rowFailed, rowDeadSent:
			if len(fIDs) == 0 || row.createdAt.Before(fLo) {
				fLo = row.createdAt
			}
			if len(fIDs) == 0 || row.createdAt.After(fHi) {
				fHi = row.createdAt
			}
			fIDs = append(fIDs, row.id)
			fCreated = append(fCreated, row.createdAt)
			fInc = append(fInc, row.inc)
			fErr = append(fErr, row.errText)
			fSent = append(fSent, row.state == rowDeadSent)
		}
	}
	if len(ids) > 0 {
		want, retried := len(ids), b.retried
		pb.Queue(ten.q.mark, ids, lo, hi).Exec(func(ct pgconn.CommandTag) error {
			if n := int(ct.RowsAffected()); n != want && !retried {
				r.log.Warn("marked fewer rows sent than were acknowledged: the others were already sent (by a relay that ran before the locks were taken?)",
					"acknowledged", want, "marked", n)
			}
			return nil
		})
	}
	if len(fIDs) > 0 {
		pb.Queue(ten.q.record, fIDs, fCreated, fInc, fErr, fSent, fLo, fHi)
	}
}

// scanPosition reads the fetch's position row (withPosition): the fetch's snapshot and the id
// sequence's value into pos, the check of the session's mark into same.
func scanPosition(vals [][]byte, fds []pgconn.FieldDescription, pos *resume, same *bool) error {
	if vals[0] == nil || vals[1] == nil || vals[2] == nil {
		return errors.New("fetch returned a malformed position row")
	}
	pos.snap = string(vals[0]) // text: the same bytes in either format
	switch fds[1].Format {
	case pgx.BinaryFormatCode:
		if len(vals[1]) != 8 {
			return errors.New("fetch returned a malformed sequence value")
		}
		pos.seq = int64(binary.BigEndian.Uint64(vals[1]))
	default:
		n, err := strconv.ParseInt(string(vals[1]), 10, 64)
		if err != nil {
			return fmt.Errorf("fetch returned a malformed sequence value: %w", err)
		}
		pos.seq = n
	}
	switch fds[2].Format {
	case pgx.BinaryFormatCode:
		*same = len(vals[2]) == 1 && vals[2][0] == 1
	default:
		*same = string(vals[2]) == "t"
	}
	return nil
}
