-- Wake-up claims that survive a failover (docs/architecture.md, "Wake-ups"; issue: after a
-- standby's promotion every relay stopped publishing for good).
--
-- Migration 00005 kept the claims in an UNLOGGED sequence and an UNLOGGED table. An unlogged
-- relation is not replicated: a promoted standby resets it from its init fork, and for the
-- sequence that reset left a page PostgreSQL cannot read (15.18: "bad magic number in sequence
-- ...wake_until": 00000000), so every statement that read it failed on the new primary: every
-- relay's round trip, and, while the insert trigger exists, every INSERT into the outbox. Nothing
-- on the relays' or the writers' path may depend on state that a promotion or a crash recovery
-- resets, so both are logged now. What a failover leaves in them is harmless: a claim written on
-- the old primary makes inserts notify until it expires (a few seconds), and the relays claim
-- again on their new connections.
--
-- A logged sequence costs a WAL record per claim (the relays' sessions commit without waiting
-- for the flush) and, unlike the unlogged one, setval draws the claiming transaction's id
-- before the claim takes effect. _relay_wait below therefore draws, after the claim, a second
-- id (a subtransaction's) that is above the id of every writer whose insert read the sequence
-- before the claim, and watches every transaction in progress below it.

-- Make the sequence logged in place (the same relation, so a writer's statement that waits for
-- it meanwhile goes on). A sequence that can no longer be read (this database was promoted
-- from a standby before this migration ran) is replaced: its value is gone either way.
DO $mig$
BEGIN
    IF (SELECT relpersistence FROM pg_class WHERE oid = {{.Regclass "wake_until"}}::regclass) = 'u' THEN
        BEGIN
            ALTER SEQUENCE {{.Func "wake_until"}} SET LOGGED;
        EXCEPTION WHEN data_corrupted OR internal_error THEN
            DROP SEQUENCE {{.Func "wake_until"}};
            CREATE SEQUENCE {{.Func "wake_until"}} AS bigint MINVALUE 0 START 0;
            GRANT SELECT ON SEQUENCE {{.Func "wake_until"}} TO PUBLIC;
        END;
    END IF;
    IF (SELECT relpersistence FROM pg_class WHERE oid = {{.Regclass "relay_waiting"}}::regclass) = 'u' THEN
        ALTER TABLE {{.Func "relay_waiting"}} SET LOGGED;
    END IF;
END
$mig$;

-- Claims, or renews, the calling session's wait until now() + claim, and returns the transactions
-- (xid8 values, as bigint) that must end before the relay may rely on notifications alone. For a
-- new claim (watch is NULL, or the session held no live claim) that is every transaction that had
-- an id when the claim took effect and had not ended; for a renewal, those of watch still in
-- progress.
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
    -- The session's row, written in a subtransaction (the block with a handler) so that it draws
    -- an id of its own now, after the claim: every writer whose insert read the sequence before
    -- held a lower id. The handler never runs; it only makes the block a subtransaction.
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
    IF fresh THEN
        -- A new statement, so a new snapshot. In progress: its xip list, and every id from its
        -- xmax up to the one drawn after the claim (drawn, not ended when the snapshot was taken).
        SELECT pg_current_snapshot() INTO snap;
        SELECT coalesce(array_agg(x), '{}') INTO res FROM (
            SELECT x::text::bigint FROM pg_snapshot_xip(snap) AS x
            UNION
            SELECT generate_series(pg_snapshot_xmax(snap)::text::bigint, above - 1)
        ) AS w(x)
        WHERE x <> own AND x & 4294967295 >= 3; -- ids 0-2 of an epoch are never drawn
    ELSE
        SELECT coalesce(array_agg(x), '{}') INTO res
          FROM unnest(watch) AS x
         WHERE pg_xact_status(x::text::xid8) = 'in progress';
    END IF;
    RETURN res;
END
$fn$;
