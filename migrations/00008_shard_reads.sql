-- Snapshot tracking reads a shard's own events only (docs/architecture.md, "Tracking progress").
--
-- A batch's events are found by id windows instead of by walking every transaction of the batch:
-- each snapshot a relay takes carries two values of the id sequence, its floor and its ceiling.
--   - ceiling: read after the snapshot was taken. Every event the snapshot shows committed has an
--     id at or below it (an id is drawn before its transaction commits).
--   - floor: read before the relay's transaction had a transaction id, which it then takes; the
--     snapshot is widened to list every transaction from its xmax up to that id as in progress.
--     Every event of a transaction at or above the widened xmax has an id above the floor (the
--     id default draws the id after the transaction has its id: migration 00007).
-- The events of the transactions that began after a snapshot therefore lie between its floor and
-- the next snapshot's ceiling; those of the transactions in progress at it are still read by
-- transaction id. NULL: not known (cursor rows written before this migration, a reset, a merge);
-- the relay then finds the bounds as before, by the transaction-id index.
ALTER TABLE {{.Func "relay_cursor"}}
    ADD COLUMN snap_floor bigint,
    ADD COLUMN next_floor bigint,
    ADD COLUMN next_ceil  bigint;

-- A shard reads its buckets' events, each bucket by id, and no other shard's: its cost does not
-- grow with the number of shards or with another shard's backlog. Rows marked sent (row
-- tracking) leave the index.
CREATE INDEX {{.Index "bucket_idx"}} ON {{.Table}} (({{.BucketExpr}}), id) WHERE sent_at IS NULL;
