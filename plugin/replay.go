package plugin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/plugin/replaycli"
)

func init() {
	register(60, newReplayCommand)
	replayStatus = openReplay
}

// replaysMigration is the migration that adds <table>_replays (00014_replays.sql).
const replaysMigration = 14

func newReplayCommand(o *Options) *cobra.Command {
	var (
		a      replaycli.Args
		list   bool
		open   bool
		cancel int64
	)
	c := &cobra.Command{
		Use: `replay NAME (--from TIME|ID [--to TIME|ID] [--aggregate ID] [--topic T] [--rate N] [--reason "..."] [--dry-run] | --list [--open] | --cancel ID)`,
		Example: `  kubectl outbox replay orders --from 2026-12-01T10:00:00Z --to 2026-12-01T11:00:00Z --dry-run
  kubectl outbox replay orders --from 2h --aggregate order-42 --rate 100 --reason "billing lost its state"
  kubectl outbox replay orders --list --open
  kubectl outbox replay orders --cancel 3`,
		Short: "Publish retained events again (a relay runs the replay), list replays, or cancel one",
		Long: `Ask the relays to publish again the events of a range that were published: each copy carries the
event_id it had and the header outbox_replay (the replay's id), to the event's own topic or to
--topic. A consumer dedupes copies by event_id. Events dropped by hand (skip --drop), parked,
dead-lettered or not published yet are not replayed.

--from and --to are a time (RFC 3339, 2026-12-01T10:00:00Z), a duration before now (2h), a row id
(a number) or an event_id (a UUID); without --to the range ends at the newest event now. A start
past retention (its day's partition was dropped) is refused, naming the oldest retained event.
--dry-run counts what the replay would publish, by aggregate type and topic, and records nothing.

The replay is recorded in <table>_replays with who (your Kubernetes user name), when and why
(--reason); one relay at a time runs the table's replays, the oldest first, within a few seconds.
status shows the oldest open replay; --list shows the replays (--open: pending or running only);
--cancel stops one after the batch in flight.`,
		Args: exactlyOneName,
		RunE: func(cmd *cobra.Command, args []string) error {
			fl := cmd.Flags()
			request := fl.Changed("from") || fl.Changed("to") || fl.Changed("aggregate") || fl.Changed("topic") ||
				fl.Changed("rate") || fl.Changed("reason") || fl.Changed("dry-run")
			modes := 0
			for _, m := range []bool{list, fl.Changed("cancel"), request} {
				if m {
					modes++
				}
			}
			switch {
			case modes > 1:
				return usagef("--list, --cancel and a request (--from ...) exclude each other")
			case open && !list:
				return usagef("--open goes with --list")
			case modes == 0 || (request && a.From == ""):
				return usagef("replay needs --from TIME|ID (or --list, or --cancel ID)")
			case fl.Changed("cancel") && cancel < 1:
				return usagef("--cancel %d: a replay id is a positive number (replay NAME --list shows them)", cancel)
			}
			return o.withTarget(cmd.Context(), args[0], func(t *target) error {
				if err := t.replaysReady(cmd.Context()); err != nil {
					return err
				}
				format := o.Output
				if format == outputTable {
					format = ""
				}
				ctx := cmd.Context()
				return t.withConn(ctx, func(q outboxdb.Querier) error {
					switch {
					case list:
						return replaycli.List(ctx, q, t.table, open, 0, format, o.Out)
					case fl.Changed("cancel"):
						return replaycli.Cancel(ctx, q, t.table, cancel, o.Out)
					}
					a.Output = format
					a.TopicFor = func(typ string) (string, bool) {
						topic := topicOf(t.relay, typ)
						return topic, topic != ""
					}
					if !a.DryRun {
						who, err := t.kube.whoami(ctx)
						if err != nil {
							return err
						}
						a.RequestedBy = who
					}
					return replaycli.Run(ctx, q, t.table, a, o.Out)
				})
			})
		},
	}
	f := c.Flags()
	f.StringVar(&a.From, "from", "", "the start: a time (RFC 3339), a duration before now (2h), a row id or an event_id")
	f.StringVar(&a.To, "to", "", "the end, included (default: the newest event now): a time, a duration before now, a row id or an event_id")
	f.StringVar(&a.AggregateID, "aggregate", "", "replay this aggregate's events only")
	f.StringVar(&a.Topic, "topic", "", "publish every copy to this topic instead of the event's own")
	f.IntVar(&a.Rate, "rate", 0, "events per second at most (default: as fast as the brokers take them)")
	f.StringVar(&a.Reason, "reason", "", "why (recorded with the replay)")
	f.BoolVar(&a.DryRun, "dry-run", false, "count what the replay would publish; record nothing")
	f.BoolVar(&list, "list", false, "list the replays, newest first (at most 100)")
	f.BoolVar(&open, "open", false, "with --list: only the replays pending or running")
	f.Int64Var(&cancel, "cancel", 0, "cancel the pending or running replay with this id")
	return c
}

