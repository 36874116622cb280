package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// wakeState is the relay's side of the wake-up protocol on its lock connection (migration
// 00005_wake_on_demand.sql, docs/architecture.md "Wake-ups"). Inserts notify only while a relay
// holds a claim to wait, so the relay claims before it waits and ends its claim when a
// notification wakes it: under load it never waits and no transaction notifies.
//
// A writer whose insert read "nobody waits" just before the claim took effect may commit after
// the fetch that follows the claim. It already held a transaction id when it read, so it is
// among the transactions the claim returns as in progress: until each of them has ended the
// relay waits only briefly (doubling from minWatchWait up to maxWatchWait) and fetches again.
type wakeState struct {
	// claimed: the connection may hold a claim (a new connection may hold a stale one of an
	// earlier session with the same pid, or the migration's initial one): the next round trip
	// that does not claim ends it.
	claimed bool
	// arm: the next round trip claims (fresh) or renews the claim before it fetches.
	arm   bool
	fresh bool
	// watch: the transactions in progress when the claim began that have not ended yet.
	watch   []int64
	backoff time.Duration
	result  []int64 // the claim's answer, scanned by the round trip
	// poll is the next wait of a relay that polls: activePollWait (or the latency budget, if
	// longer) after a fetch that found events, doubling up to the poll interval while fetches
	// find none.
	poll time.Duration
	// idleSince is when the idle spell of a relay that polls began: its first wait after a fetch
	// that found events (zero until then). The wait grows with the spell (nextPoll).
	idleSince time.Time
	// gatherUntil: the last fetch found events and did not fill its batch, so the next one waits
	// until then, the latency budget after it began (gather); zero when nothing waits.
	gatherUntil time.Time
	// keep: the claim was just renewed with a quiet check (queueRenewal): the next round trip
	// before the relay waits again (the fetch after a check that was not quiet, a write that fell
	// due) leaves it as it is rather than ending it.
	keep bool
	// writeOnly: an idle wait ended early, for progress to write (tracker.flushBy), with nothing
	// new to fetch: the next round trip only writes, and leaves the claim as it is.
	writeOnly bool
}

// activePollWait is how long a polling relay waits after a fetch that found events before it
// looks again. Under a steady stream a fetch may come back empty between two events: waiting
// the whole poll interval then would add it to the next event's latency (at 2,000 events/s
// about one fetch in eight came back empty once publishing took a millisecond). The waits
// double while nothing comes, so an idle relay polls at its poll interval after a few
// milliseconds.
const activePollWait = time.Millisecond

// sawEvents notes a fetch that found events: a relay that polls looks again soon, and its idle
// spell ends.
func (w *wakeState) sawEvents() { w.poll, w.idleSince = 0, time.Time{} }

// nextPoll returns how long a relay that polls every interval waits now; budget is the latency
// budget (--max-delay), under which a first look sooner would only find less. Idle for T (since
// its first wait after events), it waits up to T/contract.IdleBackoffShare, at most ceiling
// (--idle-poll-interval; at or below interval, no backoff): an event committed during the wait
// waits at most that share of the idle spell before it.
func (w *wakeState) nextPoll(interval, budget, ceiling time.Duration, now time.Time) time.Duration {
	w.poll = min(max(2*w.poll, activePollWait, budget), interval)
	if ceiling > interval {
		if w.idleSince.IsZero() {
			w.idleSince = now
		}
		w.poll = max(w.poll, min(now.Sub(w.idleSince)/contract.IdleBackoffShare, ceiling))
	}
	return w.poll
}

// fetched notes the outcome of a fetch that began at start: when it found events and did not
// fill its batch (more rows wait otherwise), the next fetch gathers until budget after start.
func (w *wakeState) fetched(start time.Time, events, more bool, budget time.Duration) {
	w.gatherUntil = time.Time{}
	if events && !more && budget > 0 {
		w.gatherUntil = start.Add(budget)
	}
}

// gather waits, before a fetch, until the latency budget of the last fetch has passed (fetched),
// so that the events committed meanwhile are published together; a stop (ctx) ends the wait.
// The batch in flight goes on being published meanwhile. It reports how long it waited.
func (w *wakeState) gather(ctx context.Context) time.Duration {
	d := time.Until(w.gatherUntil)
	w.gatherUntil = time.Time{}
	if d <= 0 {
		return 0
	}
	t := time.NewTimer(d)
	defer t.Stop()
	start := time.Now()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return time.Since(start)
}

// Bounds of the short waits while a claim still watches transactions in progress: the first
// wait is short (most writers commit within milliseconds), and however long a watched
// transaction lasts (an unrelated session idle in transaction), the relay looks again at least
// every maxWatchWait, a cheap fetch, so a watched writer's events wait at most that long.
const (
	minWatchWait = time.Millisecond
	maxWatchWait = 100 * time.Millisecond
)

