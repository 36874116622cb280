package outboxdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Defaults of partition upkeep, for the operator (spec.partitions, whose CRD markers spell the
// same values: TestValidOutboxRelaysAreAcceptedWithDefaults) and `relay partitions`.
const (
	// DefaultPremakeDays is how many UTC days after today have their partition created ahead.
	DefaultPremakeDays = 3
	// DefaultRetention is how long a daily partition is kept after its day ended.
	DefaultRetention = 7 * 24 * time.Hour
)

// ErrPartitionHasPending is returned by DropPartition for a partition that still holds unsent rows.
var ErrPartitionHasPending = errors.New("partition still holds unsent events")

// ErrPartitionBusy is returned by DropPartition when a transaction still used the table and the
// lock the drop needs was not granted within its timeout; the partition is kept, try again later.
var ErrPartitionBusy = errors.New("a transaction still uses the table")

// Partition is one partition of the outbox table.
type Partition struct {
	Name       string
	Day        time.Time // UTC midnight; zero for the default partition
	Default    bool
	HasPending bool
}

// EnsurePartitions creates the daily partitions for the UTC days from..to (inclusive) that do not
// exist yet, and returns the names it created.
func EnsurePartitions(ctx context.Context, db *sql.DB, t Table, from, to time.Time) ([]string, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, fmt.Sprintf("SELECT * FROM %s($1::date, $2::date)", t.Derived("create_partitions")),
		from.UTC().Format(time.DateOnly), to.UTC().Format(time.DateOnly))
	if err != nil {
		return nil, fmt.Errorf("create partitions of %s: %w", t, err)
	}
	return scanNames(rows)
}

// ListPartitions returns the daily partitions, oldest first, then the default partition.
func ListPartitions(ctx context.Context, db *sql.DB, t Table) ([]Partition, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, fmt.Sprintf("SELECT name, day, has_pending FROM %s()", t.Derived("partitions")))
	if err != nil {
		return nil, fmt.Errorf("list partitions of %s: %w", t, err)
	}
	defer rows.Close()
	var out []Partition
	for rows.Next() {
		var p Partition
		if err := rows.Scan(&p.Name, &p.Day, &p.HasPending); err != nil {
			return nil, err
		}
		p.Day = p.Day.UTC()
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var pending bool
	if err := db.QueryRowContext(ctx, fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE sent_at IS NULL)",
		t.Derived("default"))).Scan(&pending); err != nil {
		return nil, fmt.Errorf("list partitions of %s: %w", t, err)
	}
	return append(out, Partition{Name: t.Name + "_default", Default: true, HasPending: pending}), nil
}

// DroppablePartitions returns the daily partitions whose whole day ended more than retention
// ago and whose rows are all sent.
func DroppablePartitions(ctx context.Context, db *sql.DB, t Table, retention time.Duration) ([]string, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, fmt.Sprintf("SELECT * FROM %s(make_interval(secs => $1))", t.Derived("droppable_partitions")),
		retention.Seconds())
	if err != nil {
		return nil, fmt.Errorf("droppable partitions of %s: %w", t, err)
	}
	return scanNames(rows)
}

// DropPartition drops one daily partition unless a row in it is unsent, in which case it returns
// ErrPartitionHasPending and keeps it. The drop needs the outbox's ACCESS EXCLUSIVE lock for an
// instant; it waits for it at most 250 ms (inserts that arrive meanwhile queue behind it) and
// returns ErrPartitionBusy past that: a transaction still uses the table, try again later.
func DropPartition(ctx context.Context, db *sql.DB, t Table, name string) error {
	if err := t.Validate(); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, fmt.Sprintf("SELECT %s($1)", t.Derived("drop_partition")), name)
	return dropError(name, err)
}

// dropError translates what PostgreSQL said when a partition was not dropped.
func dropError(name string, err error) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == "55006":
		return fmt.Errorf("drop %s: %w", name, ErrPartitionHasPending)
	case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available
		return fmt.Errorf("drop %s: the lock it needs was not granted within the lock timeout: %w", name, ErrPartitionBusy)
	}
	return fmt.Errorf("drop partition %s: %w", name, err)
}

func scanNames(rows *sql.Rows) ([]string, error) {
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// Pruned is what PrunePartitions did with the partitions past retention.
type Pruned struct {
	Dropped []string // dropped
	Pending []string // kept: a row in it is unsent (inserted late, or marked unsent again)
	Busy    []string // kept for now: a transaction used the table (ErrPartitionBusy); try later
}

// PrunePartitions drops the daily partitions whose day ended more than retention ago and whose
// rows are all sent: the one loop behind the operator's upkeep and `relay partitions prune`. It
// stops at the first error other than the two kinds of partition it keeps, returning what it
// did until then.
func PrunePartitions(ctx context.Context, db *sql.DB, t Table, retention time.Duration) (Pruned, error) {
	var p Pruned
	names, err := DroppablePartitions(ctx, db, t, retention)
	if err != nil {
		return p, err
	}
	for _, name := range names {
		switch err := DropPartition(ctx, db, t, name); {
		case errors.Is(err, ErrPartitionHasPending):
			p.Pending = append(p.Pending, name)
		case errors.Is(err, ErrPartitionBusy):
			p.Busy = append(p.Busy, name)
		case err != nil:
			return p, err
		default:
			p.Dropped = append(p.Dropped, name)
		}
	}
	return p, nil
}
