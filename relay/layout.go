package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// layoutPollInterval is how often a relay waiting for its shard's layout reads it when no
// notification arrives (the notification on the table's channel is the fast path).
const layoutPollInterval = time.Second

// layoutWatchInterval is how often a publishing relay reads the layout on its listening
// connection with no notification: every change a relay acts on (a request, a switch) notifies,
// and the layout is read again on every new connection, so this is a safety net only.
const layoutWatchInterval = 30 * time.Second

// tenure is one period of publishing under a layout: the shard count, the layout generation,
// the buckets the relay holds (and their lock keys) and the statements for them.
type tenure struct {
	count   int
	gen     int64
	buckets []int16
	keys    []int32 // the buckets as second keys of pg_advisory_lock
	q       queries
	// ring is buckets twice over, and turn where the next fetch starts reading in it
	// (fetchBuckets).
	ring []int16
	turn int
}

// fetchBuckets returns the buckets in the order the next fetch of a shard of several reads them,
// one further along than the last fetch's: every bucket is read first once every len(buckets)
// fetches, so a bucket whose backlog fills whole batches delays the others by at most that many
// batches. The fetching goroutine alone calls it.
func (ten *tenure) fetchBuckets() []int16 {
	n := len(ten.buckets)
	if n < 2 {
		return ten.buckets
	}
	if len(ten.ring) != 2*n {
		ten.ring = append(append(make([]int16, 0, 2*n), ten.buckets...), ten.buckets...)
	}
	out := ten.ring[ten.turn : ten.turn+n]
	ten.turn = (ten.turn + 1) % n
	return out
}

// decide tells a relay what to do with the layout l: publish under count shards (count > 0),
// try to switch the layout to its own fixed shard count (trySwitch), or stand by for the reason
// why. fixed is the relay's --shard-count (0 follows the layout), index its --shard-index.
func decide(fixed, index int, l *outboxdb.Layout) (count int, trySwitch bool, why string) {
	if fixed == 0 {
		switch {
		case l == nil:
			return 0, false, "the table has no shard layout yet (the operator sets it)"
		case l.Requested != 0:
			return 0, false, fmt.Sprintf("the layout is changing from %d to %d shards", l.ShardCount, l.Requested)
		case index >= int(l.ShardCount):
			return 0, false, fmt.Sprintf("standing by: the layout has %d shards and this relay is shard %d", l.ShardCount, index)
		}
		return int(l.ShardCount), false, ""
	}
	switch {
	case l != nil && int(l.ShardCount) == fixed && l.Requested == 0:
		return fixed, false, ""
	case l == nil:
		return 0, true, fmt.Sprintf("setting the table's first shard layout: %d shards", fixed)
	case l.Requested == 0 || int(l.Requested) == fixed:
		return 0, true, fmt.Sprintf("the layout has %d shards, this relay runs %d: switching once no relay of the old layout runs", l.ShardCount, fixed)
	}
	return 0, false, fmt.Sprintf("the layout is changing from %d to %d shards, this relay runs %d", l.ShardCount, l.Requested, fixed)
}

// mustStandDown reports whether the relay publishing under ten must stop: the layout changed or
// a change was requested.
func mustStandDown(ten *tenure, l *outboxdb.Layout) bool {
	return l == nil || l.Generation != ten.gen || l.Requested != 0
}

func (r *Relay) readLayout(ctx context.Context, conn *pgx.Conn) (*outboxdb.Layout, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	var l outboxdb.Layout
	err := conn.QueryRow(ctx, r.layoutSQL.Read).Scan(l.Dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return nil, fmt.Errorf("the outbox schema of %s predates shard layouts: apply its migrations (`relay migrate`; the operator applies them itself): %w", r.cfg.Table, err)
	}
	if err != nil {
		return nil, err
	}
	l.Fill()
	return &l, nil
}

