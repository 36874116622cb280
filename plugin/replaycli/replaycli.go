// Package replaycli is the logic of `kubectl outbox replay` (issue 15): it parses the command's
// arguments, asks for a replay (or plans one, --dry-run) with outboxdb, and prints the result as
// a table or as JSON or YAML. The plugin's cobra command finds the OutboxRelay, reads its
// database URL and calls Run, List or Cancel with a connection; a relay executes the replay
// (relay/replay.go), since the user's machine usually cannot reach Kafka.
package replaycli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// Args are the command's flags.
type Args struct {
	// From (--from, required) and To (--to) are a time (RFC 3339), a duration before now (2h),
	// a row id or an event id (outboxdb.ParseBound).
	From, To string
	// AggregateID (--aggregate) replays one aggregate's events only.
	AggregateID string
	// Topic (--topic) sends every copy to this topic instead of the event's own.
	Topic string
	// Rate (--rate) caps the events per second; 0 publishes as fast as the brokers take them.
	Rate int
	// Reason (--reason) is recorded with the replay.
	Reason string
	// RequestedBy is recorded as who asked (the plugin passes the Kubernetes user); empty: the
	// database user.
	RequestedBy string
	// DryRun (--dry-run) prints what the replay would publish and records nothing.
	DryRun bool
	// Output (-o) is "" (a table), "json" or "yaml".
	Output string
	// TopicFor, when set, names an aggregate type's topic as the OutboxRelay's topic map and
	// default topic do, for the dry run's report; ok is false when none does.
	TopicFor func(aggregateType string) (topic string, ok bool)
	// Now is the clock durations count back from (nil: time.Now).
	Now func() time.Time
}

// Request builds the outboxdb request of a.
func (a Args) Request() (outboxdb.ReplayRequest, error) {
	now := time.Now
	if a.Now != nil {
		now = a.Now
	}
	if a.From == "" {
		return outboxdb.ReplayRequest{}, errors.New("--from is required: a time (2026-12-01T10:00:00Z), a duration before now (2h), a row id or an event id")
	}
	from, err := outboxdb.ParseBound(a.From, now())
	if err != nil {
		return outboxdb.ReplayRequest{}, fmt.Errorf("--from: %w", err)
	}
	req := outboxdb.ReplayRequest{From: from, AggregateID: a.AggregateID, Topic: a.Topic, Rate: a.Rate, Reason: a.Reason, RequestedBy: a.RequestedBy}
	if a.To != "" {
		if req.To, err = outboxdb.ParseBound(a.To, now()); err != nil {
			return outboxdb.ReplayRequest{}, fmt.Errorf("--to: %w", err)
		}
	}
	return req, req.Validate()
}

// TopicCount is one line of a plan: the events of an aggregate type and where they go.
type TopicCount struct {
	AggregateType string `json:"aggregateType"`
	Topic         string `json:"topic,omitempty"`
	Events        int64  `json:"events"`
}

// Result is what Run prints.
type Result struct {
	DryRun   bool              `json:"dryRun"`
	ID       int64             `json:"id,omitempty"`
	FromID   int64             `json:"fromPosition"`
	ToID     int64             `json:"toPosition"`
	Events   int64             `json:"events"`
	Topics   []TopicCount      `json:"topics"`
	Rate     int               `json:"rate"`
	Retained retainedForOutput `json:"oldestRetained"`
}

type retainedForOutput struct {
	ID        int64     `json:"id"`
	EventID   string    `json:"eventId"`
	CreatedAt time.Time `json:"createdAt"`
	Partition string    `json:"partition"`
}

