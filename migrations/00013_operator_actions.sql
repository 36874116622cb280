-- What people did to events by hand (`kubectl outbox skip` and `kubectl outbox retry`): every such
-- act is recorded with who, when and why (docs/operating.md).
--
-- A skip is the only way an event is ever dropped. Dropped: the event is marked done without being
-- published (its row's sent_at in either mode; in snapshot tracking its parked copy is deleted).
-- Sent to the dead-letter topic: the event's attempts are set to -1 (outboxdb.DeadLetterRequested,
-- on its row or, parked, on its parked copy), which the relay reads with the event and publishes
-- it to its dead-letter topic instead of its own, in order within its aggregate.
CREATE TABLE {{.Func "skips"}} (
    skip_id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                bigint      NOT NULL,
    event_id          uuid        NOT NULL,
    aggregate_id      text        NOT NULL,
    action            text        NOT NULL CHECK (action IN ('drop', 'dead-letter')),
    reason            text        NOT NULL CHECK (reason <> ''),
    -- The Kubernetes user who asked (SelfSubjectReview, else the kubeconfig's user), and the
    -- database role that wrote the row.
    skipped_by        text        NOT NULL CHECK (skipped_by <> ''),
    db_user           text        NOT NULL DEFAULT current_user,
    skipped_at        timestamptz NOT NULL DEFAULT now(),
    -- What the event was when it was skipped: its attempts and last error.
    previous_attempts integer     NOT NULL,
    previous_error    text
);

CREATE INDEX {{.Index "skips_id_idx"}} ON {{.Func "skips"}} (id);

COMMENT ON TABLE {{.Func "skips"}} IS 'outbox-operator: events skipped by hand (dropped, or sent to the dead-letter topic), with who, when and why.';

-- Retries by hand: the attempts of an aggregate's failed events reset to 0 and its backoff ended
-- (the relays are told on the table's channel, outboxdb.RetryNotification).
CREATE TABLE {{.Func "retries"}} (
    retry_id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregate_id text        NOT NULL,
    events       integer     NOT NULL,
    -- The highest attempts count reset, and the first failed event's error.
    max_attempts integer     NOT NULL,
    first_error  text,
    retried_by   text        NOT NULL CHECK (retried_by <> ''),
    db_user      text        NOT NULL DEFAULT current_user,
    retried_at   timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE {{.Func "retries"}} IS 'outbox-operator: retries of failed aggregates by hand, with who and when.';
