// Snapshot tracking's plan of the next round trip (snapshot.go): the group to fetch from, the
// step (open a batch, fetch its next rows, or the parked events due), the arguments of the open
// statement, and the check that spares an idle relay opening a batch (quietSince).

package relay

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// active returns the group to fetch from: the first that has not reached the common target.
func (st *snapState) active() *cursorGroup {
	if st.target == "" {
		return st.groups[0]
	}
	for _, g := range st.groups {
		if !g.at(st.target) {
			return g
		}
	}
	return nil
}

// snapStep is what the next round trip fetches.
type snapStep int

const (
	stepNone   snapStep = iota
	stepOpen            // take the next batch's snapshot and bounds
	stepChunk           // fetch the next rows of the batch
	stepParked          // fetch parked events whose backoff ended
)

// nextStep decides what the next round trip fetches, with cur in flight.
func (r *Relay) nextStep(st *snapState, cur *batch, now time.Time) (snapStep, []string) {
	if st.merging {
		return stepNone, nil
	}
	if due := r.dueParked(st, cur, now); len(due) > 0 && (cur == nil || !cur.pos.parked) {
		return stepParked, due
	}
	if st.rng != nil && !st.rng.done {
		return stepChunk, nil
	}
	if st.active() == nil {
		return stepNone, nil
	}
	return stepOpen, nil
}

// dueParked returns the parked aggregates whose backoff ended and that are not in flight.
func (r *Relay) dueParked(st *snapState, cur *batch, now time.Time) []string {
	if len(st.parked) == 0 {
		return nil
	}
	var busy map[string]struct{}
	if cur != nil && cur.pos.parked {
		busy = map[string]struct{}{}
		for i := range cur.rows {
			busy[string(cur.rows[i].aggID)] = struct{}{}
		}
	}
	var due []string
	for agg := range st.parked {
		if e, ok := r.blocked[agg]; ok && e.until.After(now) {
			continue
		}
		if _, ok := busy[agg]; ok {
			continue
		}
		due = append(due, agg)
	}
	slices.Sort(due)
	return due
}

// openArgs returns the arguments of the statement that opens the next batch of the active
// group: after the batch just fetched (st.rng), or, with none (a new tenure, or fetching again
// after a failure), from the group's recorded position, resuming its batch in progress. The
// batch ends at that recorded batch's snapshot, the common target, or a new snapshot.
func (st *snapState) openArgs() (g *cursorGroup, from snapMark, resume int64, targeted bool, args []any) {
	g = st.active()
	target := unmarked("")
	if st.rng != nil && st.rng.g == g {
		from = st.rng.to
	} else {
		from = g.snap
		if g.next.text != "" {
			target, resume = g.next, g.last
		}
	}
	if target.text == "" && st.target != "" {
		target = unmarked(st.target)
	}
	return g, from, resume, target.text != "", []any{nullable(from.text), nullable(target.text), nullableMark(from.floor),
		nullableMark(target.floor), nullableMark(target.ceil)}
}

// quietSince reports whether nothing can have been committed since the snapshot the next batch
// would start from, so that the relay need not open one: opening takes a snapshot and a
// transaction id, and a relay polling every few milliseconds would consume ids (and vacuum's
// freeze work) at that rate while idle. The check takes none. An event the snapshot does not show
// committed belongs either to a transaction it lists in progress (which must have ended since) or
// to one at or above its (widened) xmax, which drew its ids above the snapshot's floor: the
// sequence has then passed the floor. (The floor is the ceiling only where the open statement took
// the transaction's id after reading the ceiling, openSQL; when a round trip's writes took it
// first, a writer could draw an id at or below the ceiling and still be invisible to the snapshot:
// TestWakeByPolling lost such an event, and the floor is then not known.) Any doubt (bounds not
// known, a failed check) opens the batch.
//
// A relay woken by notifications asks it too when it renews its claim to be woken after a wait
// that no notification ended (renew, Relay.renewing): the renewal goes first in the same round
// trip. While nothing is committed the two statements replace the five of a renewal with a batch
// opened and fetched (the floor, the claim, the open statement, the fetch and the cursor's write,
// the empty batch having moved it), which every idle shard sent every fallback poll (make bench,
// "Idle shards", 2026-12-06: 57 statements/s per 100 idle shards). That is sound for the
// same reason, under a claim held throughout: an event inserted after the claim took effect
// notifies (the trigger reads the claim, which is not read through a snapshot); one inserted
// before drew its id before the check read the sequence, so the check is not quiet, or belongs to
// a transaction the snapshot lists in progress, which has not ended (and is watched since the
// claim began). A check that is not quiet (on a busy database, most often a transaction of the
// snapshot's that ended, whatever it wrote) opens the batch in the next round trip, under the
// claim (queueRenewal). A claim into the wait, right after a fetch, does not check first: its
// round trip opens and fetches a batch anyway, and the check would add one whenever a
// transaction of the last snapshot ended since, as most have on a busy database.
func (r *Relay) quietSince(conn *pgx.Conn, st *snapState, renew bool) bool {
	if st.target != "" || st.rng == nil || !st.rng.done || st.rng.g != st.active() || st.rng.to.floor < 0 {
		return false
	}
	_, xip, err := parseSnapshot(st.rng.to.text)
	if err != nil {
		return false
	}
	if xip == nil {
		xip = []string{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	var pb pgx.Batch
	renewed := func() {}
	if renew {
		renewed = r.queueRenewal(&pb)
	}
	var quiet bool
	pb.Queue(st.q.quiet, st.rng.to.floor, xip).QueryRow(func(row pgx.Row) error { return row.Scan(&quiet) })
	if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
		return false // a renewal queued is claimed again by the round trip that opens the batch
	}
	renewed()
	if quiet {
		r.metrics.quietPolls.Inc()
	}
	return quiet
}
