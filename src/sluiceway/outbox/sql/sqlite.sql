-- Outbox SQL for SQLite: goharvest's table in SQLite's terms. Header arrays are JSON text;
-- create_time is ISO-8601 UTC text. AUTOINCREMENT so an id is never reused after purges
-- (a reused id could sort a new record before an older one still in flight).

-- name: create_table
CREATE TABLE IF NOT EXISTS {outbox} (
  id                  INTEGER PRIMARY KEY AUTOINCREMENT,
  create_time         TEXT NOT NULL,
  kafka_topic         TEXT NOT NULL CHECK (length(kafka_topic) <= 249),
  kafka_key           TEXT NOT NULL CHECK (length(kafka_key) <= 100),
  kafka_value         TEXT,
  kafka_header_keys   TEXT NOT NULL DEFAULT '[]',
  kafka_header_values TEXT NOT NULL DEFAULT '[]',
  leader_id           TEXT
)

-- name: create_index
-- See postgres.sql: marking walks the rowid; this partial index keeps stats cheap.
CREATE INDEX IF NOT EXISTS {raw_index} ON {outbox} (leader_id) WHERE leader_id IS NOT NULL

-- name: add_partition_column
ALTER TABLE {outbox} ADD COLUMN kafka_partition INTEGER

-- name: binary_value_column
-- SQLite columns hold any type: a BLOB value needs no schema change.
SELECT 1

-- name: create_dead_table
CREATE TABLE IF NOT EXISTS {dead} (
  id                  INTEGER PRIMARY KEY,
  create_time         TEXT NOT NULL,
  kafka_topic         TEXT NOT NULL,
  kafka_key           TEXT NOT NULL,
  kafka_value,
  kafka_header_keys   TEXT NOT NULL,
  kafka_header_values TEXT NOT NULL,
  leader_id           TEXT,
  kafka_partition     INTEGER,
  error               TEXT NOT NULL,
  attempts            INTEGER NOT NULL,
  dead_time           TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  parked              INTEGER NOT NULL DEFAULT 0
)

-- name: add_dead_parked_column
-- Dead-letter tables made before key parking (SQLite has no ADD COLUMN IF NOT EXISTS: the
-- caller checks the columns first).
ALTER TABLE {dead} ADD COLUMN parked INTEGER NOT NULL DEFAULT 0

-- name: create_dead_index
-- The mark query looks up parked keys for every candidate row: a small partial index.
CREATE INDEX IF NOT EXISTS {raw_dead_index} ON {dead} (kafka_key) WHERE parked

-- name: columns
SELECT name, type FROM pragma_table_info(:table)

-- name: stash
INSERT INTO {outbox} (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
VALUES (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), ?, ?, ?, ?, ?)

-- name: stash_partition
INSERT INTO {outbox} (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values,
                      kafka_partition)
VALUES (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), ?, ?, ?, ?, ?, ?)

-- name: mark
-- SQLite (3.35+) has UPDATE … RETURNING; the statement is atomic under its write lock. Rows of
-- keys parked behind a dead letter are skipped (see postgres.sql).
UPDATE {outbox} SET leader_id = :leader_id
WHERE id IN (
  SELECT o.id FROM {outbox} o
  WHERE (o.leader_id IS NULL OR o.leader_id <> :leader_id)
    AND o.kafka_key NOT IN (SELECT d.kafka_key FROM {dead} d WHERE d.parked)
  ORDER BY o.id
  LIMIT :limit
)
RETURNING {raw_columns}

-- name: mark_all_keys
UPDATE {outbox} SET leader_id = :leader_id
WHERE id IN (
  SELECT id FROM {outbox}
  WHERE leader_id IS NULL OR leader_id <> :leader_id
  ORDER BY id
  LIMIT :limit
)
RETURNING {raw_columns}

-- name: purge
-- ids arrive as one JSON array: one statement per batch, whatever its size.
DELETE FROM {outbox} WHERE id IN (SELECT value FROM json_each(:ids))

-- name: reset
UPDATE {outbox} SET leader_id = NULL WHERE id = :id AND leader_id = :leader_id

-- name: bury
INSERT INTO {dead} ({raw_columns}, error, attempts, parked)
SELECT {raw_columns}, :error, :attempts, :parked FROM {outbox} WHERE id = :id

-- name: bury_unparked
INSERT INTO {dead} ({raw_columns}, error, attempts)
SELECT {raw_columns}, :error, :attempts FROM {outbox} WHERE id = :id

-- name: purge_one
DELETE FROM {outbox} WHERE id = :id

-- name: head_age
-- See postgres.sql.
SELECT (julianday('now') - julianday(create_time)) * 86400.0 FROM {outbox} ORDER BY id LIMIT 1

-- name: stats
SELECT count(*),
       (julianday('now') - julianday(min(create_time))) * 86400.0,
       count(leader_id)
FROM {outbox}

-- name: dead_count
SELECT count(*) FROM {dead}

-- name: table_exists
SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = :name

-- name: parked_keys
SELECT count(DISTINCT kafka_key) FROM {dead} WHERE parked

-- name: dead_list
SELECT id, kafka_topic, kafka_key, attempts, parked, dead_time, error FROM {dead}
WHERE id > :after ORDER BY id LIMIT :limit

-- name: dead_get
-- Runs in a write transaction (BEGIN IMMEDIATE): concurrent retries and resolves are serialised.
SELECT parked FROM {dead} WHERE id = :id

-- name: dead_restore
-- See postgres.sql. AUTOINCREMENT keeps its high-water mark, so no later id is disturbed.
INSERT INTO {outbox} ({raw_columns}) SELECT {raw_restore_columns} FROM {dead} WHERE id = :id

-- name: dead_requeue
INSERT INTO {outbox} ({raw_data_columns}) SELECT {raw_data_columns} FROM {dead} WHERE id = :id

-- name: dead_delete
DELETE FROM {dead} WHERE id = :id

-- name: current_database
-- The file behind the connection ('' for an in-memory database).
SELECT file FROM pragma_database_list WHERE name = 'main'