// newWakeState is the state of a new lock connection: end any claim first.
func newWakeState() wakeState { return wakeState{claimed: true} }

// claims reports whether queueWake, for a round trip that fetches or not, queues the claim (or
// its renewal): it must come before the fetch's snapshot (a writer that committed after the
// snapshot either read the claim or is watched), and it takes the transaction's id.
func (r *Relay) claims(fetches bool) bool { return r.wk.arm && fetches }

// queueWake queues the claim (or its renewal) when armed, before the fetch, or the end of a
// claim the connection holds, anywhere in the round trip (the relay fetches again after it).
// done applies the outcome once the round trip succeeded.
func (r *Relay) queueWake(pb *pgx.Batch, fetches bool) (done func()) {
	w := &r.wk
	switch {
	case r.claims(fetches):
		var watch []int64
		if !w.fresh {
			watch = w.watch
			if watch == nil {
				watch = []int64{}
			}
		}
		w.result = nil
		pb.Queue(r.wakeSQL.Wait, r.claimFor.Seconds(), watch).QueryRow(func(row pgx.Row) error {
			return row.Scan(&w.result)
		})
		return func() {
			w.claimed, w.arm, w.fresh, w.watch = true, false, false, w.result
			r.metrics.claims.Inc()
		}
	case w.keep:
		return func() { w.keep = false }
	case w.claimed && !w.arm && (fetches || !w.writeOnly):
		pb.Queue(r.wakeSQL.Woke)
		return func() { w.claimed, w.watch, w.backoff = false, nil, 0 }
	}
	return func() {}
}

// renewing reports whether the relay, woken by no notification, is to renew its claim before it
// fetches again (waitIdle armed it).
func (r *Relay) renewing() bool { return r.cfg.Notify && r.wk.arm && !r.wk.fresh && r.wk.claimed }

// queueRenewal queues the renewal of the claim, for a round trip whose only other statement is
// the quiet check (quietSince), and returns what applies it once the round trip succeeded. The
// claim then lives on until a notification or a fetch that found events ends it: when the check
// was not quiet, the round trip that follows opens and fetches a batch under it, and the relay
// waits again under it if nothing came (keep).
func (r *Relay) queueRenewal(pb *pgx.Batch) (done func()) {
	renewed := r.queueWake(pb, true)
	return func() {
		renewed()
		r.wk.keep = true
	}
}

// endClaim ends the connection's claim when the relay stops publishing (it stands down or shuts
// down), so that writers stop notifying at once rather than when the claim expires. A failure is
// left to the expiry.
func (r *Relay) endClaim(conn *pgx.Conn) {
	if !r.wk.claimed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, r.wakeSQL.Woke); err == nil {
		r.wk = wakeState{}
	}
}

// claimBeforeIdle reports whether the relay, about to wait, must first claim the wait in a
// round trip that fetches once more (false when the last round trip claimed and found nothing,
// or when notifications are off and the relay polls).
func (r *Relay) claimBeforeIdle() bool {
	if !r.cfg.Notify || r.wk.claimed {
		return false
	}
	r.wk.arm, r.wk.fresh = true, true
	return true
}

// waitIdle waits under the claim: for a notification, or the poll interval (a short wait while
// the claim still watches transactions in progress). A relay that polls waits less right after
// events (activePollWait). After a wait that no notification ended,
// the next round trip renews the claim; after a notification it ends it.
// A wait ends early at flushBy (not zero), when the tracker has progress to write: waitIdle then
// reports false. A relay that listens then only writes in its next round trip (it learns of new
// events from notifications); one that polls writes in an early poll, and its next wait is as
// long as this one would have been.
func (r *Relay) waitIdle(ctx context.Context, conn *pgx.Conn, flushBy time.Time) (waited bool) {
	w := &r.wk
	w.keep = false
	d := r.cfg.PollInterval
	if !r.cfg.Notify {
		d = w.nextPoll(r.cfg.PollInterval, r.cfg.MaxDelay, r.cfg.IdlePollInterval, time.Now())
	}
	if r.cfg.Notify && len(w.watch) > 0 {
		w.backoff = min(max(2*w.backoff, minWatchWait), maxWatchWait, r.cfg.PollInterval)
		d = w.backoff
	} else {
		w.backoff = 0
	}
	if !flushBy.IsZero() {
		if until := time.Until(flushBy); until < d {
			if until > 0 && r.idle(ctx, conn, until) {
				return true // notified: the next round trip fetches and ends the claim
			}
			if r.cfg.Notify {
				w.writeOnly = true
			} else {
				w.poll /= 2 // this poll is not over: the next wait is the same length again
			}
			return false
		}
	}
	if notified := r.idle(ctx, conn, d); !notified && r.cfg.Notify && w.claimed {
		w.arm, w.fresh = true, false
	}
	return true
}
