package plugin

import (
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

func strp(s string) *string { return &s }

func TestDeriveState(t *testing.T) {
	now := time.Now()
	dl := strp(outboxdb.DeadLetteredPrefix + "orders.dlq: poison: payload too large")
	cases := map[string]struct {
		facts     eventFacts
		state     string
		attempts  int
		published bool
	}{
		"row: unsent":                      {facts: eventFacts{}, state: StatePending},
		"row: sent":                        {facts: eventFacts{SentAt: &now}, state: StatePublished, published: true},
		"row: failed":                      {facts: eventFacts{Attempts: 3, Error: strp("x")}, state: StateBlocked, attempts: 3},
		"row: failed by the broker":        {facts: eventFacts{Error: strp("unreachable")}, state: StateBlocked},
		"row: behind a failed one":         {facts: eventFacts{AggregateFailed: true}, state: StateHeldBack},
		"row: dead-lettered":               {facts: eventFacts{SentAt: &now, Attempts: 10, Error: dl}, state: StateDeadLettered, attempts: 10, published: true},
		"row: sent with an old error":      {facts: eventFacts{SentAt: &now, Attempts: 2, Error: strp("publish failed")}, state: StatePublished, attempts: 2, published: true},
		"row: dead letter requested":       {facts: eventFacts{Attempts: outboxdb.DeadLetterRequested, SkipAction: outboxdb.SkipDeadLetter}, state: StateDeadLetterRequested},
		"row: skipped and dead-lettered":   {facts: eventFacts{SentAt: &now, Error: dl, SkipAction: outboxdb.SkipDeadLetter}, state: StateSkippedDeadLettered, published: true},
		"row: skipped but published first": {facts: eventFacts{SentAt: &now, SkipAction: outboxdb.SkipDeadLetter}, state: StatePublished, published: true},
		"row: dropped":                     {facts: eventFacts{SentAt: &now, Attempts: 4, SkipAction: outboxdb.SkipDrop}, state: StateSkippedDropped, attempts: 4},
		"snapshot: not passed":             {facts: eventFacts{Snapshot: true}, state: StatePending},
		"snapshot: passed":                 {facts: eventFacts{Snapshot: true, CursorPassed: true}, state: StatePublished, published: true},
		"snapshot: parked":                 {facts: eventFacts{Snapshot: true, Parked: true, ParkedAttempts: 2, ParkedError: strp("x")}, state: StateParked, attempts: 2},
		"snapshot: parked behind":          {facts: eventFacts{Snapshot: true, Parked: true, ParkedError: strp(outboxdb.HeldBackError)}, state: StateParkedBehind},
		"snapshot: parked, skip requested": {facts: eventFacts{Snapshot: true, Parked: true, ParkedAttempts: -1, SkipAction: outboxdb.SkipDeadLetter}, state: StateDeadLetterRequested},
		"snapshot: dead-lettered":          {facts: eventFacts{Snapshot: true, CursorPassed: true, DeadLettered: true, DeadLetteredError: dl}, state: StateDeadLettered, published: true},
		"snapshot: skipped, dead-lettered": {facts: eventFacts{Snapshot: true, CursorPassed: true, DeadLettered: true, DeadLetteredError: dl, SkipAction: outboxdb.SkipDeadLetter}, state: StateSkippedDeadLettered, published: true},
		"snapshot: dropped while parked":   {facts: eventFacts{Snapshot: true, SentAt: &now, SkipAction: outboxdb.SkipDrop}, state: StateSkippedDropped},
		"snapshot: sent_at of a drop":      {facts: eventFacts{Snapshot: true, SentAt: &now}, state: StatePublished, published: true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			d := deriveState(c.facts)
			if d.State != c.state || d.Attempts != c.attempts || d.Published != c.published {
				t.Errorf("deriveState = %+v, want state %s, attempts %d, published %v", d, c.state, c.attempts, c.published)
			}
		})
	}
}
