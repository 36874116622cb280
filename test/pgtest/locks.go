package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// LockWait is a backend of the current database waiting for a lock, as PostgreSQL shows it:
// wait_event_type = 'Lock' in pg_stat_activity and a lock not granted in pg_locks.
type LockWait struct {
	PID      int
	Query    string  // what the backend runs (pg_stat_activity.query)
	LockType string  // pg_locks.locktype: relation, transactionid, object (the notification queue's lock at commit), ...
	Mode     string  // the mode it asks for, e.g. AccessExclusiveLock
	Relation string  // the relation it waits for ("" when LockType is not relation)
	Blockers []int   // pg_blocking_pids: the holders and the requests queued ahead of it
	Waited   float64 // seconds it has waited so far by PostgreSQL's clock (pg_locks.waitstart, 14+); -1 before 14
}

// BlockedBy reports whether pid holds (or is queued ahead for) what w waits for.
func (w LockWait) BlockedBy(pid int) bool {
	for _, b := range w.Blockers {
		if b == pid {
			return true
		}
	}
	return false
}

func (w LockWait) String() string {
	return fmt.Sprintf("pid %d waits for %s on %s %s behind %v: %s", w.PID, w.Mode, w.LockType, w.Relation, w.Blockers, w.Query)
}

// LockWaits returns the backends of db's database (other than the caller's) that wait for a lock.
// Waited is measured by PostgreSQL from the start of the wait to the start of this query, so it is
// never more than the wait lasted, however late this query runs.
func LockWaits(ctx context.Context, db *sql.DB) ([]LockWait, error) {
	rows, err := db.QueryContext(ctx, `SELECT a.pid, a.query, l.locktype, l.mode, coalesce(l.relation::regclass::text, ''),
    array_to_string(pg_blocking_pids(a.pid), ','),
    coalesce(extract(epoch FROM now() - (to_jsonb(l)->>'waitstart')::timestamptz)::float8, -1)
FROM pg_catalog.pg_stat_activity a JOIN pg_catalog.pg_locks l ON l.pid = a.pid AND NOT l.granted
WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' AND a.pid <> pg_backend_pid()`)
	if err != nil {
		return nil, fmt.Errorf("lock waits: %w", err)
	}
	defer rows.Close()
	var out []LockWait
	for rows.Next() {
		var (
			w        LockWait
			blockers string
		)
		if err := rows.Scan(&w.PID, &w.Query, &w.LockType, &w.Mode, &w.Relation, &blockers, &w.Waited); err != nil {
			return nil, fmt.Errorf("lock waits: %w", err)
		}
		for _, b := range strings.Split(blockers, ",") {
			if pid, err := strconv.Atoi(b); err == nil {
				w.Blockers = append(w.Blockers, pid)
			}
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// WatchLocks samples LockWaits every interval and passes each sample to see until ctx is done or
// the returned stop is called; stop returns the first error of a sample (nil when ctx ended it)
// and may be called again.
func WatchLocks(ctx context.Context, db *sql.DB, interval time.Duration, see func([]LockWait)) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		for {
			ws, err := LockWaits(ctx, db)
			if ctx.Err() != nil {
				done <- nil
				return
			}
			if err != nil {
				done <- err
				return
			}
			see(ws)
			select {
			case <-ctx.Done():
				done <- nil
				return
			case <-time.After(interval):
			}
		}
	}()
	return sync.OnceValue(func() error { cancel(); return <-done })
}
