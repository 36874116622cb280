-- Wake-ups by polling, without an insert trigger (docs/architecture.md, "Wake-ups").
--
-- Even when no relay waits, the insert trigger of migration 00005 costs every INSERT statement
-- the evaluation of its WHEN condition (PostgreSQL prepares a trigger's WHEN clause anew for
-- each statement): a few microseconds of the writer's transaction, and with 32 concurrent
-- durable writers about a tenth of their throughput (make bench, the write path). A table whose
-- relays do not listen for notifications (spec.publish.notify: false, relay --notify=false) and
-- poll instead needs no trigger: _set_notify(false) drops it, _set_notify(true) creates it again.
-- The operator calls it to match the OutboxRelay; either change takes the table's SHARE ROW
-- EXCLUSIVE lock for a moment (the caller bounds the wait with lock_timeout) and returns whether
-- it changed anything. The trigger is a statement trigger: it lives on the partitioned table alone.

-- Whether inserts into the table can notify a waiting relay (its insert trigger exists).
CREATE FUNCTION {{.Func "notifies"}}() RETURNS boolean
LANGUAGE sql STABLE AS $fn$
    SELECT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = {{.TableLit}}::regclass AND tgname = {{.NameLit}} || '_notify' AND tgparentid = 0)
$fn$;

CREATE FUNCTION {{.Func "set_notify"}}(enabled boolean) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    IF enabled = {{.Func "notifies"}}() THEN
        RETURN false;
    END IF;
    IF enabled THEN
        CREATE TRIGGER {{.NotifyTrigger}} AFTER INSERT ON {{.Table}} FOR EACH STATEMENT
            WHEN ({{.Func "wake_wanted"}}()) EXECUTE FUNCTION {{.NotifyFunc}}();
    ELSE
        DROP TRIGGER {{.NotifyTrigger}} ON {{.Table}};
    END IF;
    RETURN true;
END
$fn$;
