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
  dead_time TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
  parked    BOOLEAN NOT NULL DEFAULT false
)

-- name: add_dead_parked_column
-- Dead-letter tables made before key parking: their letters did not park their keys.
ALTER TABLE {dead} ADD COLUMN IF NOT EXISTS parked BOOLEAN NOT NULL DEFAULT false

-- name: create_dead_index
-- The mark query looks up parked keys for every candidate row: a small partial index.
CREATE INDEX IF NOT EXISTS {raw_dead_index} ON {dead} (kafka_key) WHERE parked

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
-- One atomic statement: claim the oldest rows not owned by this leader id and return them,
-- skipping every row of a key parked behind a dead letter (whichever leader buried it: the dead
-- table is what a new leader sees). NOT IN, not a correlated NOT EXISTS: the parked keys are read
-- once per statement into a hash (kafka_key is NOT NULL, so NOT IN has no NULL trap), and each
-- candidate row costs a hash probe instead of an index probe. RETURNING order is arbitrary, so
-- the caller sorts by id.
UPDATE {outbox} SET leader_id = %(leader_id)s
WHERE id IN (
  SELECT o.id FROM {outbox} o
  WHERE (o.leader_id IS NULL OR o.leader_id <> %(leader_id)s)
    AND o.kafka_key NOT IN (SELECT d.kafka_key FROM {dead} d WHERE d.parked)
  ORDER BY o.id
  LIMIT %(limit)s
)
RETURNING {raw_columns}

-- name: mark_all_keys
-- The same without parking, for a dead-letter table that predates it (or none at all).
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
DELETE FROM {outbox} WHERE id = ANY(%(ids)s::bigint[])

-- name: reset
-- A failed delivery puts the row back in scope for the marker (only if we still own it).
UPDATE {outbox} SET leader_id = NULL WHERE id = %(id)s AND leader_id = %(leader_id)s

-- name: bury
-- Moves a poison row to the dead-letter table; runs in one transaction with `purge_one`.
-- If a retried transaction finds the row already gone, it inserts nothing: no duplicate.
INSERT INTO {dead} ({raw_columns}, error, attempts, parked)
SELECT {raw_columns}, %(error)s, %(attempts)s, %(parked)s FROM {outbox} WHERE id = %(id)s

-- name: bury_unparked
-- `bury` for a dead-letter table without the parked column.
INSERT INTO {dead} ({raw_columns}, error, attempts)
SELECT {raw_columns}, %(error)s, %(attempts)s FROM {outbox} WHERE id = %(id)s

-- name: purge_one
DELETE FROM {outbox} WHERE id = %(id)s

-- name: head_age
-- Age of the row at the head of the backlog (the lowest id) by the database's clock: one index
-- probe, cheap enough for every scrape of the harvester's metrics.
SELECT EXTRACT(EPOCH FROM (now() - create_time)) FROM {outbox} ORDER BY id LIMIT 1

-- name: stats
SELECT count(*), EXTRACT(EPOCH FROM (now() - min(create_time))), count(leader_id) FROM {outbox}

-- name: dead_count
SELECT count(*) FROM {dead}

-- name: table_exists
SELECT to_regclass(%(name)s) IS NOT NULL

-- name: parked_keys
SELECT count(DISTINCT kafka_key) FROM {dead} WHERE parked

-- name: dead_list
SELECT id, kafka_topic, kafka_key, attempts, parked, dead_time, error FROM {dead}
WHERE id > %(after)s ORDER BY id LIMIT %(limit)s

-- name: dead_get
-- Locks the letter: a concurrent retry or resolve of it waits, then finds it gone.
SELECT parked FROM {dead} WHERE id = %(id)s FOR UPDATE

-- name: dead_restore
-- Retry of a parked letter: back into the outbox under its own id, so it is the head of its
-- key again (its key's later rows all have higher ids and were never purged). Explicit ids
-- below the sequence are fine for a BIGSERIAL column.
INSERT INTO {outbox} ({raw_columns}) SELECT {raw_restore_columns} FROM {dead} WHERE id = %(id)s

-- name: dead_requeue
-- Retry of a letter that did not park its key: its successors were published, so it goes to the
-- tail with a new id (a re-used old id would make the harvester see its key go backwards).
INSERT INTO {outbox} ({raw_data_columns}) SELECT {raw_data_columns} FROM {dead} WHERE id = %(id)s

-- name: dead_delete
DELETE FROM {dead} WHERE id = %(id)s

-- name: current_database
-- Logged at start-up: the database the DSN actually reached (see db/dsn.py's dsn_warnings).
SELECT current_database()

-- name: create_notify_function
-- Wake-ups (`sluice outbox init --notify`): one NOTIFY per inserting statement, delivered when
-- its transaction commits, so a harvester never wakes before the rows are visible. The channel
-- is a literal built from the checked table name (outbox.table.notify_channel).
CREATE OR REPLACE FUNCTION {notify_function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify({raw_channel_literal}, '');
  RETURN NULL;
END
$$

-- name: drop_notify_trigger
DROP TRIGGER IF EXISTS {raw_notify_trigger} ON {outbox}

-- name: create_notify_trigger
CREATE TRIGGER {raw_notify_trigger} AFTER INSERT ON {outbox}
FOR EACH STATEMENT EXECUTE FUNCTION {notify_function}()

-- name: listen_rows
LISTEN {notify_channel}

-- name: notify_trigger_exists
SELECT EXISTS (
  SELECT 1 FROM pg_trigger
  WHERE tgrelid = to_regclass(%(table)s) AND tgname = %(trigger)s AND NOT tgisinternal AND tgenabled <> 'D'
)
