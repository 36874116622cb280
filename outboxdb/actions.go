package outboxdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Acts by hand on events (migration 00013_operator_actions.sql): skipping an event (the only way
// one is ever dropped) and retrying a failed aggregate now. Each is recorded with who, when and
// why, and told to the relays on the table's channel so that they act on it at once.

// DeadLetterRequested is the attempts value of an event (on its row, or on its parked copy under
// snapshot tracking) that someone asked to send to the dead-letter topic: the relay reads it with
// the event and publishes the event there, in order within its aggregate, whatever its poison
// policy (it needs a dead-letter topic). A failed event's attempts are never negative otherwise.
const DeadLetterRequested = -1

// The errors the relay records that tools read back: DeadLetteredPrefix starts the error of an
// event published to the dead-letter topic (on its row under row tracking, in <table>_dead_lettered
// under snapshot tracking); HeldBackError is the error of a parked event that did not fail itself
// but waits behind an earlier parked event of its aggregate.
const (
	DeadLetteredPrefix = "dead-lettered to "
	HeldBackError      = "held back: an earlier event of its aggregate is parked"
)

// RetryNotification starts the payload of the notification on the table's channel that ends the
// backoff of an aggregate in the relays: RetryNotification + aggregate id; RetryNotification alone
// ends every aggregate's backoff (for an id too long for a notification).
const RetryNotification = "retry:"

// maxNotifyPayload is below PostgreSQL's 8000-byte limit on a notification's payload.
const maxNotifyPayload = 7900

// RetryPayload returns the payload of the notification that ends aggID's backoff.
func RetryPayload(aggID string) string {
	if len(RetryNotification)+len(aggID) > maxNotifyPayload {
		return RetryNotification
	}
	return RetryNotification + aggID
}

// SkipAction is what a skip does with the event.
type SkipAction string

// Skip actions.
const (
	// SkipDrop marks the event done without publishing it.
	SkipDrop SkipAction = "drop"
	// SkipDeadLetter has the relay publish the event to its dead-letter topic instead.
	SkipDeadLetter SkipAction = "dead-letter"
)

// Errors of Skip. Each leaves the event as it was.
var (
	ErrNoSuchEvent       = errors.New("no such event in the outbox table (never written, or dropped with its partition)")
	ErrEventPublished    = errors.New("the event is already published: there is nothing to skip")
	ErrEventSkipped      = errors.New("the event was already skipped")
	ErrReasonRequired    = errors.New("a reason is required: it is recorded with who and when")
	ErrActorRequired     = errors.New("who acts must be known: it is recorded")
	ErrInvalidSkipAction = errors.New("the skip action must be drop or dead-letter")
)

// Skip is one recorded skip (a row of <table>_skips).
type Skip struct {
	ID               int64      `json:"id"`
	EventID          string     `json:"eventID"`
	AggregateID      string     `json:"aggregateID"`
	Action           SkipAction `json:"action"`
	Reason           string     `json:"reason"`
	SkippedBy        string     `json:"skippedBy"`
	DBUser           string     `json:"dbUser"`
	SkippedAt        time.Time  `json:"skippedAt"`
	PreviousAttempts int        `json:"previousAttempts"`
	PreviousError    *string    `json:"previousError,omitempty"`
	// Parked: the event was parked (snapshot tracking) when it was skipped.
	Parked bool `json:"parked"`
}

// SkipEvent skips the event with id: drops it, or asks the relays to publish it to the dead-letter
// topic, and records it with by and reason, in one transaction, and tells the relays to end the
// backoff of its aggregate. It refuses an event that is published or already skipped.
func SkipEvent(ctx context.Context, db *sql.DB, t Table, id int64, action SkipAction, by, reason string) (Skip, error) {
	s := Skip{ID: id, Action: action, SkippedBy: strings.TrimSpace(by), Reason: strings.TrimSpace(reason)}
	switch {
	case action != SkipDrop && action != SkipDeadLetter:
		return s, ErrInvalidSkipAction
	case s.Reason == "":
		return s, ErrReasonRequired
	case s.SkippedBy == "":
		return s, ErrActorRequired
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return s, err
	}
	defer func() { _ = tx.Rollback() }()
	var (
		created time.Time
		sentAt  sql.NullTime
	)
	err = tx.QueryRowContext(ctx, `SELECT created_at, event_id::text, aggregate_id, attempts, error, sent_at FROM `+t.Ident()+
		` WHERE id = $1 FOR UPDATE`, id).Scan(&created, &s.EventID, &s.AggregateID, &s.PreviousAttempts, &s.PreviousError, &sentAt)
	if errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("event %d: %w", id, ErrNoSuchEvent)
	}
	if err != nil {
		return s, fmt.Errorf("reading event %d: %w", id, err)
	}
	var prior Skip
	err = tx.QueryRowContext(ctx, `SELECT action, skipped_by, skipped_at FROM `+t.Derived("skips")+` WHERE id = $1 ORDER BY skip_id DESC LIMIT 1`, id).
		Scan(&prior.Action, &prior.SkippedBy, &prior.SkippedAt)
	switch {
	case err == nil:
		return s, fmt.Errorf("event %d: %w (%s by %s at %s)", id, ErrEventSkipped, prior.Action, prior.SkippedBy, prior.SkippedAt.UTC().Format(time.RFC3339))
	case !errors.Is(err, sql.ErrNoRows):
		return s, fmt.Errorf("reading the skips of event %d: %w", id, err)
	}
	var (
		pAttempts int
		pErr      *string
	)
	err = tx.QueryRowContext(ctx, `SELECT attempts, error FROM `+t.Derived("parked")+` WHERE id = $1 FOR UPDATE`, id).Scan(&pAttempts, &pErr)
	switch {
	case err == nil:
		s.Parked, s.PreviousAttempts, s.PreviousError = true, pAttempts, pErr
	case !errors.Is(err, sql.ErrNoRows):
		return s, fmt.Errorf("reading the parked copy of event %d: %w", id, err)
	}
	if !s.Parked {
		var published sql.NullBool
		if err := tx.QueryRowContext(ctx, `SELECT `+t.Derived("published")+`($1)`, id).Scan(&published); err != nil {
			return s, fmt.Errorf("reading whether event %d is published: %w", id, err)
		}
		if sentAt.Valid || published.Bool {
			return s, fmt.Errorf("event %d: %w", id, ErrEventPublished)
		}
	}
	switch action {
	case SkipDrop:
		if _, err := tx.ExecContext(ctx, `UPDATE `+t.Ident()+` SET sent_at = now(), error = $3 WHERE id = $1 AND created_at = $2`,
			id, created, "dropped by hand (kubectl outbox skip; who, when and why in "+t.Name+"_skips)"); err != nil {
			return s, fmt.Errorf("dropping event %d: %w", id, err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+t.Derived("parked")+` WHERE id = $1`, id); err != nil {
			return s, fmt.Errorf("dropping the parked copy of event %d: %w", id, err)
		}
	case SkipDeadLetter:
		q := `UPDATE ` + t.Ident() + ` SET attempts = $3 WHERE id = $1 AND created_at = $2`
		args := []any{id, created, DeadLetterRequested}
		if s.Parked {
			q, args = `UPDATE `+t.Derived("parked")+` SET attempts = $2 WHERE id = $1`, []any{id, DeadLetterRequested}
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return s, fmt.Errorf("marking event %d for the dead-letter topic: %w", id, err)
		}
	}
	if err := tx.QueryRowContext(ctx, `INSERT INTO `+t.Derived("skips")+
		` (id, event_id, aggregate_id, action, reason, skipped_by, previous_attempts, previous_error)
VALUES ($1, $2::uuid, $3, $4, $5, $6, $7, $8) RETURNING db_user, skipped_at`,
		id, s.EventID, s.AggregateID, string(action), s.Reason, s.SkippedBy, s.PreviousAttempts, s.PreviousError).Scan(&s.DBUser, &s.SkippedAt); err != nil {
		return s, fmt.Errorf("recording the skip of event %d: %w", id, err)
	}
	if err := notifyRetry(ctx, tx, t, s.AggregateID); err != nil {
		return s, err
	}
	return s, tx.Commit()
}

// Retry is one recorded retry (a row of <table>_retries).
type Retry struct {
	AggregateID string `json:"aggregateID"`
	// Events is the number of failed events whose attempts were reset; MaxAttempts the highest
	// count reset, FirstError the error of the first of them.
	Events      int       `json:"events"`
	MaxAttempts int       `json:"maxAttempts"`
	FirstError  *string   `json:"firstError,omitempty"`
	RetriedBy   string    `json:"retriedBy"`
	RetriedAt   time.Time `json:"retriedAt"`
}

// RetryAggregate resets the attempts of the aggregate's failed events (unsent rows, or parked
// copies under snapshot tracking) to 0, records the retry with by, and tells the relays to end
// the aggregate's backoff, so that its first waiting event is tried again at once with a fresh
// backoff. Events skipped to the dead-letter topic keep their request.
func RetryAggregate(ctx context.Context, db *sql.DB, t Table, aggID, by string) (Retry, error) {
	r := Retry{AggregateID: aggID, RetriedBy: strings.TrimSpace(by)}
	switch {
	case aggID == "":
		return r, errors.New("an aggregate id is required")
	case r.RetriedBy == "":
		return r, ErrActorRequired
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return r, err
	}
	defer func() { _ = tx.Rollback() }()
	for _, q := range []string{
		`WITH f AS (SELECT id, created_at, attempts, error FROM ` + t.Ident() + `
  WHERE aggregate_id = $1 AND sent_at IS NULL AND attempts > 0 FOR UPDATE),
u AS (UPDATE ` + t.Ident() + ` AS o SET attempts = 0 FROM f WHERE o.id = f.id AND o.created_at = f.created_at)
SELECT count(*), coalesce(max(attempts), 0), (array_agg(error ORDER BY id))[1] FROM f`,
		`WITH f AS (SELECT id, attempts, error FROM ` + t.Derived("parked") + `
  WHERE bucket = ` + strings.Replace(BucketExpr, "aggregate_id", "$1::text", 1) + ` AND aggregate_id = $1 AND attempts > 0 FOR UPDATE),
u AS (UPDATE ` + t.Derived("parked") + ` AS p SET attempts = 0 FROM f WHERE p.id = f.id)
SELECT count(*), coalesce(max(attempts), 0), (array_agg(error ORDER BY id))[1] FROM f`,
	} {
		var (
			n, most int
			first   *string
		)
		if err := tx.QueryRowContext(ctx, q, aggID).Scan(&n, &most, &first); err != nil {
			return r, fmt.Errorf("resetting the attempts of aggregate %q: %w", aggID, err)
		}
		r.Events += n
		r.MaxAttempts = max(r.MaxAttempts, most)
		if r.FirstError == nil {
			r.FirstError = first
		}
	}
	if err := tx.QueryRowContext(ctx, `INSERT INTO `+t.Derived("retries")+` (aggregate_id, events, max_attempts, first_error, retried_by)
VALUES ($1, $2, $3, $4, $5) RETURNING retried_at`, aggID, r.Events, r.MaxAttempts, r.FirstError, r.RetriedBy).Scan(&r.RetriedAt); err != nil {
		return r, fmt.Errorf("recording the retry of aggregate %q: %w", aggID, err)
	}
	if err := notifyRetry(ctx, tx, t, aggID); err != nil {
		return r, err
	}
	return r, tx.Commit()
}

// notifyRetry tells the relays, when tx commits, to end the backoff of aggID.
func notifyRetry(ctx context.Context, tx *sql.Tx, t Table, aggID string) error {
	if _, err := tx.ExecContext(ctx, `SELECT pg_notify($1, $2)`, t.Channel(), RetryPayload(aggID)); err != nil {
		return fmt.Errorf("telling the relays to retry aggregate %q: %w", aggID, err)
	}
	return nil
}
