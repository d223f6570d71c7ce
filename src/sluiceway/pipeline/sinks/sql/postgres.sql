-- The postgres sink (pipeline/sinks/postgres.py): an upsert by key, exactly once per write.
-- PostgreSQL only (the sink writes to nothing else), like cdc/sql. Its
-- {table} and {progress} are validated, quoted identifiers; the {raw_…} column lists are built
-- by the sink from the batch's validated column names. Values are bound parameters.

-- name: create_lock
-- CREATE TABLE IF NOT EXISTS is not safe against itself: two parts of a first run that both find
-- no table both create it, and one fails on the catalog's unique index. The parts' set-up takes
-- this lock (released at the set-up transaction's end) so that one creates and the others find.
SELECT pg_advisory_xact_lock(hashtext('sluiceway.pipeline.sinks.postgres'))

-- name: create_progress
-- One row per sink (per Spark part): the token of the last write committed. Kept in the
-- destination so it commits in the same transaction as the data it vouches for.
CREATE TABLE IF NOT EXISTS {progress} (sink TEXT PRIMARY KEY, token TEXT NOT NULL)

-- name: create_table
-- `create: true`: a table shaped like the batch, keyed by the sink's key columns.
CREATE TABLE IF NOT EXISTS {table} ({raw_columns}, PRIMARY KEY ({raw_key}))

-- name: table_columns
-- The columns the table really has: the sink writes those of the batch's it finds, no others.
SELECT column_name FROM information_schema.columns
WHERE table_name = %(name)s AND table_schema = COALESCE(%(schema)s, current_schema())

-- name: lock_progress
-- Inside the write's transaction: locks the sink's progress row, so a zombie task replaying the
-- same write waits here and then sees the token (and writes nothing).
SELECT token FROM {progress} WHERE sink = %(sink)s FOR UPDATE

-- name: save_progress
-- Commits with the data: a replay of this exact write finds its token and is a no-op.
INSERT INTO {progress} (sink, token) VALUES (%(sink)s, %(token)s)
ON CONFLICT (sink) DO UPDATE SET token = EXCLUDED.token

-- name: upsert
-- The last record of each key; a key seen before is overwritten ({raw_action}: UPDATE SET the
-- non-key columns, or NOTHING when every column is a key).
INSERT INTO {table} ({raw_columns}) VALUES ({raw_values}) ON CONFLICT ({raw_key}) DO {raw_action}

-- name: delete
-- A key whose last record in the write is a delete.
DELETE FROM {table} WHERE {raw_key_match}

-- name: truncate_namespace
-- A truncate record (change data capture): every row of its namespace, in its place in the batch.
DELETE FROM {table} WHERE namespace = %(namespace)s
