// The publish loop, written once for both tracking modes: on the lock connection, one round trip
// records the outcome of the batches published and fetches the next, while the batch in flight is
// published. What differs between row and snapshot tracking is behind tracker.

package relay

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// tracker is how one tracking mode keeps its progress, for one tenure on one lock connection (it
// lives for one call of pump; trackingMode.begin makes it, mode.go): what the next batch is and
// how it is read, what recording a settled batch writes, what an outage or a stop changes, the
// quiet check of an idle poll.
// rowTracker (row_track.go) marks rows sent; snapTracker (snapshot_track.go) moves a cursor and
// parks failed events.
type tracker interface {
	// plan decides, at the top of a round, whether its round trip fetches a batch; cur is in
	// flight, record is settled and not yet written.
	plan(conn *pgx.Conn, cur *batch, record []*batch, now time.Time) (fetch bool)
	// mustRoundTrip reports whether a round trip is due without a fetch: record to write, or the
	// tracker's own work (merging cursor rows).
	mustRoundTrip(record []*batch) bool
	// roundTrip writes the outcome of record and, into not nil, fetches the next batch into it,
	// in one round trip and one implicit transaction; cur is in flight.
	roundTrip(conn *pgx.Conn, ten *tenure, record []*batch, cur, into *batch) error
	// settle turns a published batch's outcome into row states (Relay.settle) and applies it to
	// the tracker's state.
	settle(b *batch) (failed map[string]struct{}, outage bool)
	// take judges a fetched batch once the batch in flight is settled: the batch to prepare (nil
	// when there is none, or it went back to the pool), and whether another round is due at once
	// (more rows wait).
	take(b *batch) (use *batch, more bool)
	// parked returns the events parked per aggregate that b's events wait behind (prepare
	// holds them back); nil where nothing is parked.
	parked(b *batch) map[string]int
	// prepared is told of a batch prepare judged, before it is published.
	prepared(b *batch)
	// unpublished takes a batch with rows and nothing to publish, and reports whether it has an
	// outcome to record (it then joins the batches to write).
	unpublished(b *batch) bool
	// needsRecord reports whether record has something to write before the relay may wait idle.
	needsRecord(record []*batch) bool
	// reset: what was fetched will not be published as read (an outage, a stop); the next fetch
	// reads from the recorded position.
	reset()
	// idled is told that the relay waited idle.
	idled()
	// flushBy is when the tracker has progress to write even if nothing else happens (zero:
	// never): an idle wait ends then, and mustRoundTrip holds from then on.
	flushBy() time.Time
	// stop ends the tenure once every batch is recorded.
	stop(conn *pgx.Conn) error
}

// pump runs the publish loop on the lock connection until ctx ends (returns nil after recording
// the batch in flight) or a database round trip fails (returns its error, keeping the outcome of
// published batches in r.carry to record after reconnecting).
//
// Each iteration is one round trip that records the outcome of the previous batch and fetches the
// next one (excluding the rows in flight), then waits for the batch in flight, then starts
// publishing the fetched batch without the events of aggregates that just failed. So batch N+1
// is fetched while batch N is being published, and published only once N's outcome is known.
// After a fetch that found events and did not fill its batch, the next iteration first gathers:
// it waits until the latency budget (--max-delay) after that fetch began (wake.go).
func (r *Relay) pump(ctx, pubCtx context.Context, conn *pgx.Conn, ten *tenure, tr tracker) error {
	if e, ok := tr.(interface{ end() }); ok {
		defer e.end()
	}
	record := r.carry
	r.carry = nil
	r.wk.writeOnly = false // a tenure's first round trip fetches: the last one's may have failed
	var cur *batch         // in flight
	for {
		r.metrics.gathered.Add(r.wk.gather(ctx).Seconds())
		r.reportState(conn)
		r.applyRetries()
		start := time.Now()
		r.planned = start
		stopping := ctx.Err() != nil
		var fetched *batch
		if !stopping && !r.wk.writeOnly {
			select { // rows committed before this fetch need no further wake-up
			case <-r.wake:
			default:
			}
			if tr.plan(conn, cur, record, start) {
				fetched = r.getBatch()
			}
		}
		if fetched != nil || tr.mustRoundTrip(record) {
			if err := tr.roundTrip(conn, ten, record, cur, fetched); err != nil {
				r.putBatch(fetched)
				r.carryOver(record, cur, func(b *batch) { tr.settle(b) })
				return err
			}
			record = r.roundTripOK(record)
		}
		r.wk.writeOnly = false
		var (
			outage     bool
			lastFailed map[string]struct{} // aggregates that failed in the batch that was in flight
		)
		if cur != nil {
			leaseErr := r.await(conn, cur.done)
			if lost := cur.lostTxn(); lost != nil {
				// The exactly-once producer publishes no more (fenced, or a commit whose outcome
				// is unknown): the batch's outcome is not settled nor recorded, here or by the
				// next tenure (which may be another layout's: its events parked there would be
				// published again). The tenure ends; the next one fences the shard's
				// transactional id, reads its committed cursor record and follows it.
				r.putBatch(cur)
				leaseErr = cmp.Or(leaseErr, lost)
			} else {
				lastFailed, outage = tr.settle(cur)
				record = append(record, cur)
			}
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
				return tr.stop(conn)
			}
			continue // one more round trip records the last batches
		}
		if outage {
			// Every broker is unreachable: the fetched rows wait for the next fetch.
			r.putBatch(fetched)
			tr.reset()
			r.backOffOutage(ctx, conn, start, record)
			continue
		}
		events := fetched != nil && len(fetched.rows) > 0
		fetched, more := tr.take(fetched)
		r.wk.fetched(start, events, more, r.cfg.MaxDelay)
		if fetched != nil && len(fetched.rows) > 0 && ctx.Err() != nil {
			// Stopping: the fetched rows go back, fetched again by whoever publishes next.
			tr.reset()
			r.putBatch(fetched)
			fetched = nil
		}
		if fetched != nil {
			var err error
			if cur, record, err = r.handOff(ctx, pubCtx, conn, tr, fetched, lastFailed, record); err != nil {
				return err
			}
		}
		r.metrics.tick.Observe(time.Since(start).Seconds())
		if cur == nil && !more && !tr.needsRecord(record) && !r.claimBeforeIdle() {
			r.probeKafka(ctx)
			if r.waitIdle(ctx, conn, tr.flushBy()) {
				tr.idled()
			}
		}
	}
}

