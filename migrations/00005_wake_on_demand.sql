-- Wake-ups on demand: a transaction that appends an event notifies only while a relay waits for
-- one (docs/architecture.md, "Wake-ups"). PostgreSQL serialises the commits of every transaction
-- that queued a notification behind one global lock held through the commit record's flush, so
-- notifying on every append turns the application's group commit into a queue. Under load the
-- relays do not wait (each fetch finds work) and no transaction notifies at all.
--
-- The protocol, in three parts:
--   - A relay about to wait claims it (_relay_wait): its claim expires at now() + a duration
--     longer than its poll interval, so a relay that dies leaves no claim behind for long.
--   - The insert trigger's WHEN condition reads the latest claim's expiry from an unlogged sequence,
--     which every snapshot sees at its current value (REPEATABLE READ writers too), and the
--     trigger notifies while it lies ahead.
--   - A writer whose trigger read "nobody waits" just before the claim had inserted already, so it
--     held a transaction id then: _relay_wait returns the transactions in progress when the claim
--     took effect, and the relay fetches again, without waiting for a notification alone, until
--     each of them has ended.

-- The latest expiry of any relay's claim, in milliseconds since the Unix epoch; 0 when none.
-- Logged, like the table below: databases migrated before migration 00015 had both unlogged,
-- and 00015 makes them logged (an unlogged sequence does not survive a standby's promotion, and
-- PostgreSQL 13 and 14 have none), so this file creates what 00015 leaves.
CREATE SEQUENCE {{.Func "wake_until"}} AS bigint MINVALUE 0 START 0;

-- One row per waiting relay, keyed by its lock connection's backend pid; written by the functions
-- below only, under an advisory lock, so the sequence always holds the latest expiry.
CREATE TABLE {{.Func "relay_waiting"}} (
    pid   integer     PRIMARY KEY,
    until timestamptz NOT NULL
);

COMMENT ON TABLE {{.Func "relay_waiting"}} IS 'outbox-operator: relays waiting for a notification; written by the _relay_wait and _relay_woke functions only.';

-- Claims, or renews, the calling session's wait until now() + claim, and returns the transactions
-- (xid8 values, as bigint) that must end before the relay may rely on notifications alone. For a
-- new claim (watch is NULL, or the session held no live claim) that is every transaction that had
-- an id when the claim took effect and had not ended; for a renewal, those of watch still in
-- progress.
CREATE FUNCTION {{.Func "relay_wait"}}(claim interval, watch bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $fn$
DECLARE
    prev  timestamptz;
    fresh boolean;
    own   xid8;
    snap  pg_snapshot;
    res   bigint[];
BEGIN
    PERFORM pg_advisory_xact_lock({{.LockKey}}, -3);
    SELECT until INTO prev FROM {{.Func "relay_waiting"}} WHERE pid = pg_backend_pid();
    fresh := watch IS NULL OR prev IS NULL OR prev < now();
    -- The claim takes effect here. setval on an unlogged sequence assigns no transaction id, so
    -- this transaction's id, drawn just after, is above every id drawn before the claim.
    PERFORM setval({{.Regclass "wake_until"}}, (SELECT (extract(epoch FROM max(until)) * 1000)::bigint FROM (
        SELECT until FROM {{.Func "relay_waiting"}} WHERE until >= now() AND pid <> pg_backend_pid()
        UNION ALL SELECT now() + claim) AS c));
    own := pg_current_xact_id();
    IF fresh THEN
        -- A new statement, so a new snapshot. In progress: its xip list, and every id from its
        -- xmax up to this transaction's own (drawn, not ended when the snapshot was taken).
        SELECT pg_current_snapshot() INTO snap;
        SELECT coalesce(array_agg(x), '{}') INTO res FROM (
            SELECT x::text::bigint FROM pg_snapshot_xip(snap) AS x WHERE x <> own
            UNION
            SELECT generate_series(pg_snapshot_xmax(snap)::text::bigint, own::text::bigint - 1)
        ) AS w(x);
    ELSE
        SELECT coalesce(array_agg(x), '{}') INTO res
          FROM unnest(watch) AS x
         WHERE pg_xact_status(x::text::xid8) = 'in progress';
    END IF;
    DELETE FROM {{.Func "relay_waiting"}} WHERE until < now() AND pid <> pg_backend_pid();
    INSERT INTO {{.Func "relay_waiting"}} (pid, until) VALUES (pg_backend_pid(), now() + claim)
        ON CONFLICT (pid) DO UPDATE SET until = excluded.until;
    RETURN res;
END
$fn$;

-- Ends the calling session's claim: writers stop notifying unless another relay waits.
CREATE FUNCTION {{.Func "relay_woke"}}() RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock({{.LockKey}}, -3);
    DELETE FROM {{.Func "relay_waiting"}} WHERE pid = pg_backend_pid() OR until < now();
    PERFORM setval({{.Regclass "wake_until"}}, coalesce((SELECT (extract(epoch FROM max(until)) * 1000)::bigint FROM {{.Func "relay_waiting"}}), 0));
END
$fn$;

-- Whether a relay waits: the trigger's WHEN condition. A function of its own rather than the
-- expression inline, because PostgreSQL parses a trigger's WHEN clause anew for every statement
-- and a call without arguments is the shortest thing to parse; plpgsql, so that it is called,
-- not inlined, and evaluates its one expression without starting an executor. The sequence holds
-- no secret: anyone may read it.
GRANT SELECT ON SEQUENCE {{.Func "wake_until"}} TO PUBLIC;

CREATE FUNCTION {{.Func "wake_wanted"}}() RETURNS boolean LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    RETURN pg_catalog.pg_sequence_last_value({{.Regclass "wake_until"}}) > pg_catalog.date_part('epoch', pg_catalog.now()) * 1000;
END
$fn$;

-- The insert trigger: one notification per statement, and only while a relay waits; a
-- statement that finds no claim costs one call of the function above.
DROP TRIGGER {{.NotifyTrigger}} ON {{.Table}};

CREATE TRIGGER {{.NotifyTrigger}} AFTER INSERT ON {{.Table}} FOR EACH STATEMENT
    WHEN ({{.Func "wake_wanted"}}())
    EXECUTE FUNCTION {{.NotifyFunc}}();

-- Relays that predate this migration never claim: until the first relay that does, notify on
-- every insert as before (far in the future; the first _relay_woke sets the real value).
SELECT setval({{.Regclass "wake_until"}}, 9000000000000000);