// withConn runs fn on one of t's connections as pgx sees it (the replay functions take a
// pgx-style Querier), with the session parameters connect set.
func (t *target) withConn(ctx context.Context, fn func(outboxdb.Querier) error) error {
	c, err := t.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("unexpected database driver connection %T", dc)
		}
		return fn(sc.Conn())
	})
}

// replaysReady fails with a clear message when the table's schema predates replays.
func (t *target) replaysReady(ctx context.Context) error {
	v, err := t.schemaReady(ctx)
	if err != nil {
		return err
	}
	if v < replaysMigration {
		return fmt.Errorf("the schema of %s is at version %d; replay needs version %d or later (the operator applies it: upgrade the operator)",
			t.table, v, replaysMigration)
	}
	return nil
}

// ReplayInProgress is the oldest replay not finished, as status shows it.
type ReplayInProgress struct {
	ID          int64     `json:"id"`
	State       string    `json:"state"`
	Replayed    int64     `json:"replayed"`
	Total       int64     `json:"total"`
	Percent     float64   `json:"percent"`
	Rate        int       `json:"rate"`
	RequestedBy string    `json:"requestedBy"`
	RequestedAt time.Time `json:"requestedAt"`
	Reason      string    `json:"reason,omitempty"`
	// Open is the number of replays pending or running, this one included.
	Open int `json:"open"`
}

func (r *ReplayInProgress) String() string {
	rate := "unthrottled"
	if r.Rate > 0 {
		rate = fmt.Sprintf("at most %d events/s", r.Rate)
	}
	s := fmt.Sprintf("%d %s: %d/%d events (%.0f%%), %s, requested by %s at %s", r.ID, r.State, r.Replayed, r.Total, r.Percent,
		rate, r.RequestedBy, cell(r.RequestedAt))
	if r.Open > 1 {
		s += fmt.Sprintf(" (%d more waiting)", r.Open-1)
	}
	return s
}

// openReplay returns the oldest replay pending or running, nil when none (or when the schema
// predates replays).
func openReplay(ctx context.Context, t *target) (any, error) {
	v, err := outboxdb.CurrentVersion(ctx, t.db, t.table)
	if err != nil || v < replaysMigration {
		return nil, err
	}
	var rs []outboxdb.Replay
	err = t.withConn(ctx, func(q outboxdb.Querier) error {
		rs, err = outboxdb.ListReplays(ctx, q, t.table, true, 0)
		return err
	})
	if err != nil || len(rs) == 0 {
		return nil, err // an untyped nil: status prints "none in progress"
	}
	r := rs[len(rs)-1] // the newest first: the last is the oldest, the one a relay runs
	return &ReplayInProgress{ID: r.ID, State: string(r.State), Replayed: r.Replayed, Total: r.Total, Percent: r.Percent(),
		Rate: r.Rate, RequestedBy: r.RequestedBy, RequestedAt: r.RequestedAt, Reason: r.Reason, Open: len(rs)}, nil
}
