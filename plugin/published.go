package plugin

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

func init() { register(50, newPublishedCommand) }

// Unknown is what published says of what nobody recorded.
const unknownNotRecorded = "unknown (the relay does not record it)"

// Published answers "did event X reach Kafka?".
type Published struct {
	Event     Event  `json:"event"`
	Published bool   `json:"published"`
	Answer    string `json:"answer"`
	// When it was published: the row's sent_at under row tracking; under snapshot tracking no
	// time is kept per event, only when the cursor of its bucket last moved (PublishedBy).
	PublishedAt *time.Time `json:"publishedAt,omitempty"`
	PublishedBy *time.Time `json:"publishedBy,omitempty"`
	Topic       string     `json:"topic"`
	Partition   string     `json:"partition"`
	Offset      string     `json:"offset"`
	Key         string     `json:"key"`
}

func newPublishedCommand(o *Options) *cobra.Command {
	var event string
	c := &cobra.Command{
		Use:   "published NAME --event ID",
		Short: "Say whether an event was published, when, and where",
		Long: `Say whether an event reached Kafka: published, dead-lettered, dropped by a skip, or not yet;
when (row tracking records the time; snapshot tracking only when the cursor of the event's bucket
moved past it), to which topic and with which key. The relay does not record the partition or
the offset (recording them would cost every event a write): they are shown as unknown. ID is the
event's id or its event_id (a UUID).`,
		Args: exactlyOneName,
		RunE: func(cmd *cobra.Command, args []string) error {
			if event == "" {
				return usagef("published needs --event ID")
			}
			ref, err := parseEventRef(event)
			if err != nil {
				return err
			}
			return o.withTarget(cmd.Context(), args[0], func(t *target) error {
				p, err := t.published(cmd.Context(), ref)
				if err != nil {
					return err
				}
				return o.print(p, func(w io.Writer) { publishedTable(w, p) })
			})
		},
	}
	c.Flags().StringVar(&event, "event", "", "the event: its id, or its event_id (UUID)")
	return c
}

func (t *target) published(ctx context.Context, ref eventRef) (*Published, error) {
	if _, err := t.schemaReady(ctx); err != nil {
		return nil, err
	}
	evs, err := t.events(ctx, eventFilter{id: ref.id, eventID: ref.eventID, limit: 1})
	if err != nil {
		return nil, err
	}
	if len(evs) == 0 {
		return nil, fmt.Errorf("event %s: %w", refString(ref), outboxdb.ErrNoSuchEvent)
	}
	e := evs[0]
	p := &Published{Event: e, Published: e.published, Key: e.AggregateID, Partition: unknownNotRecorded, Offset: unknownNotRecorded}
	p.Topic = topicOf(t.relay, e.AggregateType)
	dead := e.State == StateDeadLettered || e.State == StateSkippedDeadLettered || e.State == StateDeadLetterRequested
	if dead {
		p.Topic = deadLetterTopic(t.relay)
	}
	switch {
	case e.State == StateSkippedDropped:
		p.Answer = "no: dropped by a skip, never published"
		p.Partition, p.Offset, p.Topic = "none", "none", "none"
	case !e.published:
		p.Answer = "no: " + e.State
		p.Partition, p.Offset = "none yet", "none yet"
	case dead:
		p.Answer = "yes, to the dead-letter topic"
	default:
		p.Answer = "yes"
	}
	if p.Topic == "" {
		p.Topic = "none (no topic for aggregate type " + e.AggregateType + ")"
	}
	if !e.published {
		return p, nil
	}
	if e.SentAt != nil {
		p.PublishedAt = e.SentAt
		return p, nil
	}
	// Snapshot tracking: a dead-lettered event has its time; any other only its cursor's.
	var at time.Time
	err = t.db.QueryRowContext(ctx, `SELECT dead_lettered_at FROM `+t.table.Derived("dead_lettered")+` WHERE id = $1`, e.ID).Scan(&at)
	switch {
	case err == nil:
		p.PublishedAt = &at
		return p, nil
	case !errors.Is(err, sql.ErrNoRows):
		return nil, err
	}
	var bucket int16
	if err := t.db.QueryRowContext(ctx, `SELECT `+outboxdb.BucketExpr+` FROM (SELECT $1::text AS aggregate_id) AS a`, e.AggregateID).Scan(&bucket); err != nil {
		return nil, err
	}
	cursor, _, err := t.snapshotTracked(ctx)
	if err != nil {
		return nil, err
	}
	for _, c := range cursor {
		if slices.Contains(c.Buckets, bucket) {
			by := c.UpdatedAt
			p.PublishedBy = &by
		}
	}
	return p, nil
}

func refString(ref eventRef) string {
	if ref.id != 0 {
		return fmt.Sprint(ref.id)
	}
	return ref.eventID
}

func publishedTable(w io.Writer, p *Published) {
	e := p.Event
	row(w, "Event:", fmt.Sprintf("%d (event_id %s), %s/%s %s, created %s", e.ID, e.EventID, e.AggregateType, e.AggregateID, e.EventType, cell(e.CreatedAt)))
	row(w, "Published:", p.Answer)
	switch {
	case p.PublishedAt != nil:
		row(w, "When:", cell(*p.PublishedAt))
	case p.PublishedBy != nil:
		row(w, "When:", "unknown to the second (snapshot tracking keeps no time per event); by "+cell(*p.PublishedBy)+", when the cursor of its bucket last moved")
	}
	row(w, "Topic:", p.Topic)
	row(w, "Key:", p.Key)
	row(w, "Partition:", p.Partition)
	row(w, "Offset:", p.Offset)
	if e.Skip != nil {
		row(w, "Skipped:", fmt.Sprintf("%s by %s at %s: %s", e.Skip.Action, e.Skip.SkippedBy, cell(e.Skip.SkippedAt), e.Skip.Reason))
	}
	if e.Error != nil {
		row(w, "Last error:", *e.Error)
	}
}
