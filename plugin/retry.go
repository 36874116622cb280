package plugin

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

func init() { register(30, newRetryCommand) }

// RetryResult is what `retry` did.
type RetryResult struct {
	outboxdb.Retry `json:",inline"`
	// RelaysListening is the number of relay sessions connected to the table when the retry was
	// recorded: they end the aggregate's backoff at once; with none, the next relay to start
	// tries the aggregate's first event anyway.
	RelaysListening int `json:"relaysListening"`
}

func newRetryCommand(o *Options) *cobra.Command {
	var agg string
	c := &cobra.Command{
		Use:   "retry NAME --aggregate ID",
		Short: "Retry a blocked or parked aggregate now, resetting its backoff",
		Long: `Retry an aggregate whose first waiting event failed, now: its failed events' attempts are reset
to 0 (on their rows under row tracking, on their parked copies under snapshot tracking), the
retry is recorded with who and when in <table>_retries, and the relays are told on the table's
channel to end the aggregate's backoff, so that the event is tried again at once with a fresh
backoff. Fix the cause first (a topic, a size limit, an ACL): the event fails again otherwise.`,
		Args: exactlyOneName,
		RunE: func(cmd *cobra.Command, args []string) error {
			if agg == "" {
				return usagef("retry needs --aggregate ID (kubectl outbox status NAME lists the blocked aggregates)")
			}
			return o.withTarget(cmd.Context(), args[0], func(t *target) error {
				res, err := t.retry(cmd.Context(), agg)
				if err != nil {
					return err
				}
				return o.print(res, func(w io.Writer) { retryTable(w, res) })
			})
		},
	}
	c.Flags().StringVar(&agg, "aggregate", "", "the aggregate id to retry (required)")
	return c
}

func (t *target) retry(ctx context.Context, agg string) (*RetryResult, error) {
	if _, err := t.schemaReady(ctx); err != nil {
		return nil, err
	}
	who, err := t.kube.whoami(ctx)
	if err != nil {
		return nil, err
	}
	r, err := outboxdb.RetryAggregate(ctx, t.db, t.table, agg, who)
	if err != nil {
		return nil, err
	}
	locks, err := outboxdb.ReadRelayLocks(ctx, t.db, t.table)
	if err != nil {
		return nil, err
	}
	return &RetryResult{Retry: r, RelaysListening: len(locks.Present)}, nil
}

func retryTable(w io.Writer, r *RetryResult) {
	if r.Events == 0 {
		row(w, "Aggregate "+r.AggregateID+":", "no failed event recorded (a failure the broker caused counts no attempt); its backoff was ended anyway")
	} else {
		row(w, "Aggregate "+r.AggregateID+":", fmt.Sprintf("reset the attempts of %d failed event(s) (highest %d); first error: %s", r.Events, r.MaxAttempts, cell(r.FirstError)))
	}
	row(w, "Recorded:", fmt.Sprintf("retried by %s at %s", r.RetriedBy, cell(r.RetriedAt)))
	if r.RelaysListening == 0 {
		row(w, "Relays:", "none is running: the next relay to start tries the aggregate's first event")
	} else {
		row(w, "Relays:", fmt.Sprintf("%d running; told to end the aggregate's backoff now", r.RelaysListening))
	}
}
