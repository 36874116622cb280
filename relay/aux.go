package relay

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// aux holds the second connection: it LISTENs on the table's channel (a notification only
// wakes the loop; the loop's fetch decides what to publish), reads the shard layout on a layout
// notification, on connecting and every layoutWatchInterval (a change stands the relay down),
// refreshes outbox_pending and outbox_lag_seconds every StatsInterval (statsIdleInterval while
// the relay finds nothing to publish and nothing is pending), and asks whether a replay waits on
// a replay notification and every ReplayCheckInterval (replay.go; its publications run under
// pubCtx). What it reads on a notification it reads again periodically only as a safety net, so
// an idle relay costs its database almost nothing.
func (r *Relay) aux(ctx, pubCtx context.Context) {
	var (
		conn       *pgx.Conn
		failures   int
		nextStats  time.Time
		nextLayout time.Time
		nextReplay time.Time
		statsTen   *tenure // the tenure the statistics were last measured for
	)
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			c, err := pgx.ConnectConfig(ctx, r.auxCfg)
			if err == nil {
				err = TuneFetchSession(ctx, c)
			}
			if err == nil { // layout notifications come on the table's channel too
				_, err = c.Exec(ctx, "LISTEN "+pgx.Identifier{r.cfg.Table.Channel()}.Sanitize())
			}
			if err != nil {
				if c != nil {
					_ = c.Close(context.Background())
				}
				if ctx.Err() != nil {
					return
				}
				failures++
				d := r.cfg.OutageBackoff.Delay(failures)
				r.log.Debug("listen connection failed; retrying", "err", r.red.Error(err), "retry_in", d.Round(time.Millisecond).String())
				sleepCtx(ctx, d)
				continue
			}
			conn, failures = c, 0
			r.signalWake() // notifications sent while we were not listening are lost
			nextLayout = time.Time{}
		}
		if !time.Now().Before(nextLayout) {
			if err := r.watchLayout(ctx, conn); err != nil && ctx.Err() == nil {
				r.log.Debug("reading the shard layout failed", "err", r.red.Error(err))
			}
			nextLayout = time.Now().Add(layoutWatchInterval)
		}
		if !time.Now().Before(nextReplay) {
			nextReplay = r.checkReplays(ctx, pubCtx, conn)
		}
		ten := r.currentTenure()
		if ten != nil && ten != statsTen {
			nextStats = time.Time{} // a new tenure: measure its backlog now
		}
		if !time.Now().Before(nextStats) {
			var err error
			statsTen = ten
			if statsTen != nil {
				r.fetched.Store(false)
				var pending float64
				pending, err = r.refreshStats(ctx, conn, statsTen)
				nextStats = time.Now().Add(r.cfg.StatsInterval)
				quiet := err == nil && pending == 0 && !r.fetched.Load()
				if quiet {
					nextStats = time.Now().Add(max(statsIdleInterval, r.cfg.StatsInterval))
				}
				r.statsQuiet.Store(quiet)
			} else {
				// Standing by: the relays that publish report the backlog. Look again soon,
				// so that a new tenure reports its backlog at once.
				nextStats = time.Now().Add(standbyStatsCheck)
				r.statsQuiet.Store(false)
			}
			if err != nil && ctx.Err() == nil {
				r.log.Debug("refreshing pending and lag failed", "err", r.red.Error(err))
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || conn.IsClosed() {
					_ = conn.Close(context.Background())
					conn = nil
					continue
				}
			}
		}
		wctx, cancel := context.WithDeadline(ctx, minTime(nextStats, minTime(nextLayout, nextReplay)))
		r.statsWake.Store(&cancel)
		if r.statsQuiet.Load() && r.fetched.Load() {
			cancel() // events came since the last measure: measure now
		}
		n, err := conn.WaitForNotification(wctx)
		woken := errors.Is(wctx.Err(), context.Canceled) && ctx.Err() == nil // by eventsSeen
		r.statsWake.Store(nil)
		cancel()
		if woken {
			nextStats = time.Time{} // the loop found events: measure them now
		}
		switch {
		case err == nil && n.Payload == outboxdb.LayoutNotification:
			nextLayout = time.Time{} // read it now
		case err == nil && n.Payload == outboxdb.ReplayNotification:
			nextReplay = time.Time{} // look now
		case err == nil && strings.HasPrefix(n.Payload, outboxdb.RetryNotification):
			r.requestRetry(strings.TrimPrefix(n.Payload, outboxdb.RetryNotification))
			r.signalWake()
		case err == nil:
			if r.cfg.Notify {
				r.signalWake()
			}
		case ctx.Err() != nil:
			return
		case (woken || errors.Is(err, context.DeadlineExceeded)) && !conn.IsClosed():
			// time for the statistics, the layout or the replays
		default:
			r.log.Debug("listen connection lost; reconnecting", "err", r.red.Error(err))
			_ = conn.Close(context.Background())
			conn = nil
		}
	}
}

