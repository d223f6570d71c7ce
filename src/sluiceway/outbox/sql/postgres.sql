-- Outbox SQL for PostgreSQL. The table is goharvest's, column for column, so an existing
-- goharvest table and its writers work unchanged. Parameters are bound (%(name)s);
-- {outbox}/{dead} are validated, quoted identifiers; {raw_*} are built by our own code.

-- name: create_table
CREATE TABLE IF NOT EXISTS {outbox} (
  id                  BIGSERIAL PRIMARY KEY,
  create_time         TIMESTAMP WITH TIME ZONE NOT NULL,
  kafka_topic         VARCHAR(249) NOT NULL,
  kafka_key           VARCHAR(100) NOT NULL,
  kafka_value         VARCHAR(10000),
  kafka_header_keys   TEXT[] NOT NULL,
  kafka_header_values TEXT[] NOT NULL,
  leader_id           UUID
)

-- name: create_index
-- The mark query walks the primary key in id order and skips the few rows this leader holds
-- (at most maxInFlightRecords), so no other index is needed on the hot path. This partial
-- index keeps `outbox stats` (rows marked) cheap on a large backlog.
CREATE INDEX IF NOT EXISTS {raw_index} ON {outbox} (leader_id) WHERE leader_id IS NOT NULL

-- name: add_partition_column
ALTER TABLE {outbox} ADD COLUMN IF NOT EXISTS kafka_partition INTEGER

-- name: binary_value_column
-- Optional: a bytea kafka_value for binary payloads (asked for by goharvest users).
ALTER TABLE {outbox} ALTER COLUMN kafka_value TYPE BYTEA USING convert_to(kafka_value, 'UTF8')

-- name: create_dead_table
-- Dead letters: the outbox's own columns (LIKE copies optional ones and their types, e.g. a
-- bytea kafka_value) plus why and how often delivery failed. No defaults: ids are kept.
CREATE TABLE IF NOT EXISTS {dead} (
  LIKE {outbox} INCLUDING INDEXES,
  error     TEXT NOT NULL,
  attempts  INTEGER NOT NULL,
  dead_time TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now()
)

-- name: columns
-- Which optional columns (kafka_partition, binary kafka_value) this table has.
SELECT column_name, data_type FROM information_schema.columns
WHERE table_name = %(table)s AND table_schema = COALESCE(%(schema)s, current_schema())

-- name: stash
-- Runs in the caller's transaction; NOW() is the transaction's start time, as goharvest.
INSERT INTO {outbox} (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
VALUES (NOW(), %s, %s, %s, %s, %s)

-- name: stash_partition
INSERT INTO {outbox} (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values,
                      kafka_partition)
VALUES (NOW(), %s, %s, %s, %s, %s, %s)

-- name: mark
-- One atomic statement: claim the oldest rows not owned by this leader id and return them.
-- RETURNING order is arbitrary, so the caller sorts by id.
UPDATE {outbox} SET leader_id = %(leader_id)s
WHERE id IN (
  SELECT id FROM {outbox}
  WHERE leader_id IS NULL OR leader_id <> %(leader_id)s
  ORDER BY id
  LIMIT %(limit)s
)
RETURNING {raw_columns}

-- name: purge
-- Acknowledged rows go in one statement per batch, never one round trip per record.
DELETE FROM {outbox} WHERE id = ANY(%(ids)s)

-- name: reset
-- A failed delivery puts the row back in scope for the marker (only if we still own it).
UPDATE {outbox} SET leader_id = NULL WHERE id = %(id)s AND leader_id = %(leader_id)s

-- name: bury
-- Moves a poison row to the dead-letter table; runs in one transaction with `purge_one`.
-- If a retried transaction finds the row already gone, it inserts nothing: no duplicate.
INSERT INTO {dead} ({raw_columns}, error, attempts)
SELECT {raw_columns}, %(error)s, %(attempts)s FROM {outbox} WHERE id = %(id)s

-- name: purge_one
DELETE FROM {outbox} WHERE id = %(id)s

-- name: stats
SELECT count(*), EXTRACT(EPOCH FROM (now() - min(create_time))), count(leader_id) FROM {outbox}

-- name: dead_count
SELECT count(*) FROM {dead}

-- name: table_exists
SELECT to_regclass(%(name)s) IS NOT NULL

-- name: current_database
-- Logged at start-up: the database the DSN actually reached (see db/dsn.py's dsn_warnings).
SELECT current_database()
