// The pipelined loop on the lock connection: one round trip records the outcome of the batches
// published and fetches the next, while the batch in flight is published.

package relay

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pump runs the pipelined relay loop on the lock connection until ctx ends (returns nil after
// recording the batch in flight) or a database round trip fails (returns its error, keeping
// the outcome of published batches in r.carry to record after reconnecting).
//
// Each iteration is one round trip that records the outcome of the previous batch and fetches
// the next one (excluding the rows in flight), then waits for the batch in flight, then starts
// publishing the fetched batch without the events of aggregates that just failed. So batch N+1
// is fetched while batch N is being published, and published only once N's outcome is known.
func (r *Relay) pump(ctx, pubCtx context.Context, conn *pgx.Conn, ten *tenure) error {
	record := r.carry
	r.carry = nil
	var cur *batch                         // in flight
	pos := &resume{sharded: ten.count > 1} // a new tenure or connection reads from the oldest unsent row
	for {
		r.reportState(conn)
		r.applyRetries()
		start := time.Now()
		stopping := ctx.Err() != nil
		var fetched *batch
		if !stopping {
			fetched = r.getBatch()
			select { // rows committed before this fetch need no further wake-up
			case <-r.wake:
			default:
			}
		}
		if fetched != nil || len(record) > 0 {
			if err := r.roundTrip(conn, ten, pos, record, cur, fetched); err != nil {
				r.putBatch(fetched)
				r.carryOver(record, cur, func(b *batch) { r.settle(b) })
				return err
			}
			record = r.roundTripOK(record)
		}
		var (
			outage     bool
			lastFailed map[string]struct{} // aggregates that failed in the batch that was in flight
		)
		if cur != nil {
			leaseErr := r.await(conn, cur.done)
			lastFailed, outage = r.settle(cur)
			record = append(record, cur)
			cur = nil
			if leaseErr != nil {
				r.putBatch(fetched)
				r.carryOver(record, nil, nil)
				return leaseErr
			}
		}
		if stopping {
			if len(record) == 0 {
				r.endClaim(conn)
				return nil
			}
			continue // one more round trip records the last batch
		}
		if outage {
			// Every broker is unreachable: the prefetched rows wait for the next fetch.
			r.putBatch(fetched)
			pos.reset()
			r.backOffOutage(ctx, conn, start, record)
			continue
		}
		full := fetched != nil && len(fetched.rows) == r.cfg.BatchSize
		if fetched != nil && fetched.dropped {
			// The rows below the floors filled the batch: read again from the oldest unsent row.
			r.putBatch(fetched)
			fetched, full = nil, true
		}
		if fetched != nil && len(fetched.rows) > 0 && ctx.Err() == nil {
			r.wk.sawEvents()
			r.prepare(fetched, time.Now(), lastFailed)
			if fetched.leftPending() {
				pos.reset() // a row held back here is below the floors the next fetch reads from
			}
			switch {
			case len(fetched.msgs) > 0:
				if err := r.readyToPublish(ctx, conn, fetched); err != nil {
					r.putBatch(fetched)
					r.carryOver(record, nil, nil)
					return err
				}
				cur = fetched
				go r.publish(pubCtx, cur)
			case fetched.hasOutcome(): // poison rows under block only
				fetched.settled = true
				record = append(record, fetched)
			default: // every row waits behind a failed event
				r.putBatch(fetched)
			}
		} else {
			if fetched != nil && len(fetched.rows) > 0 {
				pos.reset() // stopping: fetched rows go back
			}
			r.putBatch(fetched)
		}
		r.metrics.tick.Observe(time.Since(start).Seconds())
		if cur == nil && !full && !needsRecord(record) && !r.claimBeforeIdle() {
			r.probeKafka(ctx)
			r.waitIdle(ctx, conn)
		}
	}
}

// backOffOutage waits, every broker being unreachable, before the next round (the relay backs
// off as a whole; no event is charged).
func (r *Relay) backOffOutage(ctx context.Context, conn *pgx.Conn, start time.Time, record []*batch) {
	r.outages++
	d := r.cfg.OutageBackoff.Delay(r.outages)
	r.metrics.tick.Observe(time.Since(start).Seconds())
	err := r.lastOutageErr(record)
	what := "kafka unreachable; retrying"
	if refused(err) {
		what = "kafka refused the relay (credentials, permissions, TLS or a missing topic); retrying"
	}
	r.log.Warn(what, "err", r.red.Error(err), "retry_in", d.Round(time.Millisecond).String())
	_ = r.sleepLeased(ctx, conn, d) // a session gone fails the next round trip, which reconnects
}

// roundTripOK notes a round trip that succeeded and releases the batches it recorded.
func (r *Relay) roundTripOK(record []*batch) []*batch {
	r.touched()
	r.dbOK.Store(true)
	r.dbFailures = 0
	r.setReady()
	for _, b := range record {
		r.putBatch(b)
	}
	return record[:0]
}

// carryOver keeps, after a failed round trip, the outcome of the batches in record and of cur
// (once its publication ends and settle has turned it into row states) to write after
// reconnecting. The failed round trip may have committed before the connection broke.
func (r *Relay) carryOver(record []*batch, cur *batch, settle func(*batch)) {
	if cur != nil {
		<-cur.done
		settle(cur)
		record = append(record, cur)
	}
	for _, b := range record {
		b.retried = true
	}
	r.carry = record
}

func needsRecord(bs []*batch) bool {
	for _, b := range bs {
		if b.hasOutcome() {
			return true
		}
	}
	return false
}

func (r *Relay) lastOutageErr(bs []*batch) error {
	for i := len(bs) - 1; i >= 0; i-- {
		if bs[i].outageErr != nil {
			return bs[i].outageErr
		}
	}
	return errors.New("kafka unreachable")
}

// idle waits for a notification, d, the end of an aggregate's backoff, or ctx, and reports
// whether a notification ended it.
// It pings conn every lease beat, and returns early if a ping fails (the next round trip then
// fails and reconnects).
func (r *Relay) idle(ctx context.Context, conn *pgx.Conn, d time.Duration) bool {
	now := time.Now()
	for _, e := range r.blocked {
		if w := e.until.Sub(now); w > 0 && w < d {
			d = w
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	beat := time.NewTicker(r.leaseBeat())
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-r.wake:
			return true
		case <-t.C:
			return false
		case <-beat.C:
			if err := r.ping(conn); err != nil {
				return false
			}
		}
	}
}

func (r *Relay) signalWake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// roundTrip sends, in one round trip and one implicit transaction on the lock connection, the
// outcome of the batches in record and, when into is not nil, the fetch of the next batch.
func (r *Relay) roundTrip(conn *pgx.Conn, ten *tenure, pos *resume, record []*batch, cur, into *batch) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	var pb pgx.Batch
	sessionDone := func() error { return nil }
	if into != nil {
		sessionDone = r.queueSessionCheck(&pb)
	}
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
		pb.Queue(ten.q.position).QueryRow(func(row pgx.Row) error { return row.Scan(&pos.snap, &pos.seq) })
		order = ten.fetchBuckets()
		sql, args := ten.q.fetchArgs(pos, order, inflight, blocked)
		pb.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			var fds []pgconn.FieldDescription
			for rows.Next() {
				if fds == nil {
					fds = rows.FieldDescriptions() // only valid once the query ran
				}
				if err := into.scanRow(rows.RawValues(), fds); err != nil {
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
		return nil
	}
	if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
		pos.reset()
		return err
	}
	if err := sessionDone(); err != nil {
		pos.reset()
		return err
	}
	wakeDone()
	if into != nil {
		into.dropped = !pos.afterFetch(into, order, r.cfg.BatchSize)
		r.resumedAt.Store(pos.lowest(order))
	}
	return nil
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
