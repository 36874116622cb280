-- Snapshot tracking (docs/architecture.md, "Tracking progress"): a relay may publish without
-- updating event rows. Every row records the transaction that wrote it; a relay reads the events
-- committed between two PostgreSQL snapshots and keeps its progress in one cursor row per set of
-- buckets. Row tracking (sent_at per row) keeps working unchanged on the same schema.

-- The transaction that wrote the row. Added without a default first, so that existing rows are
-- not rewritten (they stay NULL: the snapshot relay publishes them as the row-tracking backlog).
ALTER TABLE {{.Table}} ADD COLUMN txid xid8;
ALTER TABLE {{.Table}} ALTER COLUMN txid SET DEFAULT pg_current_xact_id();

-- The id is drawn after the transaction has its id. Without this, the first row of a transaction
-- drew its id (nextval, the first column's default) before its transaction id was assigned (by
-- the txid default), and a snapshot taken in between would not list that transaction while its
-- row's id lay below the ids the snapshot's later batches start from. CASE evaluates in order.
ALTER TABLE {{.Table}} ALTER COLUMN id SET DEFAULT
    CASE WHEN pg_current_xact_id() IS NOT NULL THEN nextval({{.SeqRegclass}}::regclass) END;

-- A batch's transactions by id: the range between two snapshots and the transactions that were
-- still open at the older one. The id bounds the batch's walk of the id index, and orders the
-- rows of one transaction, so that a large one open at the older snapshot is read in chunks.
CREATE INDEX {{.Index "txid_idx"}} ON {{.Table}} (txid, id) WHERE txid IS NOT NULL;

-- Progress of snapshot tracking. Every bucket (0-255) is in exactly one row once a snapshot relay
-- has started; a row holds the buckets of one shard, or a part of them right after a reshard.
-- Row tracking leaves the table empty, which is how a relay tells the table's mode.
CREATE TABLE {{.Func "relay_cursor"}} (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    buckets           smallint[]  NOT NULL,
    -- Every event of these buckets committed in this snapshot is published (or parked). NULL
    -- before the first batch: then next_snap's batch is every unsent row (sent_at IS NULL)
    -- committed in next_snap, including rows written before snapshot tracking.
    snap              pg_snapshot,
    -- The batch in progress: the events committed in next_snap and not in snap, of which those
    -- with id <= last_id are published (or parked). NULL between batches.
    next_snap         pg_snapshot,
    last_id           bigint      NOT NULL DEFAULT 0,
    -- The database the snapshots belong to: transaction ids restart after a restore elsewhere.
    system_identifier bigint      NOT NULL,
    updated_at        timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);

COMMENT ON TABLE {{.Func "relay_cursor"}} IS 'outbox-operator: snapshot-tracking progress per set of buckets; written by relays holding the buckets'' locks (and by `relay cursor reset`).';

-- Every reset of the cursor (`relay cursor reset`): a destructive act, recorded.
CREATE TABLE {{.Func "relay_cursor_resets"}} (
    reset_at   timestamptz NOT NULL DEFAULT now(),
    reset_to   text        NOT NULL,
    reset_by   text        NOT NULL DEFAULT current_user,
    reason     text        NOT NULL,
    -- Events no cursor had passed when it was reset to now: they will not be published.
    skipped    bigint      NOT NULL
);

COMMENT ON TABLE {{.Func "relay_cursor_resets"}} IS 'outbox-operator: resets of the snapshot cursor, with who, when, why and how many events were skipped.';

