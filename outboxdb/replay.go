// Replays: publishing retained events again (migration 00014_replays.sql).
//
// A user (the `kubectl outbox replay` command) asks for a replay with RequestReplay: the bounds
// are resolved to a range of positions (row ids) and checked against retention, and a row is
// written to <table>_replays. A relay runs it (relay/replay.go): it reads the range in id order,
// publishes the events that were published once more, with the event_id they had and the header
// contract.HeaderReplay, and commits its progress after every batch.

package outboxdb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// ReplayLock is the second key of the session lock, pg_advisory_lock(LockKey(), ReplayLock), a
// relay holds while it runs the table's replays: one relay at a time runs them. Bucket locks use
// 0 to Buckets-1, presence locks PresenceLock and up, the schema's functions -1 to -3.
const ReplayLock = -10

// ReplayState is the state of a replay.
type ReplayState string

// The states of a replay (the CHECK of <table>_replays.state spells the same list).
const (
	ReplayPending   ReplayState = "pending"
	ReplayRunning   ReplayState = "running"
	ReplayDone      ReplayState = "done"
	ReplayFailed    ReplayState = "failed"
	ReplayCancelled ReplayState = "cancelled"
)

// Querier is what the replay functions need of a connection: *pgx.Conn, *pgxpool.Pool and
// pgx.Tx all are one.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// replayEligible is the condition, on the outbox row o, of an event a replay publishes: it was
// published to its own topic. Row tracking: sent, and not dead-lettered. Snapshot tracking: a
// cursor passed it and it is neither parked nor dead-lettered (as <table>_published decides).
// Either way not dropped by hand (<table>_skips, migration 00013: a dropped event's row is marked
// sent, but it was never published).
func replayEligible(p params) string {
	return `NOT EXISTS (SELECT 1 FROM ` + p.Func("skips") + ` sk WHERE sk.id = o.id AND sk.action = 'drop') AND CASE WHEN o.sent_at IS NOT NULL THEN coalesce(o.error NOT LIKE ` + QuoteLiteral(DeadLetteredPrefix+"%") + `, true)
  ELSE EXISTS (SELECT 1 FROM ` + p.Func("relay_cursor") + ` c WHERE ` + BucketExprOf("o") + ` = ANY(c.buckets)
         AND ` + p.Func("cursor_passed") + `(c.snap, c.next_snap, c.last_id, o.id, o.txid))
   AND NOT EXISTS (SELECT 1 FROM ` + p.Func("parked") + ` pk WHERE pk.id = o.id)
   AND NOT EXISTS (SELECT 1 FROM ` + p.Func("dead_lettered") + ` dl WHERE dl.id = o.id)
END`
}

// replayRange is the condition of the rows of a replay's range after $1 up to $2, of the
// aggregate $3 when not NULL.
const replayRange = `o.id > $1::bigint AND o.id <= $2::bigint AND ($3::text IS NULL OR o.aggregate_id = $3::text)`

// ReplaySQL holds the statements a relay runs its replays with.
type ReplaySQL struct {
	// Open ($1 int4 the table's lock key) reports whether a replay waits or runs and no relay
	// holds the replay lock: whether to try it. Relays run it every few seconds; without an open
	// replay it is one probe of a partial index (pg_locks is read only when one is open).
	Open string
	// Lock ($1 int4 the table's lock key) tries the replay lock; Unlock gives it back.
	Lock, Unlock string
	// Claim ($1 the runner's name) marks the oldest open replay running and returns id, last_id,
	// to_id, aggregate_id, topic, rate and replayed; no row when none is open.
	Claim string
	// Fetch ($1 after, $2 to, $3 aggregate id or NULL, $4 limit) returns the columns given to
	// ReplayStatements of the next events to replay, in id order.
	Fetch string
	// Progress ($1 id, $2 last_id, $3 events published) commits a batch; it updates no row when
	// the replay is no longer running (cancelled).
	Progress string
	// Finish ($1 id) and Fail ($1 id, $2 error) end a running replay.
	Finish, Fail string
}

