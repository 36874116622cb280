-- A transaction that will be prepared (two-phase commit) may not notify: PostgreSQL refuses
-- PREPARE TRANSACTION in a transaction that executed NOTIFY, and the insert trigger notifies
-- while a relay waits for a notification (migration 00005). So a writer that prepares its
-- transactions would fail exactly when the relays are idle. Such a transaction opts out of
-- wake-ups before it appends:
--
--     SET LOCAL outbox.notify = off;      -- or outbox.NoWakeUp(ctx, tx) in Go
--
-- Its events are published as usual; an idle relay finds them at its next poll, at most the poll
-- interval later (5 s by default with notify; measured: one poll interval), or sooner when other
-- events wake it.
-- The setting is read only when a relay waits (the sequence's test comes first), so a statement
-- under load pays nothing for it.
CREATE OR REPLACE FUNCTION {{.Func "wake_wanted"}}() RETURNS boolean LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    RETURN pg_catalog.pg_sequence_last_value({{.Regclass "wake_until"}}) > pg_catalog.date_part('epoch', pg_catalog.now()) * 1000
       AND pg_catalog.current_setting('outbox.notify', true) IS DISTINCT FROM 'off';
END
$fn$;
