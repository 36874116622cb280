package plugin

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// What `status` reads from the database, each part in one function, with its table.

// Shards is the table's layout and who holds its buckets.
type Shards struct {
	Count      int32 `json:"count"`
	Generation int64 `json:"generation"`
	// Requested is the shard count a change in progress moves to (0: none).
	Requested   int32         `json:"requested,omitempty"`
	HeldBuckets int           `json:"heldBuckets"`
	Relays      []ShardHolder `json:"relays"`
}

// ShardHolder is one relay session: the shard index whose presence lock it holds, how many
// buckets it holds, and who it is (pg_stat_activity).
type ShardHolder struct {
	Shard       *int32    `json:"shard,omitempty"`
	Buckets     int       `json:"buckets"`
	PID         int32     `json:"pid"`
	Application string    `json:"application"`
	Client      string    `json:"client"`
	Since       time.Time `json:"since"`
	// KafkaState is the state the relay reports in its application_name ("" when none).
	KafkaState string `json:"kafkaState,omitempty"`
}

func (t *target) readShards(ctx context.Context, s *Status, _ bool) error {
	l, err := outboxdb.ReadLayout(ctx, t.db, t.table)
	if err != nil {
		return err
	}
	if l != nil {
		s.Shards.Count, s.Shards.Generation, s.Shards.Requested = l.ShardCount, l.Generation, l.Requested
	}
	locks, err := outboxdb.ReadRelayLocks(ctx, t.db, t.table)
	if err != nil {
		return err
	}
	s.Shards.HeldBuckets = len(locks.Buckets)
	byPID := map[int32]*ShardHolder{}
	holder := func(pid int32) *ShardHolder {
		if h := byPID[pid]; h != nil {
			return h
		}
		h := &ShardHolder{PID: pid}
		byPID[pid] = h
		return h
	}
	for shard, pid := range locks.Present {
		holder(pid).Shard = &shard
	}
	for _, pid := range locks.Buckets {
		holder(pid).Buckets++
	}
	pids := make([]int32, 0, len(byPID))
	for pid := range byPID {
		pids = append(pids, pid)
	}
	rows, err := t.db.QueryContext(ctx, `SELECT pid, coalesce(application_name, ''), coalesce(host(client_addr), 'local'), backend_start
FROM pg_stat_activity WHERE pid = ANY($1::int4[])`, pids)
	if err != nil {
		return fmt.Errorf("reading the relays' sessions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			pid   int32
			since sql.NullTime
			h     ShardHolder
		)
		if err := rows.Scan(&pid, &h.Application, &h.Client, &since); err != nil {
			return err
		}
		b := byPID[pid]
		b.Application, b.Client, b.Since, b.KafkaState = h.Application, h.Client, since.Time, contract.RelayState(h.Application)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, h := range byPID {
		s.Shards.Relays = append(s.Shards.Relays, *h)
	}
	slices.SortFunc(s.Shards.Relays, func(a, b ShardHolder) int {
		switch {
		case a.Shard != nil && b.Shard != nil && *a.Shard != *b.Shard:
			return int(*a.Shard - *b.Shard)
		case (a.Shard == nil) != (b.Shard == nil):
			if a.Shard == nil {
				return 1
			}
			return -1
		}
		return int(a.PID - b.PID)
	})
	return nil
}

func shardsTable(w io.Writer, s *Status) {
	layout := "no layout yet (no relay has started)"
	if s.Shards.Generation > 0 {
		layout = fmt.Sprintf("%d, layout generation %d", s.Shards.Count, s.Shards.Generation)
	}
	layout += fmt.Sprintf("; %d of %d buckets held", s.Shards.HeldBuckets, outboxdb.Buckets)
	if s.Shards.Requested != 0 {
		layout += fmt.Sprintf("; moving to %d shards", s.Shards.Requested)
	}
	if len(s.Shards.Relays) == 0 {
		layout += "; no relay is connected"
	}
	title(w, "Shards:", layout)
	if len(s.Shards.Relays) == 0 {
		return
	}
	row(w, "SHARD", "BUCKETS", "PID", "CLIENT", "CONNECTED", "KAFKA", "APPLICATION")
	for _, h := range s.Shards.Relays {
		shard := "?"
		if h.Shard != nil {
			shard = fmt.Sprint(*h.Shard)
		}
		kafka := h.KafkaState
		if kafka == "" {
			kafka = "ok"
		}
		row(w, shard, h.Buckets, h.PID, h.Client, h.Since, kafka, h.Application)
	}
}

// Backlog is the events not yet published, measured as the operator measures them: exact up to
// outboxdb.DefaultBacklogCountLimit, estimated past it.
type Backlog struct {
	Pending      string  `json:"pending"`
	PendingCount int64   `json:"pendingCount"`
	Exact        bool    `json:"exact"`
	LagSeconds   float64 `json:"lagSeconds"`
	Lag          string  `json:"lag"`
	Parked       int64   `json:"parked"`
}

func (t *target) readBacklog(ctx context.Context, s *Status, _ bool) error {
	// The backlog statement is planned as the relays plan it (outboxdb.PlanInIDOrder), on a
	// session of its own whose settings are reset afterwards.
	conn, err := t.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, outboxdb.PlanInIDOrder); err != nil {
		return err
	}
	defer func() { _, _ = conn.ExecContext(context.Background(), "RESET ALL") }()
	q := outboxdb.TrackedBacklogSQL(t.table, s.Tracking, false)
	b := outboxdb.Backlog{Limit: outboxdb.DefaultBacklogCountLimit}
	if err := conn.QueryRowContext(ctx, q, outboxdb.BacklogArgs(nil, b.Limit)...).Scan(b.Dest()...); err != nil {
		return fmt.Errorf("measuring the backlog of %s: %w", t.table, err)
	}
	s.Backlog = backlogOf(b)
	if s.Tracking.Parks() {
		if err := conn.QueryRowContext(ctx, outboxdb.ParkedCountSQL(t.table)).Scan(&s.Backlog.Parked); err != nil {
			return err
		}
	}
	return nil
}

