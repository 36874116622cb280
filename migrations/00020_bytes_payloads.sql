-- Bytes payloads and tombstones (README, "Payloads: JSON, bytes, tombstones"). An event's value is
-- its payload_bytes where set (Avro, Protobuf or any encoding the application made), else its
-- payload (JSON); with neither (both NULL) it has no value: a tombstone for a compacted topic,
-- published as one only where the OutboxRelay says so (spec.publish.nullPayload: Tombstone),
-- poison otherwise. Adding a nullable column without a default and dropping a NOT NULL change
-- the catalog only: no table is rewritten or scanned. Each takes the table's ACCESS EXCLUSIVE
-- lock for that moment; lock_timeout bounds the wait behind open transactions (and so how long
-- the writers queued behind this migration wait), and a migration that timed out is retried
-- whole by the operator's next pass. Every statement may run again (IF NOT EXISTS, OR REPLACE).
SET LOCAL lock_timeout = '2s';

ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS payload_bytes bytea, ALTER COLUMN payload DROP NOT NULL;

ALTER TABLE {{.Func "parked"}} ADD COLUMN IF NOT EXISTS payload_bytes bytea, ALTER COLUMN payload DROP NOT NULL;

-- The SQL append of a bytes payload (NULL: a tombstone), with the same lock as <table>_append.
CREATE OR REPLACE FUNCTION {{.Func "append_bytes"}}(aggregate_type text, aggregate_id text, event_type text, payload bytea,
    headers jsonb DEFAULT '{}'::jsonb, event_id uuid DEFAULT NULL) RETURNS uuid LANGUAGE sql VOLATILE AS $fn$
INSERT INTO {{.Table}} (event_id, aggregate_type, aggregate_id, event_type, payload_bytes, headers)
SELECT COALESCE($6, pg_catalog.gen_random_uuid()), $1, $2, $3, $4, COALESCE($5, '{}'::jsonb)
WHERE (SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended({{.LockPrefixLit}} OPERATOR(pg_catalog.||) COALESCE($2, ''), 0))) IS NOT NULL
RETURNING event_id
$fn$;

COMMENT ON FUNCTION {{.Func "append_bytes"}}(text, text, text, bytea, jsonb, uuid) IS 'outbox-operator: append an event whose payload is bytes (NULL: a tombstone), with the per-aggregate order guarantee of the writer libraries.';