-- Events of snapshot-tracked relays that could not be published: a failed event and every later
-- event of its aggregate wait here, in order, and the relay retries them with backoff.
CREATE TABLE {{.Func "parked"}} (
    id              bigint      PRIMARY KEY,
    created_at      timestamptz NOT NULL,
    event_id        uuid        NOT NULL,
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    headers         jsonb       NOT NULL,
    bucket          smallint    NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    error           text,
    parked_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX {{.Index "parked_aggregate_idx"}} ON {{.Func "parked"}} (bucket, aggregate_id, id);

COMMENT ON TABLE {{.Func "parked"}} IS 'outbox-operator: events a snapshot-tracked relay could not publish yet, with every later event of their aggregates; retried in order.';

-- Events of snapshot-tracked relays published to the dead-letter topic (row tracking records this
-- on the row: sent_at and error).
CREATE TABLE {{.Func "dead_lettered"}} (
    id               bigint      PRIMARY KEY,
    event_id         uuid        NOT NULL,
    aggregate_id     text        NOT NULL,
    error            text        NOT NULL,
    dead_lettered_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE {{.Func "dead_lettered"}} IS 'outbox-operator: events a snapshot-tracked relay published to the dead-letter topic, with the reason.';

-- Whether the event with this id was published: its row's sent_at in row tracking; in snapshot
-- tracking, whether the cursor of its bucket has passed it and it is not parked. NULL when no
-- such event exists (or it was dropped with its partition).
CREATE FUNCTION {{.Func "published"}}(event bigint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    e record;
    c record;
BEGIN
    SELECT id, txid, sent_at, {{.BucketExpr}} AS bucket INTO e FROM {{.Table}} WHERE id = event;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF e.sent_at IS NOT NULL THEN
        RETURN true;
    END IF;
    SELECT * INTO c FROM {{.Func "relay_cursor"}} WHERE e.bucket = ANY(buckets);
    IF NOT FOUND OR EXISTS (SELECT 1 FROM {{.Func "parked"}} WHERE id = event) THEN
        RETURN false;
    END IF;
    RETURN {{.Func "cursor_passed"}}(c.snap, c.next_snap, c.last_id, e.id, e.txid);
END
$fn$;

-- Whether a cursor (snap, next_snap, last_id) has passed the unsent event (id, txid).
CREATE FUNCTION {{.Func "cursor_passed"}}(snap pg_snapshot, next_snap pg_snapshot, last_id bigint, id bigint, txid xid8)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE
        WHEN snap IS NOT NULL AND txid IS NOT NULL AND pg_visible_in_snapshot(txid, snap) THEN true
        WHEN next_snap IS NULL THEN false
        WHEN txid IS NOT NULL AND NOT pg_visible_in_snapshot(txid, next_snap) THEN false
        WHEN snap IS NULL OR txid IS NOT NULL THEN id <= last_id
        ELSE false
    END
$fn$;

-- Events not yet published, in either mode, for tools and tests: every unsent row in row
-- tracking; in snapshot tracking, the rows no cursor has passed plus the parked events. Exact,
-- and as costly as reading them: the relays and the operator measure with a bounded statement.
CREATE FUNCTION {{.Func "pending"}}() RETURNS bigint
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    n bigint := 0;
    k bigint;
    c record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {{.Func "relay_cursor"}}) THEN
        SELECT count(*) INTO n FROM {{.Table}} WHERE sent_at IS NULL;
        RETURN n;
    END IF;
    FOR c IN SELECT * FROM {{.Func "relay_cursor"}} LOOP
        IF c.snap IS NULL THEN
            SELECT count(*) INTO k FROM {{.Table}} o
            WHERE o.sent_at IS NULL AND {{.BucketExprOf "o"}} = ANY(c.buckets)
              AND NOT {{.Func "cursor_passed"}}(c.snap, c.next_snap, c.last_id, o.id, o.txid);
        ELSE
            -- Every transaction the cursor has not passed has an id from its snapshot's xmin on.
            SELECT count(*) INTO k FROM {{.Table}} o
            WHERE o.txid >= pg_snapshot_xmin(c.snap) AND {{.BucketExprOf "o"}} = ANY(c.buckets)
              AND NOT {{.Func "cursor_passed"}}(c.snap, c.next_snap, c.last_id, o.id, o.txid);
        END IF;
        n := n + k;
    END LOOP;
    RETURN n + (SELECT count(*) FROM {{.Func "parked"}});
END
$fn$;

-- The backlog of snapshot tracking for the buckets given (NULL: all), in the shape of the row
-- tracking's backlog statement (migrations.BacklogSQL): at most lim rows counted, the lowest and
-- highest counted id, the highest id that may be pending, and the age of the oldest counted row.
-- It reads the transaction-id index from each cursor's oldest unfinished transaction on.
CREATE FUNCTION {{.Func "snapshot_backlog"}}(wanted smallint[], lim integer,
    OUT counted bigint, OUT first_id bigint, OUT last_counted_id bigint, OUT last_id bigint, OUT oldest_age float8)
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    c        record;
    n        bigint;
    lo       bigint;
    hi       bigint;
    oldest   timestamptz;
    t        timestamptz;
BEGIN
    counted := 0;
    IF NOT EXISTS (SELECT 1 FROM {{.Func "relay_cursor"}}) THEN
        -- No snapshot relay has started yet: every unsent row is pending.
        SELECT count(*), min(p.id), max(p.id), min(p.created_at) INTO counted, first_id, last_counted_id, oldest FROM (
            SELECT o.id, o.created_at FROM {{.Table}} o
            WHERE o.sent_at IS NULL AND (wanted IS NULL OR {{.BucketExprOf "o"}} = ANY(wanted))
            ORDER BY o.id LIMIT lim) p;
    END IF;
    FOR c IN SELECT * FROM {{.Func "relay_cursor"}} WHERE wanted IS NULL OR buckets && wanted LOOP
        EXIT WHEN counted >= lim;
        IF c.snap IS NULL THEN
            SELECT count(*), min(p.id), max(p.id), min(p.created_at) INTO n, lo, hi, t FROM (
                SELECT o.id, o.created_at FROM {{.Table}} o
                WHERE o.sent_at IS NULL AND {{.BucketExprOf "o"}} = ANY(c.buckets)
                  AND (wanted IS NULL OR {{.BucketExprOf "o"}} = ANY(wanted))
                  AND NOT {{.Func "cursor_passed"}}(c.snap, c.next_snap, c.last_id, o.id, o.txid)
                ORDER BY o.id LIMIT lim - counted) p;
        ELSE
            SELECT count(*), min(p.id), max(p.id), min(p.created_at) INTO n, lo, hi, t FROM (
                SELECT o.id, o.created_at FROM {{.Table}} o
                WHERE o.txid >= pg_snapshot_xmin(c.snap) AND {{.BucketExprOf "o"}} = ANY(c.buckets)
                  AND (wanted IS NULL OR {{.BucketExprOf "o"}} = ANY(wanted))
                  AND NOT {{.Func "cursor_passed"}}(c.snap, c.next_snap, c.last_id, o.id, o.txid)
                LIMIT lim - counted) p;
        END IF;
        counted := counted + n;
        first_id := least(first_id, lo);
        last_counted_id := greatest(last_counted_id, hi);
        oldest := least(oldest, t);
    END LOOP;
    SELECT count(*), min(p.id), max(p.id), min(p.created_at) INTO n, lo, hi, t
    FROM {{.Func "parked"}} p WHERE wanted IS NULL OR p.bucket = ANY(wanted);
    counted := counted + n;
    first_id := least(first_id, lo);
    last_counted_id := greatest(last_counted_id, hi);
    oldest := least(oldest, t);
    IF counted > 0 THEN
        last_id := greatest(last_counted_id, pg_sequence_last_value({{.SeqRegclass}}::regclass));
    END IF;
    oldest_age := coalesce(extract(epoch FROM clock_timestamp() - oldest)::float8, 0);
END
$fn$;

-- Whether a daily partition may still hold an event that is not published, in either mode. In
-- snapshot tracking a row's sent_at stays NULL, so a partition is kept while a transaction that
-- began before its day ended is still open (it may still insert into it, with created_at = now()
-- its start time), or while one of its rows belongs to a transaction some cursor has not passed.
CREATE FUNCTION {{.Func "partition_has_pending"}}(part text, day_end timestamptz) RETURNS boolean
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    oldest xid8;
    found  boolean;
BEGIN
    -- A transaction that inserted into the partition holds its RowExclusiveLock until it ends; its
    -- rows are invisible until then, so they are found this way (in either mode).
    IF EXISTS (SELECT 1 FROM pg_locks WHERE relation = format('%I.%I', {{.SchemaLit}}, part)::regclass
               AND mode = 'RowExclusiveLock' AND pid <> pg_backend_pid()) THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {{.Func "relay_cursor"}}) THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I WHERE sent_at IS NULL)', {{.SchemaLit}}, part) INTO found;
        RETURN found;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND xact_start < day_end) THEN
        RETURN true;
    END IF;
    IF EXISTS (SELECT 1 FROM {{.Func "relay_cursor"}} WHERE snap IS NULL) THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I WHERE sent_at IS NULL)', {{.SchemaLit}}, part) INTO found;
        RETURN found;
    END IF;
    SELECT min(pg_snapshot_xmin(snap)) INTO oldest FROM {{.Func "relay_cursor"}};
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I WHERE (txid IS NULL AND sent_at IS NULL) OR txid >= $1)',
        {{.SchemaLit}}, part) USING oldest INTO found;
    RETURN found;