// backlogOf describes a backlog measurement.
func backlogOf(b outboxdb.Backlog) Backlog {
	out := Backlog{PendingCount: b.Pending(), LagSeconds: b.OldestAgeSeconds}
	out.Exact = b.Counted < int64(b.Limit)
	out.Pending = fmt.Sprint(out.PendingCount)
	if !out.Exact {
		out.Pending = fmt.Sprintf("about %d (estimated past the first %d counted)", out.PendingCount, b.Limit)
	}
	out.Lag = age(time.Duration(b.OldestAgeSeconds * float64(time.Second)))
	return out
}

// BlockedAggregate is an aggregate whose first waiting event failed.
type BlockedAggregate struct {
	AggregateID  string    `json:"aggregateID"`
	Events       int64     `json:"events"`
	FirstID      int64     `json:"firstID"`
	FirstEventID string    `json:"firstEventID"`
	Attempts     int       `json:"attempts"`
	Error        *string   `json:"error,omitempty"`
	Since        time.Time `json:"since"`
}

// Bounds of the blocked aggregates status reads: row tracking finds them among the oldest
// blockedScanLimit pending events (their aggregates' first events, the ones that matter); status
// lists the first blockedShown.
const (
	blockedScanLimit = 100_000
	blockedShown     = 20
)

func (t *target) readBlocked(ctx context.Context, s *Status, snapshot bool) error {
	var q string
	if snapshot {
		s.BlockedScan = "every parked event"
		q = `SELECT aggregate_id, count(*), min(id), (array_agg(event_id::text ORDER BY id))[1], (array_agg(attempts ORDER BY id))[1],
  (array_agg(error ORDER BY id))[1], min(parked_at)
FROM ` + t.table.Derived("parked") + ` GROUP BY aggregate_id ORDER BY min(id) LIMIT $1`
	} else {
		s.BlockedScan = fmt.Sprintf("the oldest %d pending events", blockedScanLimit)
		q = `SELECT aggregate_id, count(*), min(id), (array_agg(event_id::text ORDER BY id))[1], (array_agg(attempts ORDER BY id))[1],
  (array_agg(error ORDER BY id))[1], min(created_at)
FROM (SELECT id, event_id, aggregate_id, attempts, error, created_at FROM ` + t.table.Ident() + `
      WHERE sent_at IS NULL ORDER BY id LIMIT ` + fmt.Sprint(blockedScanLimit) + `) p
WHERE attempts <> 0 OR error IS NOT NULL GROUP BY aggregate_id ORDER BY min(id) LIMIT $1`
	}
	rows, err := t.db.QueryContext(ctx, q, blockedShown)
	if err != nil {
		return fmt.Errorf("reading the blocked aggregates of %s: %w", t.table, err)
	}
	defer rows.Close()
	s.Blocked = []BlockedAggregate{}
	for rows.Next() {
		var b BlockedAggregate
		if err := rows.Scan(&b.AggregateID, &b.Events, &b.FirstID, &b.FirstEventID, &b.Attempts, &b.Error, &b.Since); err != nil {
			return err
		}
		b.Attempts = max(b.Attempts, 0)
		s.Blocked = append(s.Blocked, b)
	}
	return rows.Err()
}

