-- The Spark outbox source's bookkeeping for PostgreSQL. Claims record which outbox rows each
-- micro-batch owns, so a batch reads the same rows however often Spark replays it (even after a
-- driver restart), until Spark commits it and its rows are purged. {outbox}, {claims},
-- {cursor} and {leases} are validated, quoted identifiers; values are bound parameters.

-- name: create_claims
-- One row per claimed outbox row. row_id is the key: a row can belong to one batch only, which
-- also fences two queries that both believe they lead (the second insert fails).
CREATE TABLE IF NOT EXISTS {claims} (
  row_id  BIGINT PRIMARY KEY,
  batch   BIGINT NOT NULL,
  bucket  INTEGER NOT NULL
)

-- name: create_claims_index
CREATE INDEX IF NOT EXISTS {raw_claims_index} ON {claims} (batch, bucket)

-- name: create_cursor
-- The last batch committed (purged): a new checkpoint starts after it and replays any claims
-- left by an earlier run.
CREATE TABLE IF NOT EXISTS {cursor} (
  id     INTEGER PRIMARY KEY,
  batch  BIGINT NOT NULL
)

-- name: ensure_cursor
INSERT INTO {cursor} (id, batch) VALUES (1, 0) ON CONFLICT (id) DO NOTHING

-- name: read_cursor
SELECT batch FROM {cursor} WHERE id = 1

-- name: next_claimed
-- The oldest batch already claimed after `start`: a replay (claimed before a crash, maybe
-- never planned by Spark) is served again before anything new is claimed.
SELECT min(batch) FROM {claims} WHERE batch > %(start)s

-- name: max_claimed
SELECT max(batch) FROM {claims}

-- name: max_id
SELECT max(id) FROM {outbox}

-- name: claim
-- Claim the oldest unclaimed rows (up to the Trigger.AvailableNow ceiling) for a new batch, in
-- one statement, and only while our lease epoch is current (a deposed leader claims nothing).
-- A plain read: rows of transactions still in flight are invisible, never waited for. The
-- bucket (a hash of the key) keeps every key in one task, so per-key order holds in a batch.
INSERT INTO {claims} (row_id, batch, bucket)
SELECT o.id, %(batch)s, mod(hashtext(o.kafka_key)::bigint + 2147483648, %(buckets)s)
FROM {outbox} o
WHERE o.id <= %(max_id)s
  AND NOT EXISTS (SELECT 1 FROM {claims} c WHERE c.row_id = o.id)
  AND EXISTS (SELECT 1 FROM {leases} l WHERE l.name = %(lease)s AND l.holder = %(holder)s AND l.epoch = %(epoch)s)
ORDER BY o.id
LIMIT %(limit)s

-- name: claim_select
-- Unused on PostgreSQL (claim is one statement); kept so every dialect defines the same names.
SELECT 1 WHERE false

-- name: batch_rows
-- One task's rows of a batch range, in id order (per-key order).
SELECT {raw_columns} FROM {outbox} o JOIN {claims} c ON c.row_id = o.id
WHERE c.batch > %(lo)s AND c.batch <= %(hi)s AND c.bucket = %(bucket)s
ORDER BY o.id

-- name: purge
-- Spark committed every batch up to `end`: their rows are delivered. Same transaction as
-- drop_claims and advance_cursor, so rows and claims disappear together.
DELETE FROM {outbox} WHERE id IN (SELECT row_id FROM {claims} WHERE batch <= %(end)s)

-- name: drop_claims
DELETE FROM {claims} WHERE batch <= %(end)s

-- name: advance_cursor
UPDATE {cursor} SET batch = %(end)s WHERE id = 1 AND batch < %(end)s

-- name: backlog
-- Rows waiting (claimed or not), for `sluice pipeline status`.
SELECT count(*), count(c.row_id) FROM {outbox} o LEFT JOIN {claims} c ON c.row_id = o.id

-- name: peek
SELECT {raw_columns} FROM {outbox} o WHERE o.id >= %(lo)s AND o.id < %(hi)s ORDER BY o.id LIMIT %(limit)s
