-- The SQL append: one statement that appends an event with the same guarantees as the Go
-- writer library's outbox.Append, for writers in any language (README, "Writing from any
-- language"):
--
--     SELECT <table>_append('order', 'order-42', 'OrderPlaced', '{"total": 42}'::jsonb);
--     SELECT <table>_append('order', 'order-42', 'OrderPlaced', '{"total": 42}'::jsonb,
--                           '{"traceparent": "00-..."}'::jsonb, '<event uuid>'::uuid);
--
-- It takes the aggregate's transaction-scoped advisory lock before the row's id is drawn: the
-- lock key is the Go library's (outbox/doc.go), so writers in Go and in SQL serialise on it
-- alike. Two transactions appending to one aggregate then commit their events in id order, which
-- is the order the relays publish them in; a plain INSERT gives no such order when two such
-- transactions overlap. The lock sits in an uncorrelated subquery of the WHERE clause: a one-time
-- filter, evaluated before the first row is produced, and so before the id default (nextval) in
-- the projection above it. A NULL aggregate id locks the table's prefix alone and then fails on
-- the column's NOT NULL, so bad input is an error, never a silent nothing; an empty text, or
-- headers that are not an object, fail on the table's CHECKs. It returns the event's id (made by
-- PostgreSQL unless given). SECURITY INVOKER: the writer needs INSERT on the table, as for a plain
-- INSERT, and EXECUTE on this function.
CREATE OR REPLACE FUNCTION {{.Func "append"}}(aggregate_type text, aggregate_id text, event_type text, payload jsonb,
    headers jsonb DEFAULT '{}'::jsonb, event_id uuid DEFAULT NULL) RETURNS uuid LANGUAGE sql VOLATILE AS $fn$
INSERT INTO {{.Table}} (event_id, aggregate_type, aggregate_id, event_type, payload, headers)
SELECT COALESCE($6, pg_catalog.gen_random_uuid()), $1, $2, $3, $4, COALESCE($5, '{}'::jsonb)
WHERE (SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended({{.LockPrefixLit}} OPERATOR(pg_catalog.||) COALESCE($2, ''), 0))) IS NOT NULL
RETURNING event_id
$fn$;

COMMENT ON FUNCTION {{.Func "append"}}(text, text, text, jsonb, jsonb, uuid) IS 'outbox-operator: append an event with the per-aggregate order guarantee of the writer libraries (takes the aggregate''s advisory lock before the id is drawn).';
