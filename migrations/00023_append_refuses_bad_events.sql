-- The SQL appends refuse a bad event themselves, whether or not the table keeps its four CHECKs
-- (migration 00022): a new table is made without them (outboxdb.NewTableChecks; README, "What
-- appending costs your commits"), and a writer that calls <table>_append or
-- <table>_append_bytes must still get an error for an empty aggregate type, aggregate id or
-- event type, or headers that are not a JSON object, as outbox.Append gives in the application,
-- not an event the relays then park as poison. Only a plain INSERT is then left to the relays.
--
-- The check costs the valid call four comparisons in the statement's one-time filter; only a
-- call that fails them calls <table>_refuse_invalid, which raises the error PostgreSQL raises for
-- the table's CHECK (SQLSTATE 23514 check_violation, the same message and constraint name), so
-- that an application handles one error whether the CHECKs exist or not. A NULL is left to the
-- column's NOT NULL (refuse_invalid returns true), as before. The functions' signatures and
-- privileges do not change; the writers that execute them also execute refuse_invalid
-- (outboxdb.Grants).
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
    headers jsonb DEFAULT '{}'::jsonb, event_id uuid DEFAULT NULL) RETURNS uuid LANGUAGE sql VOLATILE AS $fn$
INSERT INTO {{.Table}} (event_id, aggregate_type, aggregate_id, event_type, payload, headers)
SELECT COALESCE($6, pg_catalog.gen_random_uuid()), $1, $2, $3, $4, COALESCE($5, '{}'::jsonb)
WHERE ($1 OPERATOR(pg_catalog.<>) '' AND $2 OPERATOR(pg_catalog.<>) '' AND $3 OPERATOR(pg_catalog.<>) ''
        AND pg_catalog.jsonb_typeof(COALESCE($5, '{}'::jsonb)) OPERATOR(pg_catalog.=) 'object'
        OR {{.Func "refuse_invalid"}}($1, $2, $3, COALESCE($5, '{}'::jsonb)))
    AND (SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended({{.LockPrefixLit}} OPERATOR(pg_catalog.||) COALESCE($2, ''), 0))) IS NOT NULL
RETURNING event_id
$fn$;

CREATE OR REPLACE FUNCTION {{.Func "append_bytes"}}(aggregate_type text, aggregate_id text, event_type text, payload bytea,
    headers jsonb DEFAULT '{}'::jsonb, event_id uuid DEFAULT NULL) RETURNS uuid LANGUAGE sql VOLATILE AS $fn$
INSERT INTO {{.Table}} (event_id, aggregate_type, aggregate_id, event_type, payload_bytes, headers)
SELECT COALESCE($6, pg_catalog.gen_random_uuid()), $1, $2, $3, $4, COALESCE($5, '{}'::jsonb)
WHERE ($1 OPERATOR(pg_catalog.<>) '' AND $2 OPERATOR(pg_catalog.<>) '' AND $3 OPERATOR(pg_catalog.<>) ''
        AND pg_catalog.jsonb_typeof(COALESCE($5, '{}'::jsonb)) OPERATOR(pg_catalog.=) 'object'
        OR {{.Func "refuse_invalid"}}($1, $2, $3, COALESCE($5, '{}'::jsonb)))
    AND (SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended({{.LockPrefixLit}} OPERATOR(pg_catalog.||) COALESCE($2, ''), 0))) IS NOT NULL
RETURNING event_id
$fn$;
