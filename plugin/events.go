package plugin

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

func init() { register(20, newEventsCommand) }

// Event is one event as `events` and `published` show it.
type Event struct {
	ID            int64      `json:"id"`
	EventID       string     `json:"eventID"`
	AggregateType string     `json:"aggregateType"`
	AggregateID   string     `json:"aggregateID"`
	EventType     string     `json:"eventType"`
	CreatedAt     time.Time  `json:"createdAt"`
	State         string     `json:"state"`
	Attempts      int        `json:"attempts"`
	Error         *string    `json:"error,omitempty"`
	SentAt        *time.Time `json:"sentAt,omitempty"`
	Skip          *SkipInfo  `json:"skip,omitempty"`
	published     bool
}

// SkipInfo is who skipped an event, when, why and how.
type SkipInfo struct {
	Action    outboxdb.SkipAction `json:"action"`
	Reason    string              `json:"reason"`
	SkippedBy string              `json:"skippedBy"`
	SkippedAt time.Time           `json:"skippedAt"`
}

// eventFilter selects the events `events` lists.
type eventFilter struct {
	aggregate string
	pending   bool
	blocked   bool
	since     time.Duration
	limit     int
	id        int64  // one event by id (published)
	eventID   string // one event by event_id (published)
}

func newEventsCommand(o *Options) *cobra.Command {
	var f eventFilter
	c := &cobra.Command{
		Use:   "events NAME",
		Short: "List events with their state (pending, published, parked, dead-lettered, skipped), attempts and error",
		Long: `List the events of an OutboxRelay's table, newest first (oldest first with --pending or
--blocked), with their state in either tracking mode:

  pending                not published yet
  blocked                it failed (attempts, error); its aggregate's later events wait (row tracking)
  held-back              an earlier event of its aggregate failed (row tracking)
  parked                 it failed and waits in the parked table (snapshot tracking)
  parked-held-back       parked behind an earlier parked event of its aggregate
  published              on its topic
  dead-lettered          on the dead-letter topic (poison under the DeadLetter policy)
  dead-letter-requested  skipped to the dead-letter topic; the relay has not sent it yet
  skipped-dead-lettered  skipped to the dead-letter topic, and sent there
  skipped-dropped        skipped and dropped: never published

Skipped events show who skipped them, when and why.`,
		Args: exactlyOneName,
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.pending && f.blocked {
				return usagef("--pending and --blocked exclude each other")
			}
			if f.limit < 1 || f.limit > 10000 {
				return usagef("--limit %d: want 1 to 10000", f.limit)
			}
			return o.withTarget(cmd.Context(), args[0], func(t *target) error {
				if _, err := t.schemaReady(cmd.Context()); err != nil {
					return err
				}
				evs, err := t.events(cmd.Context(), f)
				if err != nil {
					return err
				}
				return o.print(evs, func(w io.Writer) { eventsTable(w, evs) })
			})
		},
	}
	c.Flags().StringVar(&f.aggregate, "aggregate", "", "only the events of this aggregate id")
	c.Flags().BoolVar(&f.pending, "pending", false, "only events not published yet")
	c.Flags().BoolVar(&f.blocked, "blocked", false, "only events that failed, or wait behind one that failed")
	c.Flags().DurationVar(&f.since, "since", 0, "only events created within this duration (e.g. 1h)")
	c.Flags().IntVar(&f.limit, "limit", 50, "at most this many events")
	return c
}

func exactlyOneName(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usagef("%s needs the name of one OutboxRelay (kubectl outbox %s NAME)", cmd.Name(), cmd.Name())
	}
	return nil
}

// eventsTable writes events as a table.
func eventsTable(w io.Writer, evs []Event) {
	if len(evs) == 0 {
		fmt.Fprintln(w, "No events match.")
		return
	}
	row(w, "ID", "EVENT ID", "AGGREGATE", "TYPE", "CREATED", "STATE", "ATTEMPTS", "ERROR / SKIP")
	for _, e := range evs {
		note := cell(e.Error)
		if e.Skip != nil {
			note = fmt.Sprintf("%s by %s at %s: %s", e.Skip.Action, e.Skip.SkippedBy, cell(e.Skip.SkippedAt), e.Skip.Reason)
		}
		row(w, e.ID, e.EventID, e.AggregateType+"/"+e.AggregateID, e.EventType, e.CreatedAt, e.State, e.Attempts, note)
	}
}

