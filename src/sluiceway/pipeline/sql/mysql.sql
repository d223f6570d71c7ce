-- The Spark outbox source's bookkeeping for MySQL/MariaDB (see postgres.sql for the design).

-- name: create_claims
CREATE TABLE IF NOT EXISTS {claims} (
  row_id  BIGINT NOT NULL PRIMARY KEY,
  batch   BIGINT NOT NULL,
  bucket  INT NOT NULL,
  KEY {raw_claims_index} (batch, bucket)
) ENGINE = InnoDB

-- name: create_claims_index
-- The index is part of create_claims on MySQL (no CREATE INDEX IF NOT EXISTS everywhere).
SELECT 1

-- name: create_cursor
CREATE TABLE IF NOT EXISTS {cursor} (
  id     INT NOT NULL PRIMARY KEY,
  batch  BIGINT NOT NULL
) ENGINE = InnoDB

-- name: ensure_cursor
INSERT IGNORE INTO {cursor} (id, batch) VALUES (1, 0)

-- name: read_cursor
SELECT batch FROM {cursor} WHERE id = 1

-- name: next_claimed
SELECT min(batch) FROM {claims} WHERE batch > %(start)s

-- name: max_claimed
SELECT max(batch) FROM {claims}

-- name: max_id
SELECT max(id) FROM {outbox}

-- name: claim
-- Second step of a claim on MySQL: insert the rows claim_select locked.
INSERT INTO {claims} (row_id, batch, bucket) VALUES (%s, %s, %s)

-- name: claim_select
-- MySQL's INSERT … SELECT would take shared locks on the rows it reads and wait on writers'
-- uncommitted rows; instead lock the oldest unclaimed rows with SKIP LOCKED (never wait on a
-- writer), inside the claim transaction, while our lease epoch is current.
SELECT o.id, crc32(o.kafka_key) %% %(buckets)s FROM {outbox} o
WHERE o.id <= %(max_id)s
  AND NOT EXISTS (SELECT 1 FROM {claims} c WHERE c.row_id = o.id)
  AND EXISTS (SELECT 1 FROM {leases} l WHERE l.name = %(lease)s AND l.holder = %(holder)s AND l.epoch = %(epoch)s)
ORDER BY o.id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: batch_rows
SELECT {raw_columns} FROM {outbox} o JOIN {claims} c ON c.row_id = o.id
WHERE c.batch > %(lo)s AND c.batch <= %(hi)s AND c.bucket = %(bucket)s
ORDER BY o.id

-- name: purge
DELETE o FROM {outbox} o JOIN {claims} c ON c.row_id = o.id WHERE c.batch <= %(end)s

-- name: drop_claims
DELETE FROM {claims} WHERE batch <= %(end)s

-- name: advance_cursor
UPDATE {cursor} SET batch = %(end)s WHERE id = 1 AND batch < %(end)s

-- name: backlog
SELECT count(*), count(c.row_id) FROM {outbox} o LEFT JOIN {claims} c ON c.row_id = o.id

-- name: peek
SELECT {raw_columns} FROM {outbox} o WHERE o.id >= %(lo)s AND o.id < %(hi)s ORDER BY o.id LIMIT %(limit)s
