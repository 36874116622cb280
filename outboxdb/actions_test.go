package outboxdb_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

func TestRetryPayload(t *testing.T) {
	long := strings.Repeat("a", 8000)
	for agg, want := range map[string]string{"order-42": "retry:order-42", "": "retry:", long: "retry:"} {
		if got := outboxdb.RetryPayload(agg); got != want {
			t.Errorf("RetryPayload(%.20q) = %.30q, want %.30q", agg, got, want)
		}
	}
}

// TestSkipAndRetryRefuseBadInput: a skip without a reason, an actor or a valid action, of an
// event that does not exist or is published, or a second skip, is refused and changes nothing.
func TestSkipAndRetryRefuseBadInput(t *testing.T) {
	db, _ := openDB(t)
	ctx := context.Background()
	tbl := outboxdb.MustParseTable("public.outbox")
	if _, err := outboxdb.Apply(ctx, db, tbl); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
VALUES ('order', 'a', 'Placed', '{}', NULL), ('order', 'a', 'Paid', '{}', NULL), ('order', 'b', 'Placed', '{}', now())`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id         int64
		action     outboxdb.SkipAction
		by, reason string
		want       error
	}{
		{1, outboxdb.SkipDrop, "jane", " ", outboxdb.ErrReasonRequired},
		{1, outboxdb.SkipDrop, "", "why", outboxdb.ErrActorRequired},
		{1, "delete", "jane", "why", outboxdb.ErrInvalidSkipAction},
		{99, outboxdb.SkipDrop, "jane", "why", outboxdb.ErrNoSuchEvent},
		{3, outboxdb.SkipDeadLetter, "jane", "why", outboxdb.ErrEventPublished},
	} {
		if _, err := outboxdb.SkipEvent(ctx, db, tbl, c.id, c.action, c.by, c.reason); !errors.Is(err, c.want) {
			t.Errorf("SkipEvent(%d, %s, %q, %q) = %v, want %v", c.id, c.action, c.by, c.reason, err, c.want)
		}
	}
	if _, err := outboxdb.RetryAggregate(ctx, db, tbl, "a", ""); !errors.Is(err, outboxdb.ErrActorRequired) {
		t.Errorf("RetryAggregate without an actor: %v", err)
	}
	var changed int
	if err := db.QueryRow(`SELECT (SELECT count(*) FROM outbox_skips) + (SELECT count(*) FROM outbox_retries) +
  (SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL AND id <> 3) + (SELECT count(*) FROM outbox WHERE attempts <> 0)`).Scan(&changed); err != nil || changed != 0 {
		t.Fatalf("refused input changed %d rows (%v)", changed, err)
	}

	s, err := outboxdb.SkipEvent(ctx, db, tbl, 1, outboxdb.SkipDeadLetter, "jane", "why")
	if err != nil || s.AggregateID != "a" || s.SkippedBy != "jane" || s.DBUser == "" {
		t.Fatalf("SkipEvent: %+v, %v", s, err)
	}
	var attempts int
	if err := db.QueryRow(`SELECT attempts FROM outbox WHERE id = 1`).Scan(&attempts); err != nil || attempts != outboxdb.DeadLetterRequested {
		t.Errorf("attempts after a skip to the dead-letter topic: %d (%v)", attempts, err)
	}
	if _, err := outboxdb.SkipEvent(ctx, db, tbl, 1, outboxdb.SkipDrop, "jane", "again"); !errors.Is(err, outboxdb.ErrEventSkipped) {
		t.Errorf("second skip: %v", err)
	}
	// A retry leaves the request to dead-letter the event standing.
	if r, err := outboxdb.RetryAggregate(ctx, db, tbl, "a", "jane"); err != nil || r.Events != 0 {
		t.Errorf("RetryAggregate: %+v, %v", r, err)
	}
	if err := db.QueryRow(`SELECT attempts FROM outbox WHERE id = 1`).Scan(&attempts); err != nil || attempts != outboxdb.DeadLetterRequested {
		t.Errorf("attempts after a retry: %d (%v)", attempts, err)
	}
}
