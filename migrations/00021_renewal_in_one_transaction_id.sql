-- A renewal of a live wake-up claim draws one transaction id, not two (docs/architecture.md,
-- "Wake-ups"; issue 28, the idle cost). Migration 00015 wrote the claiming session's row in a
-- subtransaction on every call, so that a new claim learns an id drawn after it took effect (the
-- upper bound of the transactions to watch). A renewal of a claim that has not lapsed only
-- filters the watch it is given and needs no such id: 100 idle shards woken by notifications,
-- renewing every 10 s, drew 21 ids a second (make bench, "Idle shards", 2026-12-06). The same
-- function, with the subtransaction for a new claim only.
CREATE OR REPLACE FUNCTION {{.Func "relay_wait"}}(claim interval, watch bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $fn$
DECLARE
    prev  timestamptz;
    fresh boolean;
    own   bigint;
    above bigint;
    snap  pg_snapshot;
    res   bigint[];
BEGIN
    PERFORM pg_advisory_xact_lock({{.LockKey}}, -3);
    SELECT until INTO prev FROM {{.Func "relay_waiting"}} WHERE pid = pg_backend_pid();
    fresh := watch IS NULL OR prev IS NULL OR prev < now();
    own := pg_current_xact_id()::text::bigint;
    -- The claim takes effect here: a writer's insert that reads the sequence from now on notifies.
    PERFORM setval({{.Regclass "wake_until"}}, (SELECT (extract(epoch FROM max(until)) * 1000)::bigint FROM (
        SELECT until FROM {{.Func "relay_waiting"}} WHERE until >= now() AND pid <> pg_backend_pid()
        UNION ALL SELECT now() + claim) AS c));
    DELETE FROM {{.Func "relay_waiting"}} WHERE until < now() AND pid <> pg_backend_pid();
    IF NOT fresh THEN
        -- A renewal of a live claim: the row in this transaction, no id of its own needed.
        INSERT INTO {{.Func "relay_waiting"}} (pid, until) VALUES (pg_backend_pid(), now() + claim)
            ON CONFLICT (pid) DO UPDATE SET until = excluded.until;
        SELECT coalesce(array_agg(x), '{}') INTO res
          FROM unnest(watch) AS x
         WHERE pg_xact_status(x::text::xid8) = 'in progress';
        RETURN res;
    END IF;
    -- A new claim: the session's row, written in a subtransaction (the block with a handler) so
    -- that it draws an id of its own now, after the claim: every writer whose insert read the
    -- sequence before held a lower id. The handler never runs; it only makes the block a
    -- subtransaction.
    BEGIN
        INSERT INTO {{.Func "relay_waiting"}} (pid, until) VALUES (pg_backend_pid(), now() + claim)
            ON CONFLICT (pid) DO UPDATE SET until = excluded.until
            RETURNING xmin::text::bigint INTO above;
    EXCEPTION WHEN raise_exception THEN
        RAISE;
    END;
    -- xmin is the 32-bit id: give it own's epoch, or the next one where the counter wrapped.
    above := (own >> 32 << 32) + above;
    IF above <= own THEN
        above := above + 4294967296;
    END IF;
    -- A new statement, so a new snapshot. In progress: its xip list, and every id from its xmax
    -- up to the one drawn after the claim (drawn, not ended when the snapshot was taken).
    SELECT pg_current_snapshot() INTO snap;
    SELECT coalesce(array_agg(x), '{}') INTO res FROM (
        SELECT x::text::bigint FROM pg_snapshot_xip(snap) AS x
        UNION
        SELECT generate_series(pg_snapshot_xmax(snap)::text::bigint, above - 1)
    ) AS w(x)
    WHERE x <> own AND x & 4294967295 >= 3; -- ids 0-2 of an epoch are never drawn
    RETURN res;
END
$fn$;
