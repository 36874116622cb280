-- The backlog of snapshot tracking past the count limit, with several cursor rows (shards).
--
-- Migration 00007 counted the rows of each cursor row in turn until the limit, so past it every
-- row was counted from the first cursor row alone: the whole table's backlog (the operator's
-- status.pendingEvents, which the autoscaler acts on) was extrapolated from one shard's events,
-- whose ids are a fraction of all ids, and came out as that fraction of the backlog (a 4-shard
-- table: about a quarter). Now each cursor row counts up to its share of the limit (by its
-- buckets) and a row that reaches it is extrapolated from the density of its own counted ids;
-- the sum is returned as counted (above lim, possibly) with first_id and last_counted_id NULL,
-- which migrations.Backlog.Pending takes as it is. Below the limit nothing changes: exact.
--
-- The rows are still read through the transaction-id index, in runs of neighbouring rows, not
-- bucket by bucket through the bucket index: a bucket's rows are scattered one per page, and a
-- count of a shard's 100,000 events read 4x the pages that way (measured with
-- pg_stat_statements, 4 shards, 500k backlog).
CREATE OR REPLACE FUNCTION {{.Func "snapshot_backlog"}}(wanted smallint[], lim integer,
    OUT counted bigint, OUT first_id bigint, OUT last_counted_id bigint, OUT last_id bigint, OUT oldest_age float8)
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    c         record;
    n         bigint;
    lo        bigint;
    hi        bigint;
    oldest    timestamptz;
    t         timestamptz;
    top       bigint;
    nb        integer;
    share     integer;
    estimate  float8 := 0;
    estimated boolean := false;
BEGIN
    counted := 0;
    top := pg_sequence_last_value({{.SeqRegclass}}::regclass);
    IF NOT EXISTS (SELECT 1 FROM {{.Func "relay_cursor"}}) THEN
        -- No snapshot relay has started yet: every unsent row is pending.
        SELECT count(*), min(p.id), max(p.id), min(p.created_at) INTO counted, first_id, last_counted_id, oldest FROM (
            SELECT o.id, o.created_at FROM {{.Table}} o
            WHERE o.sent_at IS NULL AND (wanted IS NULL OR {{.BucketExprOf "o"}} = ANY(wanted))
            ORDER BY o.id LIMIT lim) p;
        estimate := counted;
    END IF;
    SELECT count(*) INTO nb FROM {{.Func "relay_cursor"}} cr, unnest(cr.buckets) AS b WHERE wanted IS NULL OR b = ANY(wanted);
    FOR c IN
        SELECT cr.*, (SELECT count(*) FROM unnest(cr.buckets) AS b WHERE wanted IS NULL OR b = ANY(wanted)) AS mine
        FROM {{.Func "relay_cursor"}} cr WHERE wanted IS NULL OR cr.buckets && wanted ORDER BY cr.id
    LOOP
        share := greatest(3, ceil(lim::float8 * c.mine / greatest(nb, 1)));
        IF c.snap IS NULL THEN
            SELECT count(*), min(p.id), max(p.id), min(p.created_at) INTO n, lo, hi, t FROM (
                SELECT o.id, o.created_at FROM {{.Table}} o
                WHERE o.sent_at IS NULL AND {{.BucketExprOf "o"}} = ANY(c.buckets)
                  AND (wanted IS NULL OR {{.BucketExprOf "o"}} = ANY(wanted))
                  AND NOT {{.Func "cursor_passed"}}(c.snap, c.next_snap, c.last_id, o.id, o.txid)
                ORDER BY o.id LIMIT share) p;
        ELSE
            SELECT count(*), min(p.id), max(p.id), min(p.created_at) INTO n, lo, hi, t FROM (
                SELECT o.id, o.created_at FROM {{.Table}} o
                WHERE o.txid >= pg_snapshot_xmin(c.snap) AND {{.BucketExprOf "o"}} = ANY(c.buckets)
                  AND (wanted IS NULL OR {{.BucketExprOf "o"}} = ANY(wanted))
                  AND NOT {{.Func "cursor_passed"}}(c.snap, c.next_snap, c.last_id, o.id, o.txid)
                LIMIT share) p;
        END IF;
        IF n >= share AND top > hi AND hi > lo THEN
            -- More than its share: past its last counted id, as many per id as among its
            -- counted ones ((n - 2) / (hi - lo): the unbiased rate of n ids over random gaps).
            estimate := estimate + n + (n - 2) * (top - hi)::float8 / (hi - lo);
            estimated := true;
        ELSE
            estimate := estimate + n;
        END IF;
        counted := counted + n;
        first_id := least(first_id, lo);
        last_counted_id := greatest(last_counted_id, hi);
        oldest := least(oldest, t);
    END LOOP;
    SELECT count(*), min(p.id), max(p.id), min(p.created_at) INTO n, lo, hi, t
    FROM {{.Func "parked"}} p WHERE wanted IS NULL OR p.bucket = ANY(wanted);
    counted := counted + n;
    estimate := estimate + n;
    first_id := least(first_id, lo);
    last_counted_id := greatest(last_counted_id, hi);
    oldest := least(oldest, t);
    IF estimated THEN
        counted := greatest(counted, round(estimate)::bigint);
        first_id := NULL;
        last_counted_id := NULL;
    END IF;
    IF counted > 0 THEN
        last_id := greatest(last_counted_id, top);
    END IF;
    oldest_age := coalesce(extract(epoch FROM clock_timestamp() - oldest)::float8, 0);
END
$fn$;
