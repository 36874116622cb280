package plugin

import (
	"strings"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// Event states, as `events` and `published` show them.
const (
	StatePending      = "pending"
	StateBlocked      = "blocked"   // row tracking: it failed; its aggregate waits behind it
	StateHeldBack     = "held-back" // row tracking: an earlier event of its aggregate failed
	StateParked       = "parked"    // snapshot tracking: it failed, parked and retried
	StateParkedBehind = "parked-held-back"
	StatePublished    = "published"
	StateDeadLettered = "dead-lettered"
	// StateDeadLetterRequested: skipped to the dead-letter topic; the relay has not sent it yet.
	StateDeadLetterRequested = "dead-letter-requested"
	StateSkippedDropped      = "skipped-dropped"
	StateSkippedDeadLettered = "skipped-dead-lettered"
)

// eventFacts is what the database says about one event, in either tracking mode.
type eventFacts struct {
	Snapshot bool
	SentAt   *time.Time
	Attempts int
	Error    *string
	// Parked (snapshot tracking): the event waits in <table>_parked with these attempts and error.
	Parked         bool
	ParkedAttempts int
	ParkedError    *string
	// DeadLettered (snapshot tracking): <table>_dead_lettered holds it, with this error.
	DeadLettered      bool
	DeadLetteredError *string
	// CursorPassed (snapshot tracking): <table>_published said the cursor of its bucket passed it.
	CursorPassed bool
	// AggregateFailed (row tracking): an earlier unsent event of its aggregate failed.
	AggregateFailed bool
	// SkipAction is the action of its skip, "" when it was not skipped.
	SkipAction outboxdb.SkipAction
}

// derivedState is an event's state with the attempts and error that go with it.
type derivedState struct {
	State     string
	Attempts  int
	Error     *string
	Published bool
}

// deriveState tells an event's state from its facts. Published means it reached a topic (its
// own or the dead-letter topic); a dropped event did not.
func deriveState(f eventFacts) derivedState {
	d := derivedState{Attempts: f.Attempts, Error: f.Error}
	if f.Parked {
		d.Attempts, d.Error = f.ParkedAttempts, f.ParkedError
	}
	if d.Attempts < 0 {
		d.Attempts = 0 // outboxdb.DeadLetterRequested is a request, not a count
	}
	deadLettered := f.DeadLettered ||
		!f.Snapshot && f.SentAt != nil && f.Error != nil && strings.HasPrefix(*f.Error, outboxdb.DeadLetteredPrefix)
	if f.DeadLettered {
		d.Error = f.DeadLetteredError
	}
	done := !f.Parked && (f.SentAt != nil || f.Snapshot && f.CursorPassed)
	switch f.SkipAction {
	case outboxdb.SkipDrop:
		d.State = StateSkippedDropped
		return d
	case outboxdb.SkipDeadLetter:
		if done {
			// Dead-lettered, or published normally by a relay that had fetched it before the skip.
			d.State, d.Published = StateSkippedDeadLettered, true
			if !deadLettered {
				d.State = StatePublished
			}
			return d
		}
		d.State = StateDeadLetterRequested
		return d
	}
	switch {
	case done && deadLettered:
		d.State, d.Published = StateDeadLettered, true
	case done:
		d.State, d.Published = StatePublished, true
	case f.Parked && f.ParkedError != nil && *f.ParkedError == outboxdb.HeldBackError:
		d.State = StateParkedBehind
	case f.Parked:
		d.State = StateParked
	case f.Attempts == outboxdb.DeadLetterRequested:
		d.State = StateDeadLetterRequested
	case !f.Snapshot && (f.Attempts > 0 || f.Error != nil):
		d.State = StateBlocked // a failure that counted no attempt (the broker's) records its error too
	case f.AggregateFailed:
		d.State = StateHeldBack
	default:
		d.State = StatePending
	}
	return d
}
