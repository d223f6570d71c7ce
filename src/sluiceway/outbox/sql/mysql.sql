-- Outbox SQL for MySQL/MariaDB: goharvest's table in MySQL's terms. Header arrays are JSON
-- text; create_time is UTC (DATETIME(6), so the session time zone cannot shift it).

-- name: create_table
CREATE TABLE IF NOT EXISTS {outbox} (
  id                  BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  create_time         DATETIME(6) NOT NULL,
  kafka_topic         VARCHAR(249) NOT NULL,
  kafka_key           VARCHAR(100) NOT NULL,
  kafka_value         VARCHAR(10000),
  kafka_header_keys   TEXT NOT NULL,
  kafka_header_values TEXT NOT NULL,
  leader_id           CHAR(36) NULL,
  KEY {raw_index} (leader_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4

-- name: create_index
-- MySQL has no CREATE INDEX IF NOT EXISTS before 8.0; the index is declared in create_table.
SELECT 1

-- name: add_partition_column
ALTER TABLE {outbox} ADD COLUMN IF NOT EXISTS kafka_partition INT NULL

-- name: binary_value_column
ALTER TABLE {outbox} MODIFY COLUMN kafka_value VARBINARY(10000)

-- name: create_dead_table
-- LIKE copies the outbox's columns (optional ones too) with their types.
CREATE TABLE IF NOT EXISTS {dead} LIKE {outbox}

-- name: extend_dead_table
ALTER TABLE {dead}
  MODIFY COLUMN id BIGINT NOT NULL,
  ADD COLUMN IF NOT EXISTS error TEXT NOT NULL,
  ADD COLUMN IF NOT EXISTS attempts INT NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS dead_time DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)

-- name: add_dead_parked_column
-- Dead-letter tables made before key parking: their letters did not park their keys.
ALTER TABLE {dead} ADD COLUMN IF NOT EXISTS parked BOOLEAN NOT NULL DEFAULT FALSE

-- name: create_dead_index
-- The mark query looks up parked keys for every candidate row (MariaDB's IF NOT EXISTS).
CREATE INDEX IF NOT EXISTS {raw_dead_index} ON {dead} (kafka_key)

-- name: columns
SELECT column_name, data_type FROM information_schema.columns
WHERE table_name = %(table)s AND table_schema = COALESCE(%(schema)s, DATABASE())

-- name: stash
INSERT INTO {outbox} (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
VALUES (UTC_TIMESTAMP(6), %s, %s, %s, %s, %s)

-- name: stash_partition
INSERT INTO {outbox} (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values,
                      kafka_partition)
VALUES (UTC_TIMESTAMP(6), %s, %s, %s, %s, %s, %s)

-- name: mark
-- MySQL has no UPDATE … RETURNING: select-and-lock the oldest rows not ours in a short
-- transaction, then `mark_update` them. Deliberately FOR UPDATE *without* SKIP LOCKED: skipping
-- a row that another session holds (a killed leader's purge or reset that the server has not
-- rolled back yet, a stale harvester's mark, an application updating its row) would claim a
-- key's later rows ahead of that older one, which reappears after the rollback — reordering,
-- not a duplicate. Seen once in the MariaDB fault chaos test before this was changed.
-- Waiting costs little: the locks are our own short purges and writers' commits at the tail.
-- Rows of keys parked behind a dead letter are skipped (see postgres.sql); the subquery is not
-- a locking read, so it takes no locks on the dead-letter table.
SELECT {raw_columns} FROM {outbox} o
WHERE (o.leader_id IS NULL OR o.leader_id <> %(leader_id)s)
  AND o.kafka_key NOT IN (SELECT d.kafka_key FROM {dead} d WHERE d.parked)
ORDER BY o.id
LIMIT %(limit)s
FOR UPDATE

-- name: mark_all_keys
SELECT {raw_columns} FROM {outbox}
WHERE leader_id IS NULL OR leader_id <> %(leader_id)s
ORDER BY id
LIMIT %(limit)s
FOR UPDATE

-- name: mark_update
UPDATE {outbox} SET leader_id = %(leader_id)s WHERE id IN %(ids)s

-- name: purge
DELETE FROM {outbox} WHERE id IN %(ids)s

-- name: reset
UPDATE {outbox} SET leader_id = NULL WHERE id = %(id)s AND leader_id = %(leader_id)s

-- name: bury
INSERT INTO {dead} ({raw_columns}, error, attempts, parked)
SELECT {raw_columns}, %(error)s, %(attempts)s, %(parked)s FROM {outbox} WHERE id = %(id)s

-- name: bury_unparked
INSERT INTO {dead} ({raw_columns}, error, attempts)
SELECT {raw_columns}, %(error)s, %(attempts)s FROM {outbox} WHERE id = %(id)s

-- name: purge_one
DELETE FROM {outbox} WHERE id = %(id)s

-- name: head_age
-- See postgres.sql.
SELECT TIMESTAMPDIFF(MICROSECOND, create_time, UTC_TIMESTAMP(6)) / 1e6 FROM {outbox} ORDER BY id LIMIT 1

-- name: stats
SELECT count(*), TIMESTAMPDIFF(MICROSECOND, min(create_time), UTC_TIMESTAMP(6)) / 1e6, count(leader_id)
FROM {outbox}

-- name: dead_count
SELECT count(*) FROM {dead}

-- name: table_exists
SELECT count(*) > 0 FROM information_schema.tables WHERE table_name = %(name)s AND table_schema = DATABASE()

-- name: parked_keys
SELECT count(DISTINCT kafka_key) FROM {dead} WHERE parked

-- name: dead_list
SELECT id, kafka_topic, kafka_key, attempts, parked, dead_time, error FROM {dead}
WHERE id > %(after)s ORDER BY id LIMIT %(limit)s

-- name: dead_get
-- Locks the letter: a concurrent retry or resolve of it waits, then finds it gone.
SELECT parked FROM {dead} WHERE id = %(id)s FOR UPDATE

-- name: dead_restore
-- See postgres.sql. An explicit id below AUTO_INCREMENT's counter leaves the counter alone.
INSERT INTO {outbox} ({raw_columns}) SELECT {raw_restore_columns} FROM {dead} WHERE id = %(id)s

-- name: dead_requeue
INSERT INTO {outbox} ({raw_data_columns}) SELECT {raw_data_columns} FROM {dead} WHERE id = %(id)s

-- name: dead_delete
DELETE FROM {dead} WHERE id = %(id)s

-- name: current_database
SELECT DATABASE()
