-- Where bad events are refused: by the table's four CHECKs (migration 00001: aggregate_type,
-- aggregate_id and event_type not empty, headers a JSON object) at every insert, or by the relays
-- (spec.writers.checks: Relay; README, "What the application pays").
--
-- PostgreSQL reads each stored CHECK expression (stringToNode of its text), plans it and compiles
-- it again for every inserting statement: on PostgreSQL 15 at 32 durable writers, about 3% of the
-- application's transactions per second (docs/architecture.md, "The write path per mode"). Without
-- them the relays refuse the same events: such an event is poison (reason "invalid"; headers that
-- are not an object: "bad_headers"), parked or dead-lettered by the poison policy, never lost and
-- never published to its topic. outbox.Append validates in the application either way; plain
-- INSERTs and <table>_append are refused at insert only while the CHECKs exist.
--
-- _checks() reports whether all four exist on the table. _set_checks(false) drops those that
-- exist (on the table and, by recursion, its partitions: a catalog change under the table's
-- ACCESS EXCLUSIVE lock for a moment; the caller bounds the wait with lock_timeout);
-- _set_checks(true) adds back those missing, under the names PostgreSQL gave them, NOT VALID: no
-- scan of the rows written meanwhile (the relays checked those), enforced on every insert from the
-- moment they exist, and copied as valid into each new day's partition (LIKE ... INCLUDING
-- CONSTRAINTS). Either returns whether it changed anything. A CHECK is the table's by its expression
-- (a constraint renamed by hand still is; one of the application's own on the same column is not).
CREATE OR REPLACE FUNCTION {{.Func "check_names"}}(OUT col text, OUT name text, OUT present boolean, OUT expr text)
RETURNS SETOF record LANGUAGE sql STABLE AS $fn$
    SELECT w.col, COALESCE(c.conname, w.name), c.conname IS NOT NULL, w.expr
    FROM (VALUES ('aggregate_type', {{.ConstraintLit "aggregate_type_check"}}, 'aggregate_type <> ''''::text'),
                 ('aggregate_id', {{.ConstraintLit "aggregate_id_check"}}, 'aggregate_id <> ''''::text'),
                 ('event_type', {{.ConstraintLit "event_type_check"}}, 'event_type <> ''''::text'),
                 ('headers', {{.ConstraintLit "headers_check"}}, 'jsonb_typeof(headers) = ''object''::text')) AS w(col, name, expr)
    LEFT JOIN pg_catalog.pg_constraint c ON c.conrelid = {{.TableLit}}::regclass AND c.contype = 'c'
        AND pg_catalog.pg_get_expr(c.conbin, c.conrelid) = pg_catalog.concat('(', w.expr, ')')
$fn$;

CREATE OR REPLACE FUNCTION {{.Func "checks"}}() RETURNS boolean
LANGUAGE sql STABLE AS $fn$
    SELECT bool_and(present) FROM {{.Func "check_names"}}()
$fn$;

CREATE OR REPLACE FUNCTION {{.Func "set_checks"}}(enabled boolean) RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    clauses text;
BEGIN
    IF enabled THEN
        SELECT string_agg(format('ADD CONSTRAINT %I CHECK (%s) NOT VALID', name, expr), ', ')
        INTO clauses FROM {{.Func "check_names"}}() WHERE NOT present;
    ELSE
        SELECT string_agg(format('DROP CONSTRAINT %I', name), ', ')
        INTO clauses FROM {{.Func "check_names"}}() WHERE present;
    END IF;
    IF clauses IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('ALTER TABLE %s %s', {{.TableLit}}::regclass, clauses);
    RETURN true;
END
$fn$;
