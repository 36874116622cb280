-- The bucket of an aggregate is computed where it is read, not stored on every insert.
-- PostgreSQL parses a stored generated column's expression anew for every INSERT statement, once
-- for the partitioned table and once for the partition (measured: about 15% of the server's CPU
-- for a one-event insert), which every application transaction paid. Queries now compute
-- (hashtextextended(aggregate_id, 0) & 255)::smallint (migrations.BucketExpr), the same value
-- the column held.
--
-- The column stays, as a plain column, so that every daily partition keeps the parent's physical
-- layout (a dropped column would make every new partition's rows go through a conversion on each
-- insert). Rows written before this migration keep their value; later rows leave it NULL.
ALTER TABLE {{.Table}} ALTER COLUMN shard_bucket DROP EXPRESSION;

COMMENT ON COLUMN {{.Table}}.shard_bucket IS 'Unused since schema version 6 (NULL for later rows): an aggregate''s bucket is (hashtextextended(aggregate_id, 0) & 255)::smallint.';
