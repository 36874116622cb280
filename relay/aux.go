package relay

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-operator/outbox-operator/migrations"
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
			if err == nil {
				err = TuneFetchSession(ctx, c)
			}
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

// refreshStats measures the shard's backlog (migrations.BacklogSQL, as the operator does) into
// outbox_pending and outbox_lag_seconds.
func (r *Relay) refreshStats(ctx context.Context, conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	var buckets []int16
	if r.cfg.ShardCount > 1 {
		buckets = r.buckets
	}
	b := migrations.Backlog{Limit: r.cfg.PendingCountLimit}
	if err := conn.QueryRow(ctx, r.q.stats, migrations.BacklogArgs(buckets, b.Limit)...).Scan(b.Dest()...); err != nil {
		return err
	}
	r.metrics.pending.Set(float64(b.Pending()))
	r.metrics.lag.Set(max(b.OldestAgeSeconds, 0))
	return nil
}
