package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Publishing only what the standbys have (--wait-for-standbys N).
//
// With asynchronous replication a transaction is visible on the primary before any standby
// has its WAL. A relay that publishes it and then loses the primary to a failover has published
// an event the new primary never received: the application sees its transaction lost, its
// consumers an event of it. With N > 0 each fetch also reads the WAL insert position (above the
// commit record of every transaction the fetch saw), and the batch is published only once N
// standbys report in pg_stat_replication that they flushed up to it; a standby that flushed a
// commit replays it when promoted. PostgreSQL 17's synchronized_standby_slots does the same for
// logical replication slots. The wait costs the replication lag in latency; while fewer than N
// standbys stream, the relay publishes nothing (it logs why, and
// outbox_relay_standby_wait_seconds_total grows).

// lsnSQL reads the position every commit visible to the fetch before it lies below.
const lsnSQL = `SELECT pg_current_wal_insert_lsn()::text`

// standbysSQL counts the standbys that flushed the WAL up to $1. Reading other sessions' flush
// positions needs pg_read_all_stats (or superuser); without it the columns are NULL and the
// relay waits, saying so.
const standbysSQL = `SELECT count(*) FILTER (WHERE flush_lsn >= $1::pg_lsn), count(*), count(flush_lsn) FROM pg_stat_replication`

// queueLSN queues, after a fetch into b, the read of the position its events' WAL ends below.
func (r *Relay) queueLSN(pb *pgx.Batch, b *batch) {
	if r.cfg.WaitForStandbys <= 0 || b == nil {
		return
	}
	b.lsn = ""
	pb.Queue(lsnSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&b.lsn) })
}

// readyToPublish checks, before b is handed to the publisher, that the relay still holds its
// lease and, with --wait-for-standbys, waits until enough standbys have b's events.
func (r *Relay) readyToPublish(ctx context.Context, conn *pgx.Conn, b *batch) error {
	if err := r.leaseHeld(conn); err != nil {
		return err
	}
	if r.cfg.WaitForStandbys <= 0 || b.lsn == "" {
		return nil
	}
	return r.awaitStandbys(ctx, conn, b.lsn)
}

// Bounds of the polls of pg_stat_replication while a batch waits for the standbys: the first
// soon (a streaming standby flushes within a millisecond or two), then less often.
const (
	minStandbyPoll = 500 * time.Microsecond
	maxStandbyPoll = 50 * time.Millisecond
	standbyWarnAt  = 5 * time.Second
)

// awaitStandbys waits until cfg.WaitForStandbys standbys have flushed the WAL up to lsn. It
// returns ctx's error when the relay stops meanwhile (the batch is not published) and a
// database error as a failed round trip.
func (r *Relay) awaitStandbys(ctx context.Context, conn *pgx.Conn, lsn string) error {
	start := time.Now()
	warned := start
	defer func() { r.metrics.standbyWait.Add(time.Since(start).Seconds()) }()
	for d := minStandbyPoll; ; d = min(2*d, maxStandbyPoll) {
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		var flushed, streaming, visible int
		err := conn.QueryRow(qctx, standbysSQL, lsn).Scan(&flushed, &streaming, &visible)
		cancel()
		if err != nil {
			return err
		}
		if flushed >= r.cfg.WaitForStandbys {
			return nil
		}
		if since := time.Since(warned); since >= standbyWarnAt {
			warned = time.Now()
			msg := "waiting for standbys to flush the batch's events before publishing them"
			if visible < streaming {
				msg = "waiting for standbys, whose flush positions this role cannot read (grant it pg_read_all_stats)"
			}
			r.log.Warn(msg, "want", r.cfg.WaitForStandbys, "flushed", flushed, "connected", streaming,
				"waited", time.Since(start).Round(time.Millisecond).String())
		}
		if !sleepCtx(ctx, d) {
			return ctx.Err()
		}
	}
}
