-- The shard layout: how many shards the table's relays run, and the change of layout in
-- progress. One row, written only by the functions below (docs/architecture.md, "Resharding").
--
-- A relay publishes bucket b only while it holds pg_advisory_lock(<lock key>, b) AND the row
-- says its shard count: it takes its bucket locks first and reads the row after. A switch takes
-- every bucket lock itself, in the transaction that changes the row, so it succeeds only when no
-- relay of any layout holds a bucket, and a relay that locks after it reads the new row.
CREATE TABLE {{.Func "relay_layout"}} (
    singleton             boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    shard_count           integer     NOT NULL CHECK (shard_count BETWEEN 1 AND 256),
    generation            bigint      NOT NULL,
    -- The change in progress: the relays of shard_count stop publishing and release their buckets.
    requested_shard_count integer     CHECK (requested_shard_count BETWEEN 1 AND 256),
    -- The last change, for its report: when it was requested, when the first relay of the old
    -- layout stopped publishing, when the row switched and when every bucket was locked again.
    previous_shard_count  integer,
    requested_at          timestamptz,
    released_at           timestamptz,
    switched_at           timestamptz NOT NULL DEFAULT now(),
    resumed_at            timestamptz,
    -- Whether the operator reported the last change (once, whatever its cache says).
    reported              boolean     NOT NULL DEFAULT false
);

COMMENT ON TABLE {{.Func "relay_layout"}} IS 'outbox-operator: the shard layout of the outbox relays; change it with the _request_layout and _switch_layout functions only.';

-- Asks the relays of the current layout to stop publishing and release their buckets, so that a
-- layout of n shards can take over (with _switch_layout). Asking for the current layout cancels
-- a request. Without a layout yet there is nothing to stop: use _switch_layout.
CREATE FUNCTION {{.Func "request_layout"}}(n integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock({{.LockKey}}, -2);
    UPDATE {{.Func "relay_layout"}}
       SET requested_shard_count = CASE WHEN shard_count = n THEN NULL ELSE n END,
           requested_at = CASE WHEN shard_count <> n AND requested_shard_count IS DISTINCT FROM n THEN now() ELSE requested_at END,
           released_at  = CASE WHEN shard_count <> n AND requested_shard_count IS DISTINCT FROM n THEN NULL ELSE released_at END
     WHERE requested_shard_count IS DISTINCT FROM (CASE WHEN shard_count = n THEN NULL ELSE n END);
    IF FOUND THEN
        PERFORM pg_notify({{.ChannelLit}}, {{.LayoutNotificationLit}});
    END IF;
END
$fn$;

-- Makes n the layout, if no session holds a bucket lock of the table (no relay of any layout is
-- publishing): returns whether n is now the layout. Call it outside an explicit transaction: the
-- bucket locks it takes are held until the calling transaction ends.
CREATE FUNCTION {{.Func "switch_layout"}}(n integer) RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    cur   {{.Func "relay_layout"}};
    found_row boolean;
    b     integer;
BEGIN
    IF n IS NULL OR n < 1 OR n > 256 THEN
        RAISE EXCEPTION 'shard count % out of range: want 1 to 256', n;
    END IF;
    PERFORM pg_advisory_xact_lock({{.LockKey}}, -2);
    SELECT * INTO cur FROM {{.Func "relay_layout"}};
    found_row := FOUND;
    IF found_row AND cur.shard_count = n THEN
        IF cur.requested_shard_count IS NOT NULL THEN
            UPDATE {{.Func "relay_layout"}} SET requested_shard_count = NULL;
            PERFORM pg_notify({{.ChannelLit}}, {{.LayoutNotificationLit}});
        END IF;
        RETURN true;
    END IF;
    FOR b IN 0..255 LOOP
        IF NOT pg_try_advisory_xact_lock({{.LockKey}}, b) THEN
            RETURN false;
        END IF;
    END LOOP;
    IF found_row THEN
        -- Without a request for n (relays switching by themselves while none runs), the pause
        -- is this instant.
        UPDATE {{.Func "relay_layout"}}
           SET previous_shard_count = shard_count,
               shard_count = n,
               generation = generation + 1,
               requested_shard_count = NULL,
               requested_at = CASE WHEN requested_shard_count = n THEN requested_at ELSE now() END,
               released_at = CASE WHEN requested_shard_count = n THEN coalesce(released_at, now()) ELSE now() END,
               switched_at = now(),
               resumed_at = NULL,
               reported = false;
    ELSE
        INSERT INTO {{.Func "relay_layout"}} (shard_count, generation, requested_at, released_at, switched_at)
        VALUES (n, 1, now(), now(), now());
    END IF;
    PERFORM pg_notify({{.ChannelLit}}, {{.LayoutNotificationLit}});
    RETURN true;
END
$fn$;

-- A relay of the current layout stopped publishing because a change was requested: the first
-- one marks when the publishing pause began.
CREATE FUNCTION {{.Func "layout_released"}}(gen bigint) RETURNS void
LANGUAGE sql AS $fn$
    UPDATE {{.Func "relay_layout"}} SET released_at = now()
     WHERE generation = gen AND requested_shard_count IS NOT NULL AND released_at IS NULL;
$fn$;

-- A relay of layout gen holds its buckets: when every bucket is held, the pause is over.
CREATE FUNCTION {{.Func "layout_locked"}}(gen bigint) RETURNS void
LANGUAGE sql AS $fn$
    UPDATE {{.Func "relay_layout"}} SET resumed_at = now()
     WHERE generation = gen AND resumed_at IS NULL
       AND (SELECT count(DISTINCT objid) FROM pg_locks
             WHERE locktype = 'advisory' AND granted AND objsubid = 2
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND classid = ({{.LockKey}})::int4::oid AND objid < 256) = 256;
$fn$;

-- Claims the report of change gen once it is over: true for exactly one caller.
CREATE FUNCTION {{.Func "layout_report"}}(gen bigint) RETURNS boolean
LANGUAGE sql AS $fn$
    WITH claimed AS (
        UPDATE {{.Func "relay_layout"}} SET reported = true
         WHERE generation = gen AND resumed_at IS NOT NULL AND NOT reported
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM claimed);
$fn$;
