-- The Spark outbox source's bookkeeping for SQLite (see postgres.sql for the design). The key
-- hash is sluice_bucket(), a CRC-32 registered on the connection (the same hash as MySQL's crc32).

-- name: create_claims
CREATE TABLE IF NOT EXISTS {claims} (
  row_id  INTEGER PRIMARY KEY,
  batch   INTEGER NOT NULL,
  bucket  INTEGER NOT NULL
)

-- name: create_claims_index
CREATE INDEX IF NOT EXISTS {raw_claims_index} ON {claims} (batch, bucket)

-- name: create_cursor
CREATE TABLE IF NOT EXISTS {cursor} (
  id     INTEGER PRIMARY KEY,
  batch  INTEGER NOT NULL
)

-- name: ensure_cursor
INSERT OR IGNORE INTO {cursor} (id, batch) VALUES (1, 0)

-- name: read_cursor
SELECT batch FROM {cursor} WHERE id = 1

-- name: next_claimed
SELECT min(batch) FROM {claims} WHERE batch > :start

-- name: max_claimed
SELECT max(batch) FROM {claims}

-- name: max_id
SELECT max(id) FROM {outbox}

-- name: claim
-- One statement under SQLite's single write lock; the lease check fences a deposed leader.
INSERT INTO {claims} (row_id, batch, bucket)
SELECT o.id, :batch, sluice_bucket(o.kafka_key, :buckets)
FROM {outbox} o
WHERE o.id <= :max_id
  AND NOT EXISTS (SELECT 1 FROM {claims} c WHERE c.row_id = o.id)
  AND EXISTS (SELECT 1 FROM {leases} l WHERE l.name = :lease AND l.holder = :holder AND l.epoch = :epoch)
ORDER BY o.id
LIMIT :limit

-- name: claim_select
SELECT 1 WHERE 0

-- name: batch_rows
SELECT {raw_columns} FROM {outbox} o JOIN {claims} c ON c.row_id = o.id
WHERE c.batch > :lo AND c.batch <= :hi AND c.bucket = :bucket
ORDER BY o.id

-- name: purge
DELETE FROM {outbox} WHERE id IN (SELECT row_id FROM {claims} WHERE batch <= :end)

-- name: drop_claims
DELETE FROM {claims} WHERE batch <= :end

-- name: advance_cursor
UPDATE {cursor} SET batch = :end WHERE id = 1 AND batch < :end

-- name: backlog
SELECT count(*), count(c.row_id) FROM {outbox} o LEFT JOIN {claims} c ON c.row_id = o.id

-- name: peek
SELECT {raw_columns} FROM {outbox} o WHERE o.id >= :lo AND o.id < :hi ORDER BY o.id LIMIT :limit
