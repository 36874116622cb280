package plugin

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

func init() { register(40, newSkipCommand) }

func newSkipCommand(o *Options) *cobra.Command {
	var (
		event        string
		toDeadLetter bool
		drop         bool
		reason       string
	)
	c := &cobra.Command{
		Use:   `skip NAME --event ID (--to-dead-letter | --drop) --reason "..."`,
		Short: "Skip an event: send it to the dead-letter topic, or drop it (recorded with who, when and why)",
		Long: `Skip one event that is not published yet; the only way an event is ever dropped.

  --to-dead-letter  the relay publishes the event to the relay's dead-letter topic instead of its
                    own, in order within its aggregate, and the aggregate's later events follow
                    (the OutboxRelay needs spec.poisonEvents.policy DeadLetter and a deadLetterTopic)
  --drop            the event is marked done without being published anywhere

The skip is recorded in <table>_skips with who (your Kubernetes user name), when, why (--reason,
required), and the event's attempts and error before; events shows it. The relays are told to end
the aggregate's backoff, so its later events follow at once. ID is the event's id (a number) or its
event_id (a UUID; found by reading the table, slower).`,
		Args: exactlyOneName,
		RunE: func(cmd *cobra.Command, args []string) error {
			if toDeadLetter == drop {
				return usagef("say what to do with the event: exactly one of --to-dead-letter and --drop")
			}
			if strings.TrimSpace(reason) == "" {
				return usagef("--reason is required: it is recorded with who and when")
			}
			if event == "" {
				return usagef("skip needs --event ID (kubectl outbox events NAME --blocked lists them)")
			}
			ref, err := parseEventRef(event)
			if err != nil {
				return err
			}
			action := outboxdb.SkipDrop
			if toDeadLetter {
				action = outboxdb.SkipDeadLetter
			}
			return o.withTarget(cmd.Context(), args[0], func(t *target) error {
				s, err := t.skip(cmd.Context(), ref, action, reason)
				if err != nil {
					return err
				}
				return o.print(s, func(w io.Writer) { skipTable(w, s, t.relay) })
			})
		},
	}
	c.Flags().StringVar(&event, "event", "", "the event: its id, or its event_id (UUID)")
	c.Flags().BoolVar(&toDeadLetter, "to-dead-letter", false, "publish the event to the dead-letter topic instead")
	c.Flags().BoolVar(&drop, "drop", false, "drop the event: mark it done without publishing it")
	c.Flags().StringVar(&reason, "reason", "", "why (required; recorded)")
	return c
}

// eventRef names an event by id or by event_id.
type eventRef struct {
	id      int64
	eventID string
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$`)

// parseEventRef reads an event's id (a positive number) or event_id (a UUID).
func parseEventRef(s string) (eventRef, error) {
	s = strings.TrimSpace(s)
	if id, err := strconv.ParseInt(s, 10, 64); err == nil {
		if id < 1 {
			return eventRef{}, usagef("--event %s: an id is a positive number", s)
		}
		return eventRef{id: id}, nil
	}
	if uuidRE.MatchString(s) {
		return eventRef{eventID: strings.ToLower(s)}, nil
	}
	return eventRef{}, usagef("--event %q: want the event's id (a number) or its event_id (a UUID)", s)
}

// resolve returns the id of the event ref names.
func (t *target) resolve(ctx context.Context, ref eventRef) (int64, error) {
	if ref.id != 0 {
		return ref.id, nil
	}
	var id int64
	err := t.db.QueryRowContext(ctx, `SELECT id FROM `+t.table.Ident()+` WHERE event_id = $1::uuid`, ref.eventID).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("event_id %s: %w", ref.eventID, outboxdb.ErrNoSuchEvent)
	}
	if err != nil {
		return 0, fmt.Errorf("finding event_id %s: %w", ref.eventID, err)
	}
	return id, nil
}

// deadLetterTopic returns the dead-letter topic the relays of r publish to, "" when none (the
// operator gives the relays the topic under the DeadLetter policy only).
func deadLetterTopic(r *v1alpha1.OutboxRelay) string {
	if r.Spec.PoisonEvents.Policy != v1alpha1.PoisonDeadLetter {
		return ""
	}
	return string(r.Spec.PoisonEvents.DeadLetterTopic)
}

func (t *target) skip(ctx context.Context, ref eventRef, action outboxdb.SkipAction, reason string) (*outboxdb.Skip, error) {
	if action == outboxdb.SkipDeadLetter && deadLetterTopic(t.relay) == "" {
		return nil, fmt.Errorf("OutboxRelay %s/%s has no dead-letter topic (spec.poisonEvents.policy is %q): its relays cannot send the event there; "+
			"use --drop, or set spec.poisonEvents.policy: DeadLetter and deadLetterTopic first", t.relay.Namespace, t.relay.Name, t.relay.Spec.PoisonEvents.Policy)
	}
	if _, err := t.schemaReady(ctx); err != nil {
		return nil, err
	}
	id, err := t.resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	who, err := t.kube.whoami(ctx)
	if err != nil {
		return nil, err
	}
	s, err := outboxdb.SkipEvent(ctx, t.db, t.table, id, action, who, reason)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

func skipTable(w io.Writer, s *outboxdb.Skip, r *v1alpha1.OutboxRelay) {
	what := "dropped: marked done, never published"
	if s.Action == outboxdb.SkipDeadLetter {
		what = "the relay publishes it to the dead-letter topic " + deadLetterTopic(r) + " next (kubectl outbox published shows when)"
	}
	row(w, fmt.Sprintf("Event %d (%s):", s.ID, s.EventID), what)
	row(w, "Aggregate:", s.AggregateID+" (its later events follow)")
	row(w, "Before:", fmt.Sprintf("%d attempt(s), error: %s", s.PreviousAttempts, cell(s.PreviousError)))
	row(w, "Recorded:", fmt.Sprintf("skipped by %s at %s: %s", s.SkippedBy, cell(s.SkippedAt), s.Reason))
}