// ReplayStatements returns the replay statements of t; columns is the relay's select list.
func ReplayStatements(t Table, columns string) ReplaySQL {
	p := params{t}
	tbl := p.Func("replays")
	return ReplaySQL{
		Open: `SELECT CASE WHEN EXISTS (SELECT 1 FROM ` + tbl + ` WHERE state IN ('pending', 'running'))
  THEN NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND classid = $1::int4::oid AND objid = (` + strconv.Itoa(ReplayLock) + `)::int4::oid)
  ELSE false END`,
		Lock:   `SELECT pg_try_advisory_lock($1::int4, ` + strconv.Itoa(ReplayLock) + `)`,
		Unlock: `SELECT pg_advisory_unlock($1::int4, ` + strconv.Itoa(ReplayLock) + `)`,
		Claim: `UPDATE ` + tbl + ` SET state = 'running', runner = $1, started_at = coalesce(started_at, now()), updated_at = now()
WHERE id = (SELECT id FROM ` + tbl + ` WHERE state IN ('pending', 'running') ORDER BY id LIMIT 1)
RETURNING id, last_id, to_id, aggregate_id, topic, rate, replayed`,
		Fetch: `SELECT ` + prefixColumns(columns, "o.") + ` FROM ` + t.Ident() + ` o WHERE ` + replayRange + `
  AND ` + replayEligible(p) + ` ORDER BY o.id LIMIT $4`,
		Progress: `UPDATE ` + tbl + ` SET last_id = $2, replayed = replayed + $3, updated_at = now() WHERE id = $1 AND state = 'running'`,
		Finish:   `UPDATE ` + tbl + ` SET state = 'done', finished_at = now(), updated_at = now() WHERE id = $1 AND state = 'running'`,
		Fail:     `UPDATE ` + tbl + ` SET state = 'failed', error = $2, finished_at = now(), updated_at = now() WHERE id = $1 AND state = 'running'`,
	}
}

func prefixColumns(columns, prefix string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

// oldestRetained returns the retained event with the lowest position (nil when the table is empty).
func oldestRetained(ctx context.Context, db Querier, t Table) (*RetainedEvent, error) {
	var e RetainedEvent
	var eid pgtype.UUID
	err := db.QueryRow(ctx, `SELECT o.id, o.event_id, o.created_at, o.tableoid::regclass::text FROM `+t.Ident()+` o ORDER BY o.id LIMIT 1`).
		Scan(&e.ID, &eid, &e.CreatedAt, &e.Partition)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the oldest retained event of %s: %w", t, err)
	}
	e.EventID = eid.String()
	return &e, nil
}

// position resolves a bound to a row id: for the start the first position of the range, for the
// end the last. ok is false when no retained row matches.
func position(ctx context.Context, db Querier, t Table, b Bound, start bool) (id int64, ok bool, err error) {
	var q string
	var arg any
	switch {
	case b.EventID != "":
		q, arg = `SELECT id FROM `+t.Ident()+` WHERE event_id = $1::uuid LIMIT 1`, b.EventID
	case b.ID != 0:
		if start {
			q = `SELECT id FROM ` + t.Ident() + ` WHERE id >= $1::bigint ORDER BY id LIMIT 1`
		} else {
			q = `SELECT id FROM ` + t.Ident() + ` WHERE id <= $1::bigint ORDER BY id DESC LIMIT 1`
		}
		arg = b.ID
	case start:
		q, arg = `SELECT id FROM `+t.Ident()+` WHERE created_at >= $1::timestamptz ORDER BY id LIMIT 1`, b.Time
	default:
		q, arg = `SELECT id FROM `+t.Ident()+` WHERE created_at <= $1::timestamptz ORDER BY id DESC LIMIT 1`, b.Time
	}
	err = db.QueryRow(ctx, q, arg).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("resolving the bound %s: %w", b, err)
	}
	return id, true, nil
}