func blockedTable(w io.Writer, s *Status) {
	what := "Blocked aggregates"
	if s.Tracking.Parks() {
		what = "Parked aggregates"
	}
	if len(s.Blocked) == 0 {
		title(w, what+":", "none (in "+s.BlockedScan+")")
		return
	}
	title(w, what+":", fmt.Sprintf("%d shown (in %s); kubectl outbox events NAME --aggregate ID shows one", len(s.Blocked), s.BlockedScan))
	row(w, "AGGREGATE", "EVENTS", "FIRST ID", "FIRST EVENT ID", "ATTEMPTS", "SINCE", "FIRST ERROR")
	for _, b := range s.Blocked {
		row(w, b.AggregateID, b.Events, b.FirstID, b.FirstEventID, b.Attempts, b.Since, b.Error)
	}
}

// Partitions are the outbox table's partitions.
type Partitions struct {
	Count      int         `json:"count"`
	Oldest     string      `json:"oldest"`
	Newest     string      `json:"newest"`
	TotalBytes int64       `json:"totalBytes"`
	List       []Partition `json:"list"`
}

// Partition is one partition: its day ("" for the default one), size, estimated rows and whether
// it may still hold an event not yet published.
type Partition struct {
	Name          string `json:"name"`
	Day           string `json:"day,omitempty"`
	Bytes         int64  `json:"bytes"`
	EstimatedRows int64  `json:"estimatedRows"`
	HasPending    bool   `json:"hasPending"`
}

func (t *target) readPartitions(ctx context.Context, s *Status, _ bool) error {
	parts, err := outboxdb.ListPartitions(ctx, t.db, t.table)
	if err != nil {
		return err
	}
	rows, err := t.db.QueryContext(ctx, `SELECT c.relname::text, pg_total_relation_size(c.oid), greatest(c.reltuples, 0)::int8
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass`, t.table.Ident())
	if err != nil {
		return fmt.Errorf("reading the partitions' sizes: %w", err)
	}
	defer rows.Close()
	type size struct{ bytes, rows int64 }
	sizes := map[string]size{}
	for rows.Next() {
		var (
			name string
			sz   size
		)
		if err := rows.Scan(&name, &sz.bytes, &sz.rows); err != nil {
			return err
		}
		sizes[name] = sz
	}
	if err := rows.Err(); err != nil {
		return err
	}
	s.Partitions.List = []Partition{}
	for _, p := range parts {
		sz := sizes[p.Name]
		q := Partition{Name: p.Name, Bytes: sz.bytes, EstimatedRows: sz.rows, HasPending: p.HasPending}
		if !p.Default {
			q.Day = p.Day.Format(time.DateOnly)
			if s.Partitions.Oldest == "" {
				s.Partitions.Oldest = q.Day
			}
			s.Partitions.Newest = q.Day
			s.Partitions.Count++
		}
		s.Partitions.TotalBytes += sz.bytes
		s.Partitions.List = append(s.Partitions.List, q)
	}
	return nil
}

func partitionsTable(w io.Writer, s *Status) {
	p := s.Partitions
	title(w, "Partitions:", fmt.Sprintf("%d daily, %s to %s, %s in all", p.Count, cell(p.Oldest), cell(p.Newest), bytesIEC(p.TotalBytes)))
	row(w, "PARTITION", "DAY", "SIZE", "ROWS (EST.)", "UNPUBLISHED")
	for _, q := range p.List {
		unpublished := "no"
		if q.HasPending {
			unpublished = "yes"
		}
		row(w, q.Name, q.Day, bytesIEC(q.Bytes), q.EstimatedRows, unpublished)
	}
}

// Reshard is the last change of the shard layout (<table>_relay_layout).
type Reshard struct {
	From        int32      `json:"from"`
	To          int32      `json:"to"`
	RequestedAt time.Time  `json:"requestedAt"`
	SwitchedAt  time.Time  `json:"switchedAt"`
	ResumedAt   *time.Time `json:"resumedAt,omitempty"`
	// Pause is how long publishing stopped, "" while the new layout does not hold every bucket.
	Pause string `json:"pause,omitempty"`
}

func (t *target) readReshard(ctx context.Context, s *Status, _ bool) error {
	l, err := outboxdb.ReadLayout(ctx, t.db, t.table)
	if err != nil || l == nil || l.Previous == 0 {
		return err // none yet: the first layout is not a reshard
	}
	r := &Reshard{From: l.Previous, To: l.ShardCount, RequestedAt: l.RequestedAt, SwitchedAt: l.SwitchedAt}
	if !l.ResumedAt.IsZero() {
		r.ResumedAt = &l.ResumedAt
	}
	if d, ok := l.Pause(); ok {
		r.Pause = d.Round(time.Millisecond).String()
	}
	s.LastReshard = r
	return nil
}

func reshardTable(w io.Writer, r *Reshard) {
	pause := r.Pause
	if pause == "" {
		pause = "not over: the new layout does not hold every bucket yet"
	}
	title(w, "Last reshard:", fmt.Sprintf("%d -> %d shards, requested %s, switched %s, publishing paused %s",
		r.From, r.To, cell(r.RequestedAt), cell(r.SwitchedAt), pause))
}