// statsIdleInterval is how often the statistics of a shard with nothing pending are refreshed
// while its relay finds nothing to publish: they cannot change until events come, and the loop
// ends the wait when they do (eventsSeen).
const statsIdleInterval = time.Minute

// eventsSeen tells the aux goroutine that the loop fetched events: statistics that wait the
// idle interval are measured at once.
func (r *Relay) eventsSeen() {
	if r.fetched.Swap(true) || !r.statsQuiet.Load() {
		return
	}
	if c := r.statsWake.Load(); c != nil {
		(*c)()
	}
}

// refreshStats measures the shard's backlog (outboxdb.BacklogSQL, as the operator does) into
// outbox_pending and outbox_lag_seconds, and returns the pending count.
func (r *Relay) refreshStats(ctx context.Context, conn *pgx.Conn, ten *tenure) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	var buckets []int16
	if ten.count > 1 {
		buckets = ten.buckets
	}
	b := outboxdb.Backlog{Limit: r.cfg.PendingCountLimit}
	if err := conn.QueryRow(ctx, ten.q.stats, outboxdb.BacklogArgs(buckets, b.Limit)...).Scan(b.Dest()...); err != nil {
		return 0, err
	}
	r.metrics.pending.Set(float64(b.Pending()))
	r.metrics.lag.Set(max(b.OldestAgeSeconds, 0))
	return float64(b.Pending()), nil
}

// watchLayout reads the shard layout: a change stands the publishing relay down and wakes a
// relay that stands by.
func (r *Relay) watchLayout(ctx context.Context, conn *pgx.Conn) error {
	l, err := r.readLayout(ctx, conn)
	if err != nil {
		return err
	}
	r.checkLayout(l)
	r.signalLayout()
	return nil
}

// standbyStatsCheck is how often a standing-by relay checks whether it publishes again.
const standbyStatsCheck = 100 * time.Millisecond

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// requestRetry asks the loop to end the backoff of aggID ("" for every aggregate): someone
// retried it or skipped one of its events by hand (outboxdb.RetryAggregate, SkipEvent).
func (r *Relay) requestRetry(aggID string) {
	r.retryMu.Lock()
	if aggID == "" {
		r.retryAll = true
	} else {
		if r.retryAggs == nil {
			r.retryAggs = map[string]struct{}{}
		}
		r.retryAggs[aggID] = struct{}{}
	}
	r.retryMu.Unlock()
	r.retryPending.Store(true)
	r.log.Info("retry requested by hand: ending the aggregate's backoff", "aggregate_id", aggID)
}

// applyRetries ends, on the loop goroutine, the backoff of the aggregates requestRetry named: their
// first waiting event is fetched (row tracking) or due (a parked one) in the next round trip.
func (r *Relay) applyRetries() {
	if !r.retryPending.Load() {
		return
	}
	r.retryMu.Lock()
	aggs, all := r.retryAggs, r.retryAll
	r.retryAggs, r.retryAll = nil, false
	r.retryPending.Store(false)
	r.retryMu.Unlock()
	if all {
		clear(r.blocked)
		return
	}
	for agg := range aggs {
		delete(r.blocked, agg)
	}
}
