-- PostgreSQL 13 and 14 (issue: the version matrix): partition_has_pending (migration 00007) took
-- min() of the cursors' snapshot xmins, an aggregate over xid8 that PostgreSQL has only from 15;
-- once a snapshot cursor existed, partition upkeep, `kubectl outbox status` and replay requests
-- failed there for every role. The same function, with the oldest xmin found by ordering.
CREATE OR REPLACE FUNCTION {{.Func "partition_has_pending"}}(part text, day_end timestamptz) RETURNS boolean
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
    -- Not min(): PostgreSQL has no min(xid8) before 15.
    SELECT pg_snapshot_xmin(snap) INTO oldest FROM {{.Func "relay_cursor"}} ORDER BY 1 LIMIT 1;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I WHERE (txid IS NULL AND sent_at IS NULL) OR txid >= $1)',
        {{.SchemaLit}}, part) USING oldest INTO found;
    RETURN found;
END
$fn$;