// handOff prepares b, the batch tr took (poison, held-back aggregates), and starts publishing it:
// it returns the batch in flight. A batch with nothing to publish joins record when it has an
// outcome to write, and is released otherwise. An error (the lease lost, or the wait for the
// standbys failed: readyToPublish) keeps record in r.carry for the next tenure.
func (r *Relay) handOff(ctx, pubCtx context.Context, conn *pgx.Conn, tr tracker, b *batch, lastFailed map[string]struct{},
	record []*batch) (*batch, []*batch, error) {
	if len(b.rows) > 0 {
		r.wk.sawEvents()
		r.eventsSeen()
		r.prepare(b, time.Now(), lastFailed, tr.parked(b))
		tr.prepared(b)
	}
	switch {
	case len(b.msgs) > 0:
		if err := r.readyToPublish(ctx, conn, b); err != nil {
			r.putBatch(b)
			r.carryOver(record, nil, nil)
			return nil, nil, err
		}
		go r.publish(pubCtx, b)
		return b, record, nil
	case tr.unpublished(b):
		return nil, append(record, b), nil
	default: // every row waits behind a failed event, or there were none
		r.putBatch(b)
		return nil, record, nil
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
	if registryUnavailable(err) {
		what = "schema registry unavailable; retrying"
	}
	if r.pub.classify(err) == failRefused {
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
// reconnecting. The failed round trip may have committed before the connection broke. A batch
// whose exactly-once producer was lost (lostTxn) has no outcome to keep.
func (r *Relay) carryOver(record []*batch, cur *batch, settle func(*batch)) {
	if cur != nil {
		<-cur.done
		if cur.lostTxn() != nil {
			r.putBatch(cur)
		} else {
			settle(cur)
			record = append(record, cur)
		}
	}
	for _, b := range record {
		b.retried = true
	}
	r.carry = record
}

func (r *Relay) lastOutageErr(bs []*batch) error {
	for i := len(bs) - 1; i >= 0; i-- {
		if bs[i].outageErr != nil {
			return bs[i].outageErr
		}
	}
	return errors.New("kafka unreachable")
}

// untilBackoffEnds bounds the wait d, starting at now, by the backoffs that end after the round
// trip was planned (idle): 0 for one that has ended since.
func (r *Relay) untilBackoffEnds(now time.Time, d time.Duration) time.Duration {
	for _, e := range r.blocked {
		if e.until.After(r.planned) {
			d = min(d, max(e.until.Sub(now), 0))
		}
	}
	return d
}

// idle waits for a notification, d, the end of an aggregate's backoff, or ctx, and reports
// whether a notification ended it. A backoff that ended after the round trip before the wait was
// planned (r.planned) but before the wait began ends it at once: that round trip held the
// aggregate back (its events not fetched, or its parked events not due), and no notification
// will come for them. Waiting for the next one instead left a parked aggregate, whose backoff
// ended in between, unpublished for a whole poll interval (TestLeastPrivilegeRelay under load:
// a minute with --notify). A backoff that ended before the round trip was planned ended in time
// for it, and does not end the wait.
// It pings conn every lease beat, and returns early if a ping fails (the next round trip then
// fails and reconnects).
func (r *Relay) idle(ctx context.Context, conn *pgx.Conn, d time.Duration) bool {
	d = r.untilBackoffEnds(time.Now(), d)
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
