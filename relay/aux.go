package relay

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// aux holds the second connection: it LISTENs on the table's channel (a notification only
// wakes the loop; the loop's fetch decides what to publish) and refreshes outbox_pending and
// outbox_lag_seconds every StatsInterval.
func (r *Relay) aux(ctx context.Context) {
	var (
		conn      *pgx.Conn
		failures  int
		nextStats time.Time
	)
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			c, err := pgx.ConnectConfig(ctx, r.auxCfg)
			if err == nil && r.cfg.Notify {
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
		}
		if !time.Now().Before(nextStats) {
			err := r.refreshStats(ctx, conn)
			nextStats = time.Now().Add(r.cfg.StatsInterval)
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
		wctx, cancel := context.WithDeadline(ctx, nextStats)
		var err error
		if r.cfg.Notify {
			_, err = conn.WaitForNotification(wctx)
		} else {
			<-wctx.Done()
			err = wctx.Err()
		}
		cancel()
		switch {
		case err == nil:
			r.signalWake()
		case ctx.Err() != nil:
			return
		case errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed():
			// time for the statistics
		default:
			r.log.Debug("listen connection lost; reconnecting", "err", r.red.Error(err))
			_ = conn.Close(context.Background())
			conn = nil
		}
	}
}

// refreshStats reads the shard's pending count, bounded by PendingCountLimit (beyond it,
// extrapolated from the id range), and the age of its first pending row.
func (r *Relay) refreshStats(ctx context.Context, conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	args := []any{r.buckets, r.cfg.PendingCountLimit}
	if r.cfg.ShardCount == 1 {
		args = args[1:]
	}
	var (
		n          int64
		lo, hi, tl *int64
		lag        float64
	)
	if err := conn.QueryRow(ctx, r.q.stats, args...).Scan(&n, &lo, &hi, &tl, &lag); err != nil {
		return err
	}
	pending := float64(n)
	if n >= int64(r.cfg.PendingCountLimit) && lo != nil && hi != nil && tl != nil && *hi > *lo {
		// The first PendingCountLimit pending rows span ids lo..hi; assume the same density up
		// to the last pending id.
		pending = float64(n) * float64(*tl-*lo+1) / float64(*hi-*lo+1)
	}
	r.metrics.pending.Set(pending)
	r.metrics.lag.Set(max(lag, 0))
	return nil
}