// takeTenure waits until the layout lets this relay publish, takes the buckets it owns under
// that layout and checks the layout again: a switch takes every bucket lock, so a layout read
// while holding the buckets cannot change before they are released.
func (r *Relay) takeTenure(ctx context.Context, conn *pgx.Conn) (*tenure, error) {
	lastWhy := ""
	for {
		l, err := r.readLayout(ctx, conn)
		if err != nil {
			return nil, err
		}
		count, trySwitch, why := decide(r.cfg.ShardCount, r.cfg.ShardIndex, l)
		if count > 0 {
			buckets, err := OwnedBuckets(count, r.cfg.ShardIndex)
			if err != nil {
				return nil, err
			}
			start := time.Now()
			r.log.Info("taking the shard's bucket locks", "shards", count, "buckets", len(buckets))
			keys := make([]int32, len(buckets))
			for i, b := range buckets {
				keys[i] = int32(b)
			}
			if err := lockKeys(ctx, conn, r.lockKey, keys, r.waitLease(), func(b, holder int32) {
				r.log.Info("waiting for a bucket lock held by another session (a relay of another layout, or one that has not stopped yet)",
					"bucket", b, "holder_pid", holder)
			}); err != nil {
				return nil, dropLocks(conn, err)
			}
			again, err := r.readLayout(ctx, conn)
			if err == nil {
				if c, _, _ := decide(r.cfg.ShardCount, r.cfg.ShardIndex, again); c == count {
					ten := &tenure{count: count, gen: again.Generation, buckets: buckets, keys: keys, q: newQueries(r.cfg.Table, count, r.cfg.BatchSize)}
					if r.cfg.Tracking == TrackSnapshot {
						ten.q.stats = outboxdb.SnapshotBacklogSQL(r.cfg.Table, count > 1)
					}
					// Ready before the pause is recorded as over: whoever sees resumed_at sees
					// every relay of the layout ready.
					r.locked.Store(true)
					r.standbyWhy.Store(nil)
					r.setReady()
					if _, err = conn.Exec(ctx, r.layoutSQL.Locked, ten.gen); err != nil {
						r.locked.Store(false)
						r.setReady()
					} else {
						r.log.Info("holding the shard's bucket locks", "shards", count, "buckets", len(buckets),
							"generation", ten.gen, "waited", time.Since(start).Round(time.Millisecond).String())
						return ten, nil
					}
				}
			}
			if err != nil {
				return nil, dropLocks(conn, err)
			}
			if err := unlockKeys(conn, r.lockKey, keys); err != nil {
				return nil, dropLocks(conn, err)
			}
			continue // the layout moved while the buckets were being taken
		}
		if trySwitch {
			ctx2, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
			var ok bool
			err := conn.QueryRow(ctx2, r.layoutSQL.Switch, int32(r.cfg.ShardCount)).Scan(&ok)
			cancel()
			if err != nil {
				return nil, err
			}
			if ok {
				r.log.Info("set the table's shard layout", "shards", r.cfg.ShardCount)
				continue
			}
		}
		if why != lastWhy {
			r.log.Info("not publishing", "reason", why)
			lastWhy = why
			r.standbyWhy.Store(&why)
		}
		t := time.NewTimer(layoutPollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-r.layoutWake:
		case <-t.C:
		}
		t.Stop()
	}
}

// serve publishes under ten until ctx ends or the layout asks the relay to stand down; either
// way the batch in flight is published and recorded first.
func (r *Relay) serve(ctx, pubCtx context.Context, conn *pgx.Conn, ten *tenure) error {
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.tenMu.Lock()
	r.ten, r.stopTenure = ten, cancel
	r.tenMu.Unlock()
	defer func() {
		r.tenMu.Lock()
		r.ten, r.stopTenure = nil, nil
		r.tenMu.Unlock()
	}()
	// A request made before this tenure was registered reached no one: look once more.
	l, err := r.readLayout(ctx, conn)
	if err != nil {
		return err
	}
	if mustStandDown(ten, l) {
		cancel()
	}
	tr, err := r.mode.begin(ctx, conn, ten)
	if err != nil {
		return err
	}
	return r.pump(tctx, pubCtx, conn, ten, tr)
}

// checkLayout stands the relay down when the layout l no longer lets it publish.
func (r *Relay) checkLayout(l *outboxdb.Layout) {
	r.tenMu.Lock()
	defer r.tenMu.Unlock()
	if r.ten != nil && r.stopTenure != nil && mustStandDown(r.ten, l) {
		r.log.Info("the shard layout is changing: finishing the batch in flight and releasing the buckets")
		r.stopTenure()
		r.stopTenure = nil
	}
}

// currentTenure returns the tenure the relay publishes under, nil while it stands by.
func (r *Relay) currentTenure() *tenure {
	r.tenMu.Lock()
	defer r.tenMu.Unlock()
	return r.ten
}

