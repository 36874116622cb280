-- The SQL appends refuse a bad event themselves, whether or not the table keeps its four CHECKs
-- (migration 00022): a new table is made without them (outboxdb.NewTableChecks; README, "What
-- appending costs your commits"), and a writer that calls <table>_append or
-- <table>_append_bytes must still get an error for an empty aggregate type, aggregate id or
-- event type, or headers that are not a JSON object, as outbox.Append gives in the application,
-- not an event the relays then park as poison. Only a plain INSERT is then left to the relays.
--
-- The two appends become PL/pgSQL, with the same signatures, privileges and order (the
-- aggregate's lock, then the insert that draws the id): a session plans their statements once and
-- keeps the plans, where an SQL function's body was parsed and planned at every call. Written as
-- SQL, the check (four comparisons and the call below in the statement's filter) made each call
-- dearer to plan: outbox_append alone, 32 durable writers on PostgreSQL 15, pgbench, interleaved
-- 12-s rounds, 2026-12-06: 0.80-0.88x the SQL append without the check; as PL/pgSQL with it,
-- 1.24-1.44x (three rounds each). Only a call that fails the check calls
-- <table>_refuse_invalid, which raises the error PostgreSQL raises for the table's CHECK
-- (SQLSTATE 23514 check_violation, the same message and constraint name), so that an application
-- handles one error whether the CHECKs exist or not. A NULL is left to the column's NOT NULL, as
-- before. The writers that execute the appends also execute refuse_invalid (outboxdb.Grants).
CREATE OR REPLACE FUNCTION {{.Func "refuse_invalid"}}(aggregate_type text, aggregate_id text, event_type text, headers jsonb)
RETURNS boolean LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    bad text;
    con text;
BEGIN
    SELECT w.col, w.con INTO bad, con
    FROM (VALUES (1, 'aggregate_type', {{.ConstraintLit "aggregate_type_check"}}, aggregate_type = ''),
                 (2, 'aggregate_id', {{.ConstraintLit "aggregate_id_check"}}, aggregate_id = ''),
                 (3, 'event_type', {{.ConstraintLit "event_type_check"}}, event_type = ''),
                 (4, 'headers', {{.ConstraintLit "headers_check"}}, pg_catalog.jsonb_typeof(headers) <> 'object')) AS w(n, col, con, failed)
    WHERE w.failed ORDER BY w.n LIMIT 1;
    IF bad IS NULL THEN
        RETURN true;
    END IF;
    RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', {{.NameLit}}, con
        USING ERRCODE = 'check_violation', SCHEMA = {{.SchemaLit}}, TABLE = {{.NameLit}}, COLUMN = bad, CONSTRAINT = con,
            DETAIL = pg_catalog.format('%s is %s: the SQL append refuses it whether or not the table keeps its CHECKs', bad,
                CASE bad WHEN 'headers' THEN 'not a JSON object' ELSE 'empty' END);
END
$fn$;

COMMENT ON FUNCTION {{.Func "refuse_invalid"}}(text, text, text, jsonb) IS 'outbox-operator: raises the table''s CHECK violation for an SQL append of a bad event (called by <table>_append and <table>_append_bytes only when their check fails).';

CREATE OR REPLACE FUNCTION {{.Func "append"}}(aggregate_type text, aggregate_id text, event_type text, payload jsonb,
    headers jsonb DEFAULT '{}'::jsonb, event_id uuid DEFAULT NULL) RETURNS uuid LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    appended uuid;
BEGIN
    IF NOT ($1 OPERATOR(pg_catalog.<>) '' AND $2 OPERATOR(pg_catalog.<>) '' AND $3 OPERATOR(pg_catalog.<>) ''
            AND pg_catalog.jsonb_typeof(COALESCE($5, '{}'::jsonb)) OPERATOR(pg_catalog.=) 'object') THEN
        PERFORM {{.Func "refuse_invalid"}}($1, $2, $3, COALESCE($5, '{}'::jsonb));
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended({{.LockPrefixLit}} OPERATOR(pg_catalog.||) COALESCE($2, ''), 0));
    INSERT INTO {{.Table}} (event_id, aggregate_type, aggregate_id, event_type, payload, headers)
    VALUES (COALESCE($6, pg_catalog.gen_random_uuid()), $1, $2, $3, $4, COALESCE($5, '{}'::jsonb))
    RETURNING event_id INTO appended;
    RETURN appended;
END
$fn$;

CREATE OR REPLACE FUNCTION {{.Func "append_bytes"}}(aggregate_type text, aggregate_id text, event_type text, payload bytea,
    headers jsonb DEFAULT '{}'::jsonb, event_id uuid DEFAULT NULL) RETURNS uuid LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    appended uuid;
BEGIN
    IF NOT ($1 OPERATOR(pg_catalog.<>) '' AND $2 OPERATOR(pg_catalog.<>) '' AND $3 OPERATOR(pg_catalog.<>) ''
            AND pg_catalog.jsonb_typeof(COALESCE($5, '{}'::jsonb)) OPERATOR(pg_catalog.=) 'object') THEN
        PERFORM {{.Func "refuse_invalid"}}($1, $2, $3, COALESCE($5, '{}'::jsonb));
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended({{.LockPrefixLit}} OPERATOR(pg_catalog.||) COALESCE($2, ''), 0));
    INSERT INTO {{.Table}} (event_id, aggregate_type, aggregate_id, event_type, payload_bytes, headers)
    VALUES (COALESCE($6, pg_catalog.gen_random_uuid()), $1, $2, $3, $4, COALESCE($5, '{}'::jsonb))
    RETURNING event_id INTO appended;
    RETURN appended;
END
$fn$;
