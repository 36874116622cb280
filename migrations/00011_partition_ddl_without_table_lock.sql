-- Partition upkeep that never makes the application's inserts wait (docs/architecture.md,
-- "Partitions").
--
-- CREATE TABLE ... PARTITION OF and DROP TABLE of a partition take an ACCESS EXCLUSIVE lock on the
-- outbox table. Behind one long application transaction that appended an event (and so holds the
-- table's ROW EXCLUSIVE lock until it ends) such a request waits, and every later insert queues
-- behind the request: the application stalls until that transaction ends. Now:
--   - a new day's partition is created as a table of its own, then attached: ATTACH PARTITION takes
--     SHARE UPDATE EXCLUSIVE on the outbox, with which inserts, updates and the relays' fetches do
--     not conflict;
--   - dropping a partition past retention still needs the outbox's ACCESS EXCLUSIVE lock (see
--     _drop_partition below), but waits for it at most 250 ms;
--   - every lock these functions wait for is bounded by lock_timeout: past it the pass fails, says
--     so, and is tried again later. Partitions are made days ahead (spec.partitions.premakeDays), so
--     a pass that fails costs nothing but its retry.

CREATE OR REPLACE FUNCTION {{.Func "create_partitions"}}(from_day date, to_day date) RETURNS SETOF text
LANGUAGE plpgsql AS $fn$
DECLARE
    d    date;
    part text;
    lo   timestamptz;
    hi   timestamptz;
BEGIN
    PERFORM set_config('lock_timeout', '1s', true);
    PERFORM pg_advisory_xact_lock({{.LockKey}}, -1);
    FOR d IN SELECT generate_series(from_day, to_day, interval '1 day')::date LOOP
        part := {{.NameLit}} || '_p' || to_char(d, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(format('%I.%I', {{.SchemaLit}}, part)) IS NOT NULL;
        lo := d::timestamp AT TIME ZONE 'UTC';
        hi := (d + 1)::timestamp AT TIME ZONE 'UTC';
        EXECUTE format('CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED)',
            {{.SchemaLit}}, part, {{.TableLit}});
        IF EXISTS (SELECT 1 FROM {{.Default}} WHERE created_at >= lo AND created_at < hi) THEN
            -- The relay fetches its rows FOR UPDATE: rows this transaction moves must make it wait.
            -- EXCLUSIVE conflicts with the ROW SHARE lock its fetch takes.
            EXECUTE format('LOCK TABLE %s IN EXCLUSIVE MODE', {{.DefaultLit}});
            EXECUTE format('WITH moved AS (DELETE FROM %s WHERE created_at >= $1 AND created_at < $2 RETURNING *) '
                'INSERT INTO %I.%I (id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, sent_at, attempts, error, txid) '
                'SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, sent_at, attempts, error, txid FROM moved',
                {{.DefaultLit}}, {{.SchemaLit}}, part) USING lo, hi;
        END IF;
        EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
            {{.TableLit}}, {{.SchemaLit}}, part, lo, hi);
        RETURN NEXT part;
    END LOOP;
END
$fn$;

-- Drops one daily partition past retention. DROP TABLE of a partition needs the outbox's ACCESS
-- EXCLUSIVE lock; DETACH PARTITION ... CONCURRENTLY, which would not, is refused while the table has
-- a default partition, which it keeps as a safety net. So the wait for that lock is bounded to
-- 250 ms: inserts that arrive meanwhile queue behind the request for at most that long, and a
-- request that times out (a transaction still uses the table) is tried again at a later pass
-- (lock_not_available, migrations.ErrPartitionBusy). The partition's own lock is taken first.
CREATE OR REPLACE FUNCTION {{.Func "drop_partition"}}(part text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF part !~ ('^' || {{.NameLit}} || '_p[0-9]{8}$') OR NOT EXISTS (
        SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = {{.TableLit}}::regclass AND c.relname = part) THEN
        RAISE EXCEPTION 'outbox: % is not a daily partition of %', part, {{.TableLit}}
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('lock_timeout', '1s', true);
    EXECUTE format('LOCK TABLE %I.%I IN ACCESS EXCLUSIVE MODE', {{.SchemaLit}}, part);
    IF {{.Func "partition_has_pending"}}(part, (to_date(right(part, 8), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC') THEN
        RAISE EXCEPTION 'outbox: partition % still holds unsent events; it is kept', part
            USING ERRCODE = 'object_in_use';
    END IF;
    PERFORM set_config('lock_timeout', '250ms', true);
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', {{.TableLit}});
    EXECUTE format('DROP TABLE %I.%I', {{.SchemaLit}}, part);
END
$fn$;
