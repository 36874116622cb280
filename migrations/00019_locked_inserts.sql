-- Plain INSERTs in per-aggregate commit order, opt-in (README, "Writing from any language").
--
-- The writer libraries and <table>_append take the aggregate's advisory lock before the row's
-- id is drawn, so that two transactions appending to one aggregate get ids in commit order. A
-- plain INSERT takes no lock. _set_locked_inserts(true) gives the table a BEFORE INSERT row
-- trigger that takes the same lock (the Go library's key) and then draws the row's id again:
-- the id the column's default drew before the trigger ran is discarded (a gap in the sequence),
-- and the one that counts is drawn after the lock, as the libraries draw theirs. The
-- transaction already has its transaction id (the id default takes it first: migration 00007),
-- so the new id is drawn after it too. Rows appended through a library or _append pass through
-- the trigger as well: their lock is taken again (re-entrant, no wait) and their id drawn again,
-- after it. It costs every insert the trigger; _set_locked_inserts(false) drops it. Either
-- change takes the table's SHARE ROW EXCLUSIVE lock for a moment (the caller bounds the wait
-- with lock_timeout) and returns whether it changed anything.
CREATE OR REPLACE FUNCTION {{.Func "lock_insert"}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended({{.LockPrefixLit}} OPERATOR(pg_catalog.||) COALESCE(NEW.aggregate_id, ''), 0));
    NEW.id := pg_catalog.nextval({{.SeqRegclass}}::regclass);
    RETURN NEW;
END
$fn$;

-- Whether plain inserts into the table take the aggregate's lock (its lock trigger exists).
CREATE OR REPLACE FUNCTION {{.Func "locked_inserts"}}() RETURNS boolean
LANGUAGE sql STABLE AS $fn$
    SELECT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = {{.TableLit}}::regclass AND tgname = {{.NameLit}} || '_lock_insert' AND tgparentid = 0)
$fn$;

CREATE OR REPLACE FUNCTION {{.Func "set_locked_inserts"}}(enabled boolean) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    IF enabled = {{.Func "locked_inserts"}}() THEN
        RETURN false;
    END IF;
    IF enabled THEN
        CREATE TRIGGER {{.Index "lock_insert"}} BEFORE INSERT ON {{.Table}} FOR EACH ROW EXECUTE FUNCTION {{.Func "lock_insert"}}();
    ELSE
        DROP TRIGGER {{.Index "lock_insert"}} ON {{.Table}};
    END IF;
    RETURN true;
END
$fn$;
