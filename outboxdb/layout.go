package outboxdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// PresenceLock is the second key of the session lock a relay of shard index k holds while it
// runs, pg_advisory_lock(LockKey(), PresenceLock+k): one relay per shard index, and a sign the
// relay is up (standing by or publishing). Bucket locks use the keys 0 to Buckets-1.
const PresenceLock = Buckets

// LayoutNotification is the payload of the notification on the table's channel that announces a
// layout change or request (row inserts notify with an empty payload).
const LayoutNotification = "layout"

// Layout is the row of <table>_relay_layout: the shard count the relays run and the change in
// progress (see the migration 00004_relay_layout.sql and docs/architecture.md, "Resharding").
type Layout struct {
	ShardCount int32
	Generation int64
	// Requested is the shard count a change in progress moves to; 0 when none.
	Requested int32
	// The last change: its previous shard count (0 for the first layout), when it was requested,
	// when the first relay of the old layout stopped publishing, when the row switched, and when
	// every bucket was held again (zero until then).
	Previous    int32
	RequestedAt time.Time
	ReleasedAt  time.Time
	SwitchedAt  time.Time
	ResumedAt   time.Time

	scan [4]sql.NullTime
}

// Pause is how long publishing stopped during the last change: from the first relay of the old
// layout releasing its buckets to every bucket held by the new layout. ok is false while the
// new layout does not yet hold every bucket.
func (l *Layout) Pause() (d time.Duration, ok bool) {
	if l == nil || l.ResumedAt.IsZero() || l.ReleasedAt.IsZero() {
		return 0, false
	}
	return max(l.ResumedAt.Sub(l.ReleasedAt), 0), true
}

// LayoutSQL holds the statements of the layout protocol for one table. Each takes its arguments
// as $1, $2, ...; the relay runs them with pgx, the operator with database/sql.
type LayoutSQL struct {
	// Read returns the layout row's columns in the order of Layout's Scan.
	Read string
	// Request ($1 int4: the shard count) asks the current layout's relays to stand down.
	Request string
	// Switch ($1 int4) makes the layout current if no relay holds a bucket; returns a boolean.
	Switch string
	// Released ($1 int8: the generation) records the first relay of a layout stopping.
	Released string
	// Locked ($1 int8) records, when every bucket is held, that the pause is over.
	Locked string
	// Report ($1 int8) claims the report of generation $1 once the pause is over: true for
	// exactly one caller.
	Report string
	// Locks lists the table's granted relay locks: key (0-255 a bucket, PresenceLock+k the
	// presence of shard index k) and pid.
	Locks string
}

// LayoutStatements returns the layout statements of t.
func LayoutStatements(t Table) LayoutSQL {
	p := params{t}
	return LayoutSQL{
		Read: `SELECT shard_count, generation, coalesce(requested_shard_count, 0), coalesce(previous_shard_count, 0),
       requested_at, released_at, switched_at, resumed_at FROM ` + p.Func("relay_layout"),
		Request:  `SELECT ` + p.Func("request_layout") + `($1::int4)`,
		Switch:   `SELECT ` + p.Func("switch_layout") + `($1::int4)`,
		Released: `SELECT ` + p.Func("layout_released") + `($1::int8)`,
		Locked:   `SELECT ` + p.Func("layout_locked") + `($1::int8)`,
		Report:   `SELECT ` + p.Func("layout_report") + `($1::int8)`,
		Locks: `SELECT objid::int8, pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 2
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = (` + strconv.Itoa(int(t.LockKey())) + `)::int4::oid AND objid < ` + strconv.Itoa(PresenceLock+Buckets),
	}
}

// Dest returns the scan destinations of LayoutSQL.Read; call Fill after scanning.
func (l *Layout) Dest() []any {
	l.scan = [4]sql.NullTime{}
	return []any{&l.ShardCount, &l.Generation, &l.Requested, &l.Previous, &l.scan[0], &l.scan[1], &l.scan[2], &l.scan[3]}
}

// Fill copies the scanned times into the Layout.
func (l *Layout) Fill() {
	for i, dst := range []*time.Time{&l.RequestedAt, &l.ReleasedAt, &l.SwitchedAt, &l.ResumedAt} {
		*dst = time.Time{}
		if l.scan[i].Valid {
			*dst = l.scan[i].Time
		}
	}
}

// ReadLayout returns the table's layout, or nil when none was set yet.
func ReadLayout(ctx context.Context, db *sql.DB, t Table) (*Layout, error) {
	var l Layout
	err := db.QueryRowContext(ctx, LayoutStatements(t).Read).Scan(l.Dest()...)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the shard layout of %s: %w", t, err)
	}
	l.Fill()
	return &l, nil
}

