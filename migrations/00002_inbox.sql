-- Consumers dedupe by event_id in their own transaction (package inbox).
CREATE TABLE IF NOT EXISTS {{.Inbox}} (
    event_id     uuid        PRIMARY KEY,
    topic        text        NOT NULL DEFAULT '',
    processed_at timestamptz NOT NULL DEFAULT now()
);