// PlanReplay resolves and checks req against the table and counts what it would publish; it
// writes nothing (the --dry-run). A start past retention is refused with a *RetentionError
// naming the oldest retained event: a time before the oldest daily partition's day (retention
// drops whole days), a row id below the oldest event's id.
func PlanReplay(ctx context.Context, db Querier, t Table, req ReplayRequest) (ReplayPlan, error) {
	if err := t.Validate(); err != nil {
		return ReplayPlan{}, err
	}
	if err := req.Validate(); err != nil {
		return ReplayPlan{}, err
	}
	plan := ReplayPlan{Topic: req.Topic, AggregateID: req.AggregateID, Rate: req.Rate}
	oldest, err := oldestRetained(ctx, db, t)
	if err != nil {
		return plan, err
	}
	if oldest == nil {
		return plan, &RetentionError{From: req.From, Empty: true}
	}
	plan.OldestRetained = *oldest
	// Retention drops whole daily partitions, oldest first: a start time before the oldest daily
	// partition still there may have lost events to it; one within it or later lost nothing,
	// though no event may be as old (just after midnight, "the last hour" begins on a day whose
	// partition exists and holds no event: not past retention). A table with no daily partition
	// has dropped nothing.
	var oldestDay *time.Time
	if err := db.QueryRow(ctx, `SELECT min(day)::timestamp AT TIME ZONE 'UTC' FROM `+t.Derived("partitions")+`()`).Scan(&oldestDay); err != nil {
		return plan, fmt.Errorf("reading the oldest partition of %s: %w", t, err)
	}
	past := (!req.From.Time.IsZero() && oldestDay != nil && req.From.Time.Before(*oldestDay)) || (req.From.ID != 0 && req.From.ID < oldest.ID)
	if past {
		return plan, &RetentionError{From: req.From, Oldest: *oldest}
	}
	from, ok, err := position(ctx, db, t, req.From, true)
	if err != nil {
		return plan, err
	}
	if !ok {
		if req.From.EventID != "" {
			return plan, fmt.Errorf("no retained event has event_id %s: never written, or dropped with its partition (past retention: the oldest retained event is id %d, event_id %s, created %s)",
				req.From.EventID, oldest.ID, oldest.EventID, oldest.CreatedAt.UTC().Format(time.RFC3339Nano))
		}
		return plan, fmt.Errorf("no event at or after %s in the table: nothing to replay", req.From)
	}
	to := req.To
	var last int64
	if to.IsZero() {
		err = db.QueryRow(ctx, `SELECT max(id) FROM `+t.Ident()).Scan(&last)
	} else {
		var found bool
		last, found, err = position(ctx, db, t, to, false)
		if err == nil && !found {
			if to.EventID != "" {
				return plan, fmt.Errorf("no retained event has event_id %s (--to)", to.EventID)
			}
			return plan, fmt.Errorf("no event at or before %s in the table: nothing to replay", to)
		}
	}
	if err != nil {
		return plan, fmt.Errorf("resolving the end of the replay: %w", err)
	}
	if last < from {
		return plan, fmt.Errorf("the end %s (position %d) comes before the start %s (position %d)", to, last, req.From, from)
	}
	plan.FromID, plan.ToID = from, last
	var agg any
	if req.AggregateID != "" {
		agg = req.AggregateID
	}
	p := params{t}
	rows, err := db.Query(ctx, `SELECT o.aggregate_type, count(*) FROM `+t.Ident()+` o WHERE `+replayRange+`
  AND `+replayEligible(p)+` GROUP BY 1 ORDER BY 1`, from-1, last, agg)
	if err != nil {
		return plan, fmt.Errorf("counting the events to replay: %w", err)
	}
	plan.ByAggregateType = map[string]int64{}
	for rows.Next() {
		var typ string
		var n int64
		if err := rows.Scan(&typ, &n); err != nil {
			rows.Close()
			return plan, err
		}
		plan.ByAggregateType[typ] = n
		plan.Events += n
	}
	if err := rows.Err(); err != nil {
		return plan, fmt.Errorf("counting the events to replay: %w", err)
	}
	plan.NothingToReplay = plan.Events == 0
	return plan, nil
}

// RequestReplay plans req (PlanReplay) and records it for the relays to run; it returns the
// replay as recorded. A range without any published event is refused.
func RequestReplay(ctx context.Context, db Querier, t Table, req ReplayRequest) (Replay, ReplayPlan, error) {
	plan, err := PlanReplay(ctx, db, t, req)
	if err != nil {
		return Replay{}, plan, err
	}
	if plan.NothingToReplay {
		return Replay{}, plan, fmt.Errorf("nothing to replay: no published event between positions %d and %d", plan.FromID, plan.ToID)
	}
	nullable := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	rows, err := db.Query(ctx, `INSERT INTO `+t.Derived("replays")+`
  (requested_by, reason, from_spec, to_spec, from_id, to_id, aggregate_id, topic, rate, total, last_id)
VALUES (coalesce($1::text, current_user), $2::text, $3::text, $4::text, $5::bigint, $6::bigint, $7::text, $8::text, $9::int, $10::bigint, $5::bigint - 1)
RETURNING `+replayColumns, nullable(req.RequestedBy), nullable(req.Reason), req.From.String(), nullable(req.To.String()),
		plan.FromID, plan.ToID, nullable(req.AggregateID), nullable(req.Topic), req.Rate, plan.Events)
	if err != nil {
		return Replay{}, plan, fmt.Errorf("recording the replay: %w", err)
	}
	rs, err := pgx.CollectRows(rows, scanReplay)
	if err != nil {
		return Replay{}, plan, fmt.Errorf("recording the replay: %w", replayTableErr(t, err))
	}
	// The relays look for replays when told (and, as a safety net, every
	// relay.DefaultReplayCheckInterval); a request inside a transaction is announced at its commit.
	if _, err := db.Exec(ctx, `SELECT pg_notify($1, $2)`, t.Channel(), ReplayNotification); err != nil {
		return rs[0], plan, fmt.Errorf("announcing the replay to the relays (it is recorded; they find it within a minute): %w", err)
	}
	return rs[0], plan, nil
}