// standDownBuckets gives ten's buckets back (the presence lock stays) and records the release.
func (r *Relay) standDownBuckets(conn *pgx.Conn, ten *tenure) error {
	r.locked.Store(false)
	r.setReady()
	// The buckets' backlog is another relay's to report now: a stale value here would inflate
	// max(outbox_lag_seconds), which dashboards and autoscalers read.
	r.metrics.pending.Set(0)
	r.metrics.lag.Set(0)
	// The release is recorded just before the buckets are given back, so that it commits before
	// the switch to the new layout can happen: recorded after, its now() could lie after the
	// switch's (TestReshardUnderLoad saw released_at 0.1 ms after switched_at).
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, r.layoutSQL.Released, ten.gen); err != nil {
		return dropLocks(conn, err)
	}
	if err := unlockKeys(conn, r.lockKey, ten.keys); err != nil {
		return dropLocks(conn, err)
	}
	r.log.Info("released the shard's bucket locks for the new layout", "shards", ten.count, "generation", ten.gen)
	return nil
}

// dropLocks closes conn after a failure while the relay was taking or giving back bucket locks:
// which of them the session still holds is then unknown, and a lock left behind would stop every
// later switch. Closing the session releases them all; the loop reconnects.
func dropLocks(conn *pgx.Conn, err error) error {
	_ = conn.Close(context.Background())
	return err
}

func (r *Relay) signalLayout() {
	select {
	case r.layoutWake <- struct{}{}:
	default:
	}
}

// lockKeys takes pg_advisory_lock(key, k) for every k, in the given (ascending) order, on conn.
// It waits, for as long as ctx allows, on a key another session holds; onWait is called once
// before such a wait with the key and the holder's pid. With lease > 0 (a server without
// idle_session_timeout) it enforces the lease itself while it waits (lease.go).
//
// One statement tries every key at once (a shard of one layout owns up to 256 buckets, and every
// round trip here is publishing paused during a reshard). The keys it got past the first one
// held elsewhere are given back before waiting on that one, so a waiting relay holds only keys
// below the one it waits for, as if it had locked one by one: relays never deadlock.
func lockKeys(ctx context.Context, conn *pgx.Conn, key int32, keys []int32, lease time.Duration, onWait func(k, holder int32)) error {
	for len(keys) > 0 {
		var got []bool
		if err := conn.QueryRow(ctx, `SELECT array_agg(pg_try_advisory_lock($1::int4, k) ORDER BY i)
			FROM unnest($2::int4[]) WITH ORDINALITY AS t(k, i)`, key, keys).Scan(&got); err != nil {
			return err
		}
		if len(got) != len(keys) {
			return fmt.Errorf("tried %d locks, got %d answers", len(keys), len(got))
		}
		first := slices.Index(got, false)
		if first < 0 {
			return nil
		}
		var past []int32
		for i := first + 1; i < len(keys); i++ {
			if got[i] {
				past = append(past, keys[i])
			}
		}
		if len(past) > 0 {
			if err := unlockKeys(conn, key, past); err != nil {
				return err
			}
		}
		k := keys[first]
		var holder int32
		_ = conn.QueryRow(ctx, `SELECT coalesce((SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2 LIMIT 1), 0)`, key, k).Scan(&holder)
		if onWait != nil {
			onWait(k, holder)
		}
		if err := waitKey(ctx, conn, key, k, lease); err != nil {
			return err
		}
		keys = keys[first+1:]
	}
	return nil
}

// waitKey waits until conn holds pg_advisory_lock(key, k): blocked in pg_advisory_lock, or, with
// lease > 0, blocked at most leaseTry at a time (lock_timeout), ending in between a holder idle
// for longer than the lease.
func waitKey(ctx context.Context, conn *pgx.Conn, key, k int32, lease time.Duration) error {
	if lease <= 0 {
		_, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1::int4, $2::int4)`, key, k)
		return err
	}
	for {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, fmt.Sprintf("%dms", leaseTry.Milliseconds())); err != nil {
				return err
			}
			// A session lock: it outlives this transaction.
			_, err := tx.Exec(ctx, `SELECT pg_advisory_lock($1::int4, $2::int4)`, key, k)
			return err
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" { // lock_not_available: the lock_timeout ran out
			return err
		}
		if _, err := conn.Exec(ctx, endIdleHolderSQL, key, k, lease.Milliseconds()); err != nil {
			return err
		}
	}
}

// unlockKeys releases pg_advisory_lock(key, k) for every k on conn.
func unlockKeys(conn *pgx.Conn, key int32, keys []int32) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1::int4, k) FROM unnest($2::int4[]) AS k`, key, keys)
	return err
}