// Run plans the replay a asks for and, unless a.DryRun, records it for the relays; it prints
// the result to out. A start past retention is refused with an error naming the oldest retained
// event (errors.Is(err, outboxdb.ErrPastRetention)).
func Run(ctx context.Context, db outboxdb.Querier, table outboxdb.Table, a Args, out io.Writer) error {
	req, err := a.Request()
	if err != nil {
		return err
	}
	var (
		plan outboxdb.ReplayPlan
		rp   outboxdb.Replay
	)
	if a.DryRun {
		plan, err = outboxdb.PlanReplay(ctx, db, table, req)
	} else {
		rp, plan, err = outboxdb.RequestReplay(ctx, db, table, req)
	}
	if err != nil {
		return err
	}
	res := Result{DryRun: a.DryRun, ID: rp.ID, FromID: plan.FromID, ToID: plan.ToID, Events: plan.Events, Rate: req.Rate,
		Retained: retainedForOutput{plan.OldestRetained.ID, plan.OldestRetained.EventID, plan.OldestRetained.CreatedAt, plan.OldestRetained.Partition}}
	for typ, n := range plan.ByAggregateType {
		tc := TopicCount{AggregateType: typ, Events: n, Topic: req.Topic}
		if tc.Topic == "" && a.TopicFor != nil {
			if t, ok := a.TopicFor(typ); ok {
				tc.Topic = t
			} else {
				tc.Topic = "(no topic: the replay would fail)"
			}
		}
		res.Topics = append(res.Topics, tc)
	}
	sort.Slice(res.Topics, func(i, j int) bool { return res.Topics[i].AggregateType < res.Topics[j].AggregateType })
	switch a.Output {
	case "json", "yaml":
		return encode(out, a.Output, res)
	case "":
	default:
		return fmt.Errorf("-o %s: want json or yaml", a.Output)
	}
	rate := "as fast as the brokers take them"
	if req.Rate > 0 {
		rate = strconv.Itoa(req.Rate) + " events/s at most"
	}
	if a.DryRun {
		fmt.Fprintf(out, "Dry run, nothing recorded: the replay would publish %d events again (positions %d to %d), %s.\n",
			plan.Events, plan.FromID, plan.ToID, rate)
	} else {
		fmt.Fprintf(out, "Replay %d requested: %d events (positions %d to %d), %s. A relay runs it; `kubectl outbox status` shows its progress.\n",
			rp.ID, plan.Events, plan.FromID, plan.ToID, rate)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AGGREGATE TYPE\tTOPIC\tEVENTS")
	for _, tc := range res.Topics {
		topic := tc.Topic
		if topic == "" {
			topic = "(its own)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\n", tc.AggregateType, topic, tc.Events)
	}
	return tw.Flush()
}

// ReplayOutput is a replay as List prints it in JSON or YAML.
type ReplayOutput struct {
	ID          int64      `json:"id"`
	State       string     `json:"state"`
	Replayed    int64      `json:"replayed"`
	Total       int64      `json:"total"`
	Percent     float64    `json:"percent"`
	From        string     `json:"from"`
	To          string     `json:"to,omitempty"`
	FromID      int64      `json:"fromPosition"`
	ToID        int64      `json:"toPosition"`
	LastID      int64      `json:"lastPosition"`
	AggregateID string     `json:"aggregateId,omitempty"`
	Topic       string     `json:"topic,omitempty"`
	Rate        int        `json:"rate"`
	RequestedBy string     `json:"requestedBy"`
	RequestedAt time.Time  `json:"requestedAt"`
	Reason      string     `json:"reason,omitempty"`
	Runner      string     `json:"runner,omitempty"`
	StartedAt   *time.Time `json:"startedAt,omitempty"`
	FinishedAt  *time.Time `json:"finishedAt,omitempty"`
	Error       string     `json:"error,omitempty"`
}

func outputOf(r outboxdb.Replay) ReplayOutput {
	return ReplayOutput{ID: r.ID, State: string(r.State), Replayed: r.Replayed, Total: r.Total, Percent: r.Percent(),
		From: r.FromSpec, To: r.ToSpec, FromID: r.FromID, ToID: r.ToID, LastID: r.LastID, AggregateID: r.AggregateID,
		Topic: r.Topic, Rate: r.Rate, RequestedBy: r.RequestedBy, RequestedAt: r.RequestedAt, Reason: r.Reason,
		Runner: r.Runner, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt, Error: r.Error}
}

// List prints the table's replays, the newest first (only those pending or running with open;
// at most limit, 0 for 100), as a table or in format ("json", "yaml"). `kubectl outbox status`
// shows the open ones with it.
func List(ctx context.Context, db outboxdb.Querier, table outboxdb.Table, open bool, limit int, format string, out io.Writer) error {
	rs, err := outboxdb.ListReplays(ctx, db, table, open, limit)
	if err != nil {
		return err
	}
	if format != "" {
		list := make([]ReplayOutput, len(rs))
		for i, r := range rs {
			list[i] = outputOf(r)
		}
		return encode(out, format, list)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLAY\tSTATE\tPROGRESS\tFROM\tTO\tAGGREGATE\tTOPIC\tRATE\tREQUESTED BY\tREQUESTED\tERROR")
	for _, r := range rs {
		to, agg, topic, rate := r.ToSpec, r.AggregateID, r.Topic, "-"
		if to == "" {
			to = "-"
		}
		if agg == "" {
			agg = "*"
		}
		if topic == "" {
			topic = "(its own)"
		}
		if r.Rate > 0 {
			rate = strconv.Itoa(r.Rate) + "/s"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d/%d (%.0f%%)\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.State, r.Replayed, r.Total, r.Percent(),
			r.FromSpec, to, agg, topic, rate, r.RequestedBy, r.RequestedAt.UTC().Format(time.RFC3339), r.Error)
	}
	return tw.Flush()
}

// Cancel cancels a pending or running replay and says so on out.
func Cancel(ctx context.Context, db outboxdb.Querier, table outboxdb.Table, id int64, out io.Writer) error {
	if err := outboxdb.CancelReplay(ctx, db, table, id); err != nil {
		return err
	}
	_, err := fmt.Fprintf(out, "Replay %d cancelled: a relay running it stops after the batch in flight.\n", id)
	return err
}

func encode(out io.Writer, format string, v any) error {
	switch format {
	case "json":
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	}
	return fmt.Errorf("-o %s: want json or yaml", format)
}
