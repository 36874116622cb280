package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The lock connection's lease.
//
// A relay's locks (its shard index's presence lock and its buckets) are session locks: they
// last as long as its lock connection. A relay process that is frozen (SIGSTOP, a paused VM or
// container, a node under memory pressure) keeps that connection open: TCP keepalives are
// answered by its kernel, so without more its shard stays locked for as long as it is frozen,
// and when it resumes it would go on publishing the batch it fetched before, long after a
// standby could have taken over.
//
// So the lock connection runs with idle_session_timeout set to the lease (PostgreSQL 14 and
// later): PostgreSQL ends the session of a relay that stays silent for a whole lease, which
// releases its locks to the standby. A live relay is never silent that long: whenever it waits
// with the connection idle (for a batch's acknowledgement, a notification, the end of a Kafka
// outage's backoff) it pings the connection every lease/3. And before it publishes a fetched
// batch, a relay that has not heard from its session for half a lease (it was frozen) pings it
// first and, if the session is gone, publishes nothing: the batch is not recorded, and whoever
// holds the shard now publishes it.

// PostgreSQL 13 has no idle_session_timeout. There the relay that waits for a lock enforces the
// lease instead: rather than block in pg_advisory_lock for good, it blocks at most leaseTry at a
// time (lock_timeout) and, in between, ends the holder's session (pg_terminate_backend, which a role may do to its own
// sessions) once pg_stat_activity shows it idle for longer than the lease; a live holder is never
// idle that long, for the same pings. The frozen relay's locks go with its session, as on 14.

// DefaultLockLease is how long PostgreSQL lets a relay's lock connection stay idle.
const DefaultLockLease = 30 * time.Second

// minLockLease keeps the pings of a live relay (every lease/3) at most one a second.
const minLockLease = 3 * time.Second

// leaseSQL sets the lock connection's lease; refused by PostgreSQL before 14 (the relay then
// runs without one, as before).
func leaseSQL(lease time.Duration) string {
	return fmt.Sprintf(`SELECT set_config('idle_session_timeout', '%dms', false)`, lease.Milliseconds())
}

// leaseTry is how long at a time a relay on a server without idle_session_timeout blocks on a lock
// it waits for.
const leaseTry = 500 * time.Millisecond

// endIdleHolderSQL ends the session holding pg_advisory_lock($1, $2) if it has been idle for more
// than $3 milliseconds: the lease of a server without idle_session_timeout.
const endIdleHolderSQL = `SELECT coalesce(bool_or(pg_catalog.pg_terminate_backend(a.pid)), false)
FROM pg_catalog.pg_locks AS l JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1::int4::oid AND l.objid = $2::int4::oid AND l.objsubid = 2
  AND a.state = 'idle' AND a.state_change < pg_catalog.clock_timestamp() - make_interval(secs => $3::float8 / 1000)`

// waitLease is the lease lockKeys enforces itself while it waits: the lock lease on a server
// without idle_session_timeout, 0 (PostgreSQL enforces it) otherwise.
func (r *Relay) waitLease() time.Duration {
	if r.noSessionTimeout {
		return r.cfg.LockLease
	}
	return 0
}

// leaseBeat is how often a waiting relay pings its lock connection.
func (r *Relay) leaseBeat() time.Duration { return r.cfg.LockLease / 3 }

// touched notes that the lock connection's session answered just now.
func (r *Relay) touched() { r.contact = time.Now() }

// ping sends an empty statement on the lock connection: PostgreSQL's idle timer starts again.
func (r *Relay) ping(conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	if err := conn.Ping(ctx); err != nil {
		return err
	}
	r.touched()
	return nil
}

// await waits for done (a batch's publication) while keeping the lease: it pings conn every
// beat. It always waits for done; it returns the first ping error.
func (r *Relay) await(conn *pgx.Conn, done <-chan struct{}) error {
	t := time.NewTicker(r.leaseBeat())
	defer t.Stop()
	var err error
	for {
		select {
		case <-done:
			return err
		case <-t.C:
			if err == nil {
				err = r.ping(conn)
			}
		}
	}
}

// sleepLeased sleeps for d, or until ctx ends, while keeping the lease; it returns early, with
// the error, if a ping fails (the next round trip reconnects).
func (r *Relay) sleepLeased(ctx context.Context, conn *pgx.Conn, d time.Duration) error {
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		if !sleepCtx(ctx, min(left, r.leaseBeat())) {
			return nil
		}
		if time.Until(end) > 0 {
			if err := r.ping(conn); err != nil {
				return err
			}
		}
	}
}

// leaseHeld reports, before a fetched batch is published, whether the relay may still count on
// its session: when it has not heard from it for half a lease (the process was frozen, or
// starved of CPU), it asks. An error means the session, and so the shard's locks, may be gone:
// the batch must not be published.
func (r *Relay) leaseHeld(conn *pgx.Conn) error {
	if time.Since(r.contact) < r.cfg.LockLease/2 {
		return nil
	}
	if err := r.ping(conn); err != nil {
		return fmt.Errorf("the lock connection's session may have ended (nothing heard from it for %s, the lease is %s): %w",
			time.Since(r.contact).Round(time.Millisecond), r.cfg.LockLease, err)
	}
	return nil
}