END
$fn$;

CREATE OR REPLACE FUNCTION {{.Func "partitions"}}() RETURNS TABLE (name text, day date, has_pending boolean)
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT c.relname::text AS relname
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = {{.TableLit}}::regclass
          AND c.relname ~ ('^' || {{.NameLit}} || '_p[0-9]{8}$')
        ORDER BY c.relname
    LOOP
        name := r.relname;
        day := to_date(right(r.relname, 8), 'YYYYMMDD');
        has_pending := {{.Func "partition_has_pending"}}(r.relname, (day + 1)::timestamp AT TIME ZONE 'UTC');
        RETURN NEXT;
    END LOOP;
END
$fn$;

CREATE OR REPLACE FUNCTION {{.Func "drop_partition"}}(part text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF part !~ ('^' || {{.NameLit}} || '_p[0-9]{8}$') OR NOT EXISTS (
        SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = {{.TableLit}}::regclass AND c.relname = part) THEN
        RAISE EXCEPTION 'outbox: % is not a daily partition of %', part, {{.TableLit}}
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Waiting for the lock behind a transaction that writes into the partition would queue every
    -- reader of the table (the relays' fetches) behind this request: give up after a moment; the
    -- partition is kept and tried again at the next pass.
    PERFORM set_config('lock_timeout', '2s', true);
    EXECUTE format('LOCK TABLE %I.%I IN ACCESS EXCLUSIVE MODE', {{.SchemaLit}}, part);
    IF {{.Func "partition_has_pending"}}(part, (to_date(right(part, 8), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC') THEN
        RAISE EXCEPTION 'outbox: partition % still holds unsent events; it is kept', part
            USING ERRCODE = 'object_in_use';
    END IF;
    EXECUTE format('DROP TABLE %I.%I', {{.SchemaLit}}, part);
END
$fn$;

-- Rows of a day that sat in the default partition keep their transaction id when they move into
-- the day's new partition.
CREATE OR REPLACE FUNCTION {{.Func "create_partitions"}}(from_day date, to_day date) RETURNS SETOF text
LANGUAGE plpgsql AS $fn$
DECLARE
    d    date;
    part text;
    lo   timestamptz;
    hi   timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock({{.LockKey}}, -1);
    FOR d IN SELECT generate_series(from_day, to_day, interval '1 day')::date LOOP
        part := {{.NameLit}} || '_p' || to_char(d, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(format('%I.%I', {{.SchemaLit}}, part)) IS NOT NULL;
        lo := d::timestamp AT TIME ZONE 'UTC';
        hi := (d + 1)::timestamp AT TIME ZONE 'UTC';
        IF EXISTS (SELECT 1 FROM {{.Default}} WHERE created_at >= lo AND created_at < hi) THEN
            -- The relay fetches with FOR UPDATE SKIP LOCKED: rows this transaction moves must make
            -- it wait, not skip them (skipping could publish a later event of the same aggregate
            -- first). EXCLUSIVE conflicts with the ROW SHARE lock its fetch takes.
            EXECUTE format('LOCK TABLE %s IN EXCLUSIVE MODE', {{.DefaultLit}});
            EXECUTE format('CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED)',
                {{.SchemaLit}}, part, {{.TableLit}});
            EXECUTE format('WITH moved AS (DELETE FROM %s WHERE created_at >= $1 AND created_at < $2 RETURNING *) '
                'INSERT INTO %I.%I (id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, sent_at, attempts, error, txid) '
                'SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, sent_at, attempts, error, txid FROM moved',
                {{.DefaultLit}}, {{.SchemaLit}}, part) USING lo, hi;
            EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
                {{.TableLit}}, {{.SchemaLit}}, part, lo, hi);
        ELSE
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                {{.SchemaLit}}, part, {{.TableLit}}, lo, hi);
        END IF;
        RETURN NEXT part;
    END LOOP;
END
$fn$;