// ReplayNotification is the payload of the notification on the table's channel that announces a
// replay request to the relays.
const ReplayNotification = "replay"

// Replay is a row of <table>_replays.
type Replay struct {
	ID          int64
	RequestedBy string
	RequestedAt time.Time
	Reason      string
	FromSpec    string
	ToSpec      string
	FromID      int64
	ToID        int64
	AggregateID string
	Topic       string
	Rate        int
	Total       int64
	State       ReplayState
	LastID      int64
	Replayed    int64
	Runner      string
	StartedAt   *time.Time
	UpdatedAt   time.Time
	FinishedAt  *time.Time
	Error       string
}

// Percent is how far the replay went through its range of positions, 0 to 100.
func (r Replay) Percent() float64 {
	if r.State == ReplayDone {
		return 100
	}
	span := r.ToID - r.FromID + 1
	if span <= 0 {
		return 0
	}
	return 100 * float64(r.LastID-r.FromID+1) / float64(span)
}

const replayColumns = `id, requested_by, requested_at, coalesce(reason, ''), from_spec, coalesce(to_spec, ''), from_id, to_id,
  coalesce(aggregate_id, ''), coalesce(topic, ''), rate, total, state, last_id, replayed, coalesce(runner, ''),
  started_at, updated_at, finished_at, coalesce(error, '')`

func scanReplay(row pgx.CollectableRow) (Replay, error) {
	var r Replay
	var state string
	err := row.Scan(&r.ID, &r.RequestedBy, &r.RequestedAt, &r.Reason, &r.FromSpec, &r.ToSpec, &r.FromID, &r.ToID,
		&r.AggregateID, &r.Topic, &r.Rate, &r.Total, &state, &r.LastID, &r.Replayed, &r.Runner,
		&r.StartedAt, &r.UpdatedAt, &r.FinishedAt, &r.Error)
	r.State = ReplayState(state)
	return r, err
}

func replayTableErr(t Table, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("the outbox schema of %s predates replays: apply its migrations (the operator applies them itself): %w", t, err)
	}
	return err
}

// OpenReplaySQL returns the statement that reads the oldest replay not finished: id, state,
// replayed and total; no row when none is (the operator's status.replay).
func OpenReplaySQL(t Table) string {
	return `SELECT id, state, replayed, total FROM ` + t.Derived("replays") + ` WHERE state IN ('pending', 'running') ORDER BY id LIMIT 1`
}

// ListReplays returns the table's replays, the newest first, at most limit of them (0: 100);
// with open, only those pending or running.
func ListReplays(ctx context.Context, db Querier, t Table, open bool, limit int) ([]Replay, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	where := ""
	if open {
		where = ` WHERE state IN ('pending', 'running')`
	}
	rows, err := db.Query(ctx, `SELECT `+replayColumns+` FROM `+t.Derived("replays")+where+` ORDER BY id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("listing replays: %w", replayTableErr(t, err))
	}
	rs, err := pgx.CollectRows(rows, scanReplay)
	if err != nil {
		return nil, fmt.Errorf("listing replays: %w", replayTableErr(t, err))
	}
	return rs, nil
}

// GetReplay returns one replay.
func GetReplay(ctx context.Context, db Querier, t Table, id int64) (Replay, error) {
	rows, err := db.Query(ctx, `SELECT `+replayColumns+` FROM `+t.Derived("replays")+` WHERE id = $1`, id)
	if err != nil {
		return Replay{}, fmt.Errorf("reading replay %d: %w", id, replayTableErr(t, err))
	}
	r, err := pgx.CollectExactlyOneRow(rows, scanReplay)
	if errors.Is(err, pgx.ErrNoRows) {
		return Replay{}, fmt.Errorf("no replay %d in %s", id, t)
	}
	if err != nil {
		return Replay{}, fmt.Errorf("reading replay %d: %w", id, replayTableErr(t, err))
	}
	return r, nil
}

// CancelReplay cancels a pending or running replay: a running one stops after the batch in
// flight (its relay finds it cancelled when it commits that batch). A finished replay is
// refused.
func CancelReplay(ctx context.Context, db Querier, t Table, id int64) error {
	ct, err := db.Exec(ctx, `UPDATE `+t.Derived("replays")+` SET state = 'cancelled', finished_at = now(), updated_at = now()
WHERE id = $1 AND state IN ('pending', 'running')`, id)
	if err != nil {
		return fmt.Errorf("cancelling replay %d: %w", id, replayTableErr(t, err))
	}
	if ct.RowsAffected() == 1 {
		return nil
	}
	r, err := GetReplay(ctx, db, t, id)
	if err != nil {
		return err
	}
	return fmt.Errorf("replay %d is %s already: nothing to cancel", id, r.State)
}
