-- The lag more shards can fix, for the built-in autoscaler (controllers, desiredShards).
--
-- The backlog's age (<table>_snapshot_backlog, migrations.BacklogSQL) is the age of the oldest
-- event not yet published, whatever holds it back. An event that failed (a poison event under
-- the block policy, or one being retried after a broker refused it) holds back its aggregate's
-- later events on purpose, and the lag it causes grows until someone fixes it; more shards would
-- publish none of them, and an autoscaler reading that lag would scale to its maximum and stay
-- there. This is the age of the oldest event nothing holds back, in seconds, NULL when there is
-- none:
--   - row tracking: among the first lim unsent rows by id, those whose aggregate has no failed
--     row (attempts > 0) at or before them;
--   - snapshot tracking: the rows no cursor has passed (failed events and their aggregates' later
--     events wait in <table>_parked, which is left out), read as <table>_snapshot_backlog reads
--     them.
CREATE FUNCTION {{.Func "scalable_lag"}}(lim integer) RETURNS float8
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    c      record;
    t      timestamptz;
    oldest timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {{.Func "relay_cursor"}}) THEN
        SELECT min(h.created_at) INTO oldest FROM (
            SELECT o.created_at, bool_or(o.attempts > 0) OVER (PARTITION BY o.aggregate_id ORDER BY o.id) AS held
            FROM (SELECT id, aggregate_id, attempts, created_at FROM {{.Table}}
                  WHERE sent_at IS NULL ORDER BY id LIMIT lim) o
        ) h WHERE NOT h.held;
    ELSE
        FOR c IN SELECT * FROM {{.Func "relay_cursor"}} LOOP
            IF c.snap IS NULL THEN
                SELECT o.created_at INTO t FROM {{.Table}} o
                WHERE o.sent_at IS NULL AND {{.BucketExprOf "o"}} = ANY(c.buckets)
                  AND NOT {{.Func "cursor_passed"}}(c.snap, c.next_snap, c.last_id, o.id, o.txid)
                ORDER BY o.id LIMIT 1;
            ELSE
                SELECT min(p.created_at) INTO t FROM (
                    SELECT o.created_at FROM {{.Table}} o
                    WHERE o.txid >= pg_snapshot_xmin(c.snap) AND {{.BucketExprOf "o"}} = ANY(c.buckets)
                      AND NOT {{.Func "cursor_passed"}}(c.snap, c.next_snap, c.last_id, o.id, o.txid)
                    LIMIT lim) p;
            END IF;
            oldest := least(oldest, t);
        END LOOP;
    END IF;
    RETURN extract(epoch FROM clock_timestamp() - oldest);
END
$fn$;
