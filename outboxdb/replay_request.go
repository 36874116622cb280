// A replay's request: its bounds (a time, a position or an event id), the checks made without
// the database, and the plan the database resolves it to (replay.go).

package outboxdb

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Bound is one end of a replay's range: a time (events created at or after it for the start, at
// or before it for the end), a row id, or an event id. Exactly one is set.
type Bound struct {
	Time    time.Time
	ID      int64
	EventID string
}

// IsZero reports whether no bound is set.
func (b Bound) IsZero() bool { return b.Time.IsZero() && b.ID == 0 && b.EventID == "" }

func (b Bound) String() string {
	switch {
	case !b.Time.IsZero():
		return b.Time.UTC().Format(time.RFC3339Nano)
	case b.ID != 0:
		return strconv.FormatInt(b.ID, 10)
	default:
		return b.EventID
	}
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// ParseBound parses a bound as the command line gives it: an RFC 3339 time
// (2026-12-01T10:00:00Z), a duration before now (90m, 2h), a row id (12345) or an event id (a
// UUID).
func ParseBound(s string, now time.Time) (Bound, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Bound{}, errors.New("empty bound: want a time (RFC 3339), a duration before now (2h), a row id or an event id")
	}
	if uuidRE.MatchString(s) {
		return Bound{EventID: strings.ToLower(s)}, nil
	}
	if id, err := strconv.ParseInt(s, 10, 64); err == nil {
		if id <= 0 {
			return Bound{}, fmt.Errorf("row id %d: ids start at 1", id)
		}
		return Bound{ID: id}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return Bound{Time: t}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return Bound{Time: now.Add(-d)}, nil
	}
	return Bound{}, fmt.Errorf("bound %q: want a time (RFC 3339, e.g. 2026-12-01T10:00:00Z), a duration before now (2h), a row id or an event id (UUID)", s)
}

// ReplayRequest asks for a replay.
type ReplayRequest struct {
	From Bound
	// To is the end of the range; zero: the newest event when the replay is requested.
	To          Bound
	AggregateID string // only this aggregate's events, when set
	Topic       string // every event to this topic, when set; else each to its own
	Rate        int    // events per second at most; 0 unthrottled
	Reason      string
	// RequestedBy names who asked; empty: the database user.
	RequestedBy string
}

// RetainedEvent describes the oldest event still in the table.
type RetainedEvent struct {
	ID        int64
	EventID   string
	CreatedAt time.Time
	Partition string
}

// ReplayPlan is what a replay would publish: its range of positions and, counted when planned,
// the events of the range that were published, by aggregate type (their topic is the relay's
// topic map's, or the request's Topic).
type ReplayPlan struct {
	FromID, ToID    int64 // the range of positions, both included
	Events          int64
	ByAggregateType map[string]int64
	Topic           string
	AggregateID     string
	Rate            int
	OldestRetained  RetainedEvent
	NothingToReplay bool
}

// ErrPastRetention is the error (wrapped in a *RetentionError) of a replay that starts before the
// oldest retained event.
var ErrPastRetention = errors.New("past retention")

// RetentionError refuses a replay whose start is no longer in the table.
type RetentionError struct {
	From   Bound
	Oldest RetainedEvent
	Empty  bool // the table holds no event at all
}

func (e *RetentionError) Error() string {
	if e.Empty {
		return fmt.Sprintf("cannot replay from %s: the outbox table holds no event (none written yet, or all dropped with their partitions)", e.From)
	}
	return fmt.Sprintf("cannot replay from %s: it is past retention, the events before it were dropped with their partitions; "+
		"the oldest retained event is id %d (event_id %s, created %s, partition %s): replay from id %d or from %s on",
		e.From, e.Oldest.ID, e.Oldest.EventID, e.Oldest.CreatedAt.UTC().Format(time.RFC3339Nano), e.Oldest.Partition,
		e.Oldest.ID, e.Oldest.CreatedAt.UTC().Format(time.RFC3339Nano))
}

func (e *RetentionError) Unwrap() error { return ErrPastRetention }

// kafkaTopicRE is what Kafka accepts as a topic name.
var kafkaTopicRE = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// Validate checks what can be checked without the database.
func (r ReplayRequest) Validate() error {
	if r.From.IsZero() {
		return errors.New("a replay needs a start (--from): a time, a row id or an event id")
	}
	for _, b := range []Bound{r.From, r.To} {
		n := 0
		if !b.Time.IsZero() {
			n++
		}
		if b.ID != 0 {
			n++
		}
		if b.EventID != "" {
			n++
		}
		if n > 1 {
			return fmt.Errorf("bound %+v: set one of a time, a row id and an event id", b)
		}
		if b.ID < 0 {
			return fmt.Errorf("row id %d: ids start at 1", b.ID)
		}
		if b.EventID != "" && !uuidRE.MatchString(b.EventID) {
			return fmt.Errorf("event id %q is not a UUID", b.EventID)
		}
	}
	if !r.From.Time.IsZero() && !r.To.Time.IsZero() && r.To.Time.Before(r.From.Time) {
		return fmt.Errorf("the end %s is before the start %s", r.To, r.From)
	}
	if r.From.ID != 0 && r.To.ID != 0 && r.To.ID < r.From.ID {
		return fmt.Errorf("the end %d is before the start %d", r.To.ID, r.From.ID)
	}
	if r.Topic != "" && (!kafkaTopicRE.MatchString(r.Topic) || r.Topic == "." || r.Topic == "..") {
		return fmt.Errorf("topic %q is not a valid Kafka topic name", r.Topic)
	}
	if r.Rate < 0 {
		return fmt.Errorf("rate %d: want events per second, 0 for unthrottled", r.Rate)
	}
	if r.AggregateID != "" && strings.TrimSpace(r.AggregateID) == "" {
		return errors.New("aggregate id is blank")
	}
	return nil
}
