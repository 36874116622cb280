-- Replays: requests to publish retained events again (`kubectl outbox replay`, outboxdb.RequestReplay),
-- executed by the relays (relay/replay.go, docs/architecture.md "Replays").
--
-- A replay covers the positions (row ids) from_id to to_id, fixed when it is requested, and
-- publishes the events of that range that were published (not pending, parked or dead-lettered)
-- once more, in id order, with the event_id they had. One relay at a time runs the table's
-- replays, one after the other, while it holds pg_advisory_lock(<lock key>, -10) on a connection
-- of its own; it commits last_id and replayed after every batch, so a replay whose relay stopped
-- continues, under whichever relay takes the lock next, after the last batch it committed.
CREATE TABLE {{.Func "replays"}} (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    requested_by  text        NOT NULL DEFAULT current_user,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    reason        text,
    -- The bounds as the user gave them (a time, a row id or an event id), for display.
    from_spec     text        NOT NULL,
    to_spec       text,
    -- The range of positions replayed, both included.
    from_id       bigint      NOT NULL,
    to_id         bigint      NOT NULL CHECK (to_id >= from_id),
    -- Only the events of this aggregate, when set.
    aggregate_id  text        CHECK (aggregate_id <> ''),
    -- The topic every event goes to, when set; else each goes to its own topic.
    topic         text        CHECK (topic <> ''),
    -- Events per second at most; 0 publishes as fast as the brokers take them.
    rate          integer     NOT NULL DEFAULT 0 CHECK (rate >= 0),
    -- The events the range held that were published when it was requested (the progress's 100%).
    total         bigint      NOT NULL DEFAULT 0,
    state         text        NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'running', 'done', 'failed', 'cancelled')),
    -- Progress: every position up to last_id is replayed; replayed counts the events published.
    last_id       bigint      NOT NULL,
    replayed      bigint      NOT NULL DEFAULT 0,
    runner        text,
    started_at    timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    error         text
);

-- The relays look for work every few seconds: this index holds only the replays not finished.
CREATE INDEX {{.Index "replays_open_idx"}} ON {{.Func "replays"}} (id) WHERE state IN ('pending', 'running');

COMMENT ON TABLE {{.Func "replays"}} IS 'outbox-operator: requests to publish retained events again (kubectl outbox replay), with their progress; executed by the relays.';
