// snapTracker: snapshot tracking's side of the publish loop (loop.go). The batches come from the
// cursor's snapshots (snapshot.go) or from the parked events; recording one moves its cursor row
// and parks its failed events (snapshot_record.go).

package relay

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// snapTracker tracks progress by snapshot for one tenure: st is the tenure's cursor state, step
// and due what the round being planned fetches.
type snapTracker struct {
	r    *Relay
	st   *snapState
	txn  *txnTrack // exactly-once delivery's state (txn_track.go); nil at-least-once
	step snapStep
	due  []string // stepParked: the aggregates whose parked events are due
	// polled: the relay polls (no notifications) and just woke from a wait.
	polled bool
}

// newSnapTracker takes the cursor rows of ten's buckets (takeCursor). A cursor that cannot be
// trusted keeps the relay not ready, saying why (snapMode.why), until a tenure takes one.
func (m *snapMode) newSnapTracker(conn *pgx.Conn, ten *tenure) (*snapTracker, error) {
	r := m.r
	t, err := m.takeSnapTracker(conn, ten)
	if err != nil {
		var ec *errCursor
		if errors.As(err, &ec) {
			m.why.Store(&ec.msg)
			r.setReady()
		}
		return nil, err
	}
	if m.why.Swap(nil) != nil {
		r.setReady()
	}
	return t, nil
}

// takeSnapTracker takes the tenure's cursor rows; exactly-once, after fencing and reading the
// cursor records (openTxn), and reconciled with them.
func (m *snapMode) takeSnapTracker(conn *pgx.Conn, ten *tenure) (*snapTracker, error) {
	r := m.r
	if !r.exactlyOnce() {
		st, err := r.takeCursor(conn, ten, &m.sql, nil)
		if err != nil {
			return nil, err
		}
		return &snapTracker{r: r, st: st}, nil
	}
	ts, err := r.openTxn(conn, ten)
	if err != nil {
		return nil, err
	}
	st, err := r.takeCursor(conn, ten, &m.sql, func(ctx context.Context, tx pgx.Tx) error {
		return r.absorbLayouts(ctx, tx, &m.sql, ts.old)
	})
	if err == nil {
		err = r.reconcileTxn(conn, ts.t, st, ts.own)
	}
	if err != nil {
		ts.t.end()
		return nil, err
	}
	return &snapTracker{r: r, st: st, txn: ts.t}, nil
}

// plan decides the step; a relay that polls and just woke, or one woken by notifications that
// renews its claim after a wait no notification ended, opens no batch when nothing can have been
// committed since the last snapshot (quietSince).
func (t *snapTracker) plan(conn *pgx.Conn, cur *batch, record []*batch, now time.Time) bool {
	t.step, t.due = t.r.nextStep(t.st, cur, now)
	renew := t.r.renewing()
	if t.step == stepOpen && (t.polled || renew) && cur == nil && !needsSnapRecord(record) && t.r.quietSince(conn, t.st, renew) {
		t.step = stepNone // nothing committed since the last snapshot: wait again
	}
	t.polled = false
	return t.step != stepNone
}

func (t *snapTracker) mustRoundTrip(record []*batch) bool {
	by := t.st.flushBy()
	return len(record) > 0 || t.st.merging || !by.IsZero() && !time.Now().Before(by)
}

// flushBy: the cursor that moved past published events is written within cursorFlushEvery.
func (t *snapTracker) flushBy() time.Time { return t.st.flushBy() }

func (t *snapTracker) roundTrip(conn *pgx.Conn, ten *tenure, record []*batch, _, into *batch) error {
	if into == nil {
		t.step = stepNone // stopping, or nothing to fetch: the round trip only writes
	}
	err := t.r.snapRoundTrip(conn, ten, t.st, record, t.step, t.due, into)
	if err != nil {
		t.st.rng = nil // fetch again from the recorded position
	} else if t.txn != nil {
		t.txn.confirmed(record)
	}
	return err
}

// settle settles a published batch and applies it to the cursor state (snapSettle).
func (t *snapTracker) settle(b *batch) (map[string]struct{}, bool) {
	failed, outage := t.r.snapSettle(t.st, b)
	if t.txn != nil {
		t.txn.settledTxn(b)
	}
	return failed, outage
}

// take: another round is due at once while the groups are to be merged, the batch's range has
// rows left, or the step fetched a chunk or parked events. A batch without a cursor position
// (nothing was fetched into it) goes back.
func (t *snapTracker) take(b *batch) (*batch, bool) {
	st := t.st
	more := st.merging || st.rng != nil && !st.rng.done || t.step == stepChunk || t.step == stepParked
	if b != nil && b.pos.g == nil {
		t.r.putBatch(b)
		b = nil
	}
	return b, more
}

// parked: a batch read from the parked table waits behind nothing.
func (t *snapTracker) parked(b *batch) map[string]int {
	if b.pos.parked {
		return nil
	}
	return t.st.parked
}

// prepared: under exactly-once delivery, a batch with messages carries its transaction's
// cursor record.
func (t *snapTracker) prepared(b *batch) {
	if t.txn != nil && len(b.msgs) > 0 {
		t.txn.prepareTxn(t.r, t.st, b)
	}
}

// end closes the tenure's exactly-once producer (pump, when the tenure ends).
func (t *snapTracker) end() {
	if t.txn != nil {
		t.txn.end()
	}
}

// unpublished: a batch with nothing to publish (empty, or every event held back or parked)
// still moves its cursor.
func (t *snapTracker) unpublished(b *batch) bool {
	b.settled = true
	t.r.snapSettled(t.st, b)
	return true
}

func (t *snapTracker) needsRecord(record []*batch) bool { return needsSnapRecord(record) }

func (t *snapTracker) reset() { t.st.rng = nil }

func (t *snapTracker) idled() { t.polled = !t.r.cfg.Notify }

// stop writes the cursor positions not yet written (flushCursor).
func (t *snapTracker) stop(conn *pgx.Conn) error { return t.r.flushCursor(conn, t.st) }
