package plugin

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
)

func init() { register(10, newStatusCommand) }

// Status is what `status` shows.
type Status struct {
	Relay         string            `json:"relay"`
	Namespace     string            `json:"namespace"`
	Table         string            `json:"table"`
	Tracking      contract.Tracking `json:"tracking"`
	SchemaVersion int64             `json:"schemaVersion"`
	Paused        bool              `json:"paused,omitempty"`
	Conditions    []Condition       `json:"conditions"`
	Shards        Shards            `json:"shards"`
	Backlog       Backlog           `json:"backlog"`
	// Blocked lists the aggregates whose first waiting event failed (row tracking) or that have
	// parked events (snapshot tracking), with their first error.
	Blocked     []BlockedAggregate `json:"blocked"`
	BlockedScan string             `json:"blockedScan"`
	Partitions  Partitions         `json:"partitions"`
	LastReshard *Reshard           `json:"lastReshard,omitempty"`
	Skips       int64              `json:"skips"`
	Replay      any                `json:"replay,omitempty"`
	MeasuredIn  string             `json:"measuredIn"`
}

// Condition is one condition of the OutboxRelay's status.
type Condition struct {
	Type    string    `json:"type"`
	Status  string    `json:"status"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Since   time.Time `json:"since"`
}

func newStatusCommand(o *Options) *cobra.Command {
	return &cobra.Command{
		Use:   "status NAME",
		Short: "Show an OutboxRelay: conditions, shards and who holds them, backlog, blocked aggregates, partitions, last reshard",
		Args:  exactlyOneName,
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.withTarget(cmd.Context(), args[0], func(t *target) error {
				s, err := t.status(cmd.Context())
				if err != nil {
					return err
				}
				return o.print(s, func(w io.Writer) { statusTable(w, s) })
			})
		},
	}
}

// status gathers the Status of t: the OutboxRelay's conditions and everything the database says.
func (t *target) status(ctx context.Context) (*Status, error) {
	start := time.Now()
	r := t.relay
	s := &Status{Relay: r.Name, Namespace: r.Namespace, Table: t.table.String(), Paused: r.Spec.Paused}
	for _, c := range r.Status.Conditions {
		s.Conditions = append(s.Conditions, Condition{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message, Since: c.LastTransitionTime.Time})
	}
	var err error
	if s.SchemaVersion, err = t.schemaReady(ctx); err != nil {
		return nil, err
	}
	_, snapshot, err := t.snapshotTracked(ctx)
	if err != nil {
		return nil, err
	}
	s.Tracking = trackingOf(snapshot)
	steps := []func(context.Context, *Status, bool) error{t.readShards, t.readBacklog, t.readBlocked, t.readPartitions, t.readReshard, t.readSkips, t.readReplay}
	for _, step := range steps {
		if err := step(ctx, s, snapshot); err != nil {
			return nil, err
		}
	}
	s.MeasuredIn = time.Since(start).Round(time.Millisecond).String()
	return s, nil
}

// readReplay reads the oldest replay not finished, if any, with replayStatus.
func (t *target) readReplay(ctx context.Context, s *Status, _ bool) error {
	v, err := replayStatus(ctx, t)
	if err != nil {
		return fmt.Errorf("reading the replay in progress: %w", err)
	}
	s.Replay = v
	return nil
}

// replayStatus returns the replay in progress of t, nil when none. The replay command's file
// sets it (func init: openReplay reads <table>_replays).
var replayStatus = func(context.Context, *target) (any, error) { return nil, nil }

// readSkips counts the events skipped by hand.
func (t *target) readSkips(ctx context.Context, s *Status, _ bool) error {
	return t.db.QueryRowContext(ctx, `SELECT count(*) FROM `+t.table.Derived("skips")).Scan(&s.Skips)
}

func statusTable(w io.Writer, s *Status) {
	row(w, "OutboxRelay:", s.Namespace+"/"+s.Relay)
	row(w, "Table:", fmt.Sprintf("%s (schema version %d, %s tracking)", s.Table, s.SchemaVersion, s.Tracking))
	if s.Paused {
		row(w, "Paused:", "yes (spec.paused)")
	}
	for _, c := range s.Conditions {
		if c.Type == v1alpha1.ConditionReady {
			row(w, "Ready:", fmt.Sprintf("%s (%s)", c.Status, c.Reason))
		}
	}
	fmt.Fprintln(w)
	if len(s.Conditions) > 0 {
		row(w, "CONDITION", "STATUS", "REASON", "SINCE", "MESSAGE")
		for _, c := range s.Conditions {
			row(w, c.Type, c.Status, c.Reason, c.Since, c.Message)
		}
		fmt.Fprintln(w)
	}
	shardsTable(w, s)
	fmt.Fprintln(w)
	row(w, "Pending:", s.Backlog.Pending+" (lag "+s.Backlog.Lag+")")
	if s.Tracking.Parks() {
		row(w, "Parked:", fmt.Sprint(s.Backlog.Parked))
	}
	row(w, "Skipped by hand:", fmt.Sprint(s.Skips))
	fmt.Fprintln(w)
	blockedTable(w, s)
	fmt.Fprintln(w)
	partitionsTable(w, s)
	fmt.Fprintln(w)
	if s.LastReshard != nil {
		reshardTable(w, s.LastReshard)
	} else {
		title(w, "Last reshard:", "none")
	}
	if s.Replay != nil {
		row(w, "Replay:", fmt.Sprint(s.Replay))
	} else {
		row(w, "Replay:", "none in progress")
	}
	row(w, "Measured in:", s.MeasuredIn)
}
