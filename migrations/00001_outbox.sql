-- The outbox table, partitioned by UTC day on created_at, with its sequence, default partition,
-- pending index and notify trigger. Identifiers are template parameters, already quoted.
CREATE SEQUENCE {{.Seq}} AS bigint;

CREATE TABLE {{.Table}} (
    id             bigint      NOT NULL DEFAULT nextval({{.SeqRegclass}}::regclass),
    event_id       uuid        NOT NULL DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL CHECK (aggregate_type <> ''),
    aggregate_id   text        NOT NULL CHECK (aggregate_id <> ''),
    event_type     text        NOT NULL CHECK (event_type <> ''),
    payload        jsonb       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(headers) = 'object'),
    created_at     timestamptz NOT NULL DEFAULT now(),
    sent_at        timestamptz,
    attempts       integer     NOT NULL DEFAULT 0,
    error          text,
    -- One of 256 buckets, fixed at insert time by the function PostgreSQL's hash partitioning
    -- uses (stable across upgrades). Shard k of N owns the buckets b with b % N = k.
    shard_bucket   smallint    GENERATED ALWAYS AS ((hashtextextended(aggregate_id, 0) & 255)::smallint) STORED,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

ALTER SEQUENCE {{.Seq}} OWNED BY {{.Table}}.id;

COMMENT ON TABLE {{.Table}} IS 'Transactional outbox: events committed with business data, published to Kafka by outbox-operator relays.';

-- Safety net: an insert never fails for want of a daily partition.
CREATE TABLE {{.Default}} PARTITION OF {{.Table}} DEFAULT;

-- The relay's fetch order over pending rows only; sent rows cost it nothing.
CREATE INDEX {{.PendingIndex}} ON {{.Table}} (id) WHERE sent_at IS NULL;

-- One wake-up per transaction: PostgreSQL folds identical notifications of a transaction into one.
CREATE FUNCTION {{.NotifyFunc}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify({{.ChannelLit}}, '');
    RETURN NULL;
END
$fn$;

CREATE TRIGGER {{.NotifyTrigger}} AFTER INSERT ON {{.Table}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.NotifyFunc}}();