// events reads the events f selects with their state.
func (t *target) events(ctx context.Context, f eventFilter) ([]Event, error) {
	cursor, snapshot, err := t.snapshotTracked(ctx)
	if err != nil {
		return nil, err
	}
	q, args := eventsSQL(t.table, snapshot, cursorXmin(cursor), f)
	rows, err := t.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("reading the events of %s: %w", t.table, err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var (
			e      Event
			fx     = eventFacts{Snapshot: snapshot}
			action sql.NullString
			skip   SkipInfo
			by     sql.NullString
			at     sql.NullTime
			reason sql.NullString
		)
		if err := rows.Scan(&e.ID, &e.EventID, &e.AggregateType, &e.AggregateID, &e.EventType, &e.CreatedAt, &fx.SentAt,
			&fx.Attempts, &fx.Error, &fx.Parked, &fx.ParkedAttempts, &fx.ParkedError, &fx.DeadLettered, &fx.DeadLetteredError,
			&fx.CursorPassed, &fx.AggregateFailed, &action, &reason, &by, &at); err != nil {
			return nil, err
		}
		if action.Valid {
			fx.SkipAction = outboxdb.SkipAction(action.String)
			skip = SkipInfo{Action: fx.SkipAction, Reason: reason.String, SkippedBy: by.String, SkippedAt: at.Time}
			e.Skip = &skip
		}
		d := deriveState(fx)
		e.State, e.Attempts, e.Error, e.SentAt, e.published = d.State, d.Attempts, d.Error, fx.SentAt, d.Published
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if !f.pending && !f.blocked {
		slices.Reverse(out) // read newest first; shown in id order
	}
	return out, nil
}

// cursorXmin returns the lowest xmin of the cursor rows' snapshots: every event no cursor has
// passed belongs to a transaction from there on (or has no transaction id, from before snapshot
// tracking). "" when a cursor row has no snapshot yet.
func cursorXmin(rows []outboxdb.CursorRow) string {
	var lo uint64
	for i, c := range rows {
		if c.Snap == "" {
			return ""
		}
		x, err := strconv.ParseUint(strings.SplitN(c.Snap, ":", 2)[0], 10, 64)
		if err != nil {
			return ""
		}
		if i == 0 || x < lo {
			lo = x
		}
	}
	if len(rows) == 0 {
		return ""
	}
	return strconv.FormatUint(lo, 10)
}

// eventsSQL returns the statement that reads the events f selects, with the facts deriveState
// needs, and its arguments.
func eventsSQL(t outboxdb.Table, snapshot bool, xmin string, f eventFilter) (string, []any) {
	var (
		where []string
		args  []any
	)
	arg := func(v any) string { args = append(args, v); return "$" + strconv.Itoa(len(args)) }
	// An unsent earlier event of the same aggregate failed (row tracking), through the bucket index.
	failedBefore := func(op string) string {
		return `EXISTS (SELECT 1 FROM ` + t.Ident() + ` e WHERE ` + outboxdb.BucketExprOf("e") + ` = ` + outboxdb.BucketExprOf("o") +
			` AND e.aggregate_id = o.aggregate_id AND e.sent_at IS NULL AND e.id ` + op + ` o.id AND (e.attempts <> 0 OR e.error IS NOT NULL))`
	}
	published := `coalesce(` + t.Derived("published") + `(o.id), false)`
	switch {
	case f.id != 0:
		where = append(where, "o.id = "+arg(f.id))
	case f.eventID != "":
		where = append(where, "o.event_id = "+arg(f.eventID)+"::uuid")
	}
	if f.aggregate != "" {
		where = append(where, "o.aggregate_id = "+arg(f.aggregate))
	}
	if f.since > 0 {
		where = append(where, "o.created_at >= now() - make_interval(secs => "+arg(f.since.Seconds())+")")
	}
	switch {
	case f.pending && !snapshot:
		where = append(where, "o.sent_at IS NULL")
	case f.pending:
		cond := "o.sent_at IS NULL AND (p.id IS NOT NULL OR NOT " + published + ")"
		if xmin != "" {
			cond += " AND (p.id IS NOT NULL OR o.txid IS NULL OR o.txid >= " + arg(xmin) + "::xid8)"
		}
		where = append(where, cond)
	case f.blocked && !snapshot:
		where = append(where, "o.sent_at IS NULL AND "+failedBefore("<="))
	case f.blocked:
		where = append(where, "p.id IS NOT NULL")
	}
	cursorPassed, aggFailed := "false", "false"
	if snapshot {
		cursorPassed = `CASE WHEN o.sent_at IS NULL AND p.id IS NULL THEN ` + published + ` ELSE false END`
	} else {
		aggFailed = `CASE WHEN o.sent_at IS NULL THEN ` + failedBefore("<") + ` ELSE false END`
	}
	order := "DESC"
	if f.pending || f.blocked {
		order = "ASC"
	}
	q := `SELECT o.id, o.event_id::text, o.aggregate_type, o.aggregate_id, o.event_type, o.created_at, o.sent_at, o.attempts, o.error,
  p.id IS NOT NULL, coalesce(p.attempts, 0), p.error, d.id IS NOT NULL, d.error,
  ` + cursorPassed + `, ` + aggFailed + `, s.action, s.reason, s.skipped_by, s.skipped_at
FROM ` + t.Ident() + ` o
LEFT JOIN ` + t.Derived("parked") + ` p ON p.id = o.id
LEFT JOIN ` + t.Derived("dead_lettered") + ` d ON d.id = o.id
LEFT JOIN LATERAL (SELECT action, reason, skipped_by, skipped_at FROM ` + t.Derived("skips") + ` k
  WHERE k.id = o.id ORDER BY k.skip_id DESC LIMIT 1) s ON true`
	if len(where) > 0 {
		q += "\nWHERE " + strings.Join(where, " AND ")
	}
	q += "\nORDER BY o.id " + order + " LIMIT " + arg(max(f.limit, 1))
	return q, args
}