// RequestLayout asks the relays of the current layout to stop publishing so that a layout of n
// shards can take over; n equal to the current layout cancels a request.
func RequestLayout(ctx context.Context, db *sql.DB, t Table, n int32) error {
	if _, err := db.ExecContext(ctx, LayoutStatements(t).Request, n); err != nil {
		return fmt.Errorf("requesting %d shards for %s: %w", n, t, err)
	}
	return nil
}

// SwitchLayout makes n the table's layout if no relay holds a bucket, and reports whether n is
// now the layout. It proves in PostgreSQL that no relay of the old layout still publishes: it
// takes every bucket lock in the transaction that changes the layout.
func SwitchLayout(ctx context.Context, db *sql.DB, t Table, n int32) (bool, error) {
	var ok bool
	if err := db.QueryRowContext(ctx, LayoutStatements(t).Switch, n).Scan(&ok); err != nil {
		return false, fmt.Errorf("switching %s to %d shards: %w", t, n, err)
	}
	return ok, nil
}

// ClaimLayoutReport reports whether the caller is the first to report the change that made
// generation gen, once its pause is over; it is true once per change.
func ClaimLayoutReport(ctx context.Context, db *sql.DB, t Table, gen int64) (bool, error) {
	var ok bool
	if err := db.QueryRowContext(ctx, LayoutStatements(t).Report, gen).Scan(&ok); err != nil {
		return false, fmt.Errorf("claiming the report of the layout change of %s: %w", t, err)
	}
	return ok, nil
}

// RelayLocks is who holds the table's relay locks right now.
type RelayLocks struct {
	// Buckets maps each held bucket to the backend pid holding it.
	Buckets map[int16]int32
	// Present maps each shard index with a running relay to its backend pid.
	Present map[int32]int32
}

// Holders returns the distinct pids holding buckets, sorted.
func (l RelayLocks) Holders() []int32 {
	seen := map[int32]bool{}
	var out []int32
	for _, pid := range l.Buckets {
		if !seen[pid] {
			seen[pid] = true
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// ReadRelayLocks reads the table's granted bucket and presence locks from pg_locks.
func ReadRelayLocks(ctx context.Context, db *sql.DB, t Table) (RelayLocks, error) {
	out := RelayLocks{Buckets: map[int16]int32{}, Present: map[int32]int32{}}
	rows, err := db.QueryContext(ctx, LayoutStatements(t).Locks)
	if err != nil {
		return out, fmt.Errorf("reading the relay locks of %s: %w", t, err)
	}
	defer rows.Close()
	for rows.Next() {
		var key int64
		var pid int32
		if err := rows.Scan(&key, &pid); err != nil {
			return out, err
		}
		if key < Buckets {
			out.Buckets[int16(key)] = pid
		} else {
			out.Present[int32(key-PresenceLock)] = pid
		}
	}
	return out, rows.Err()
}

// Reshard moves the table to a layout of n shards and waits for it: it requests n, then tries
// the switch every interval until the relays of the old layout have stood down, and returns
// the layout once it is switched. The operator takes the same two steps across reconciles.
func Reshard(ctx context.Context, db *sql.DB, t Table, n int32, interval time.Duration) (*Layout, error) {
	if err := RequestLayout(ctx, db, t, n); err != nil {
		return nil, err
	}
	if _, err := RetrySwitch(ctx, RealClock{}, db, t, n, interval, 0); err != nil {
		return nil, err
	}
	return ReadLayout(ctx, db, t)
}

// Clock is the time the polling loops below read and wait on: k8s.io/utils/clock.Clock
// satisfies it (the operator passes its reconciler's), tests pass a fake one.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// RealClock is the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// After returns time.After(d).
func (RealClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// RetrySwitch tries SwitchLayout every interval until it succeeds (true), wait has passed
// (false; wait <= 0 waits for as long as ctx allows) or ctx ends (its error). The relays of the
// old layout usually stand down within milliseconds of a request, and every millisecond between
// their release and the switch is publishing paused.
func RetrySwitch(ctx context.Context, clk Clock, db *sql.DB, t Table, n int32, interval, wait time.Duration) (bool, error) {
	deadline := clk.Now().Add(wait)
	for {
		ok, err := SwitchLayout(ctx, db, t, n)
		if err != nil || ok || (wait > 0 && clk.Now().After(deadline)) {
			return ok, err
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-clk.After(interval):
		}
	}
}

// WaitForPause polls the layout every interval until the change that made generation gen is
// over (every bucket held by the new layout) and returns the layout, whose Pause is then known.
// It fails when ctx ends first or the layout moved on to another generation.
func WaitForPause(ctx context.Context, clk Clock, db *sql.DB, t Table, gen int64, interval time.Duration) (*Layout, error) {
	for {
		l, err := ReadLayout(ctx, db, t)
		if err != nil {
			return nil, err
		}
		if l == nil || l.Generation != gen {
			return nil, fmt.Errorf("the shard layout of %s is not at generation %d any more", t, gen)
		}
		if _, ok := l.Pause(); ok {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-clk.After(interval):
		}
	}
}
