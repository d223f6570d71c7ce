-- Feed SQL for SQLite (embedded use). Same statements as postgres.sql, in SQLite's terms; see
-- there for the design notes. Parameters are bound (:name). Timestamps are ISO-8601 UTC text
-- from the database clock (strftime … 'now'), which sorts and compares as time; intervals are
-- bound as strftime modifiers ('+2.500 seconds'). Lists are bound as one JSON array and
-- unpacked with json_each, so statements stay fixed whatever the batch size.
-- SQLite serialises writers (BEGIN IMMEDIATE, busy_timeout): no SKIP LOCKED is needed, and the
-- claim is atomic under the write lock.

-- name: migrate_lock
-- The migration runs in one BEGIN IMMEDIATE transaction, which already excludes other writers.
SELECT 1

-- name: migrate_unlock
SELECT 1

-- name: create_partitions
CREATE TABLE IF NOT EXISTS {partitions} (
  id          INTEGER PRIMARY KEY AUTOINCREMENT,
  name        TEXT NOT NULL,
  status      TEXT NOT NULL DEFAULT 'available' CHECK (status IN ('available', 'failed', 'complete')),
  gate        INTEGER NOT NULL DEFAULT 0,
  owner       TEXT,
  lease_until TEXT NOT NULL DEFAULT '1970-01-01T00:00:00.000',
  version     INTEGER NOT NULL DEFAULT 0,
  attributes  TEXT NOT NULL DEFAULT '{}',
  priority    INTEGER NOT NULL DEFAULT 0,
  created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
  updated_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
  CONSTRAINT {raw_partitions_name_key} UNIQUE (name)
)

-- name: create_items
-- available_at doubles as the item's claim lease (see postgres.sql).
CREATE TABLE IF NOT EXISTS {items} (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  partition_id INTEGER NOT NULL REFERENCES {partitions} (id) ON DELETE CASCADE,
  gate         INTEGER NOT NULL DEFAULT 0,
  status       TEXT NOT NULL DEFAULT 'available' CHECK (status IN ('available', 'failed', 'complete')),
  attempts     INTEGER NOT NULL DEFAULT 0,
  available_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
  data         BLOB NOT NULL,
  result       TEXT,
  last_error   TEXT,
  version      INTEGER NOT NULL DEFAULT 0,
  created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
  updated_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
  priority     INTEGER NOT NULL DEFAULT 0
)

-- name: has_column
-- SQLite has no ADD COLUMN IF NOT EXISTS: the migration asks before adding a column.
SELECT count(*) FROM pragma_table_info(:table, COALESCE(:schema, 'main')) WHERE name = :column

-- name: add_partitions_priority
-- Added with priorities (run only when the column is missing, see has_column).
ALTER TABLE {partitions} ADD COLUMN priority INTEGER NOT NULL DEFAULT 0

-- name: add_items_priority
ALTER TABLE {items} ADD COLUMN priority INTEGER NOT NULL DEFAULT 0

-- name: index_partitions_free
-- Free or expired partitions: one ordered range scan (partial: only available partitions).
CREATE INDEX IF NOT EXISTS {raw_partitions_free_idx} ON {partitions} (lease_until, id) WHERE status = 'available'

-- name: index_partitions_owner
CREATE INDEX IF NOT EXISTS {raw_partitions_owner_idx} ON {partitions} (owner, lease_until) WHERE status = 'available'

-- name: index_partitions_ready
-- Free partitions, highest priority first (see postgres.sql).
CREATE INDEX IF NOT EXISTS {raw_partitions_ready_idx} ON {partitions} (priority DESC, lease_until, id)
WHERE status = 'available' AND owner IS NULL

-- name: index_partitions_scheduled
-- Not used here: only next_due (PostgreSQL wake-ups) looks for the next scheduled partition.
SELECT 1

-- name: index_partitions_status
CREATE INDEX IF NOT EXISTS {raw_partitions_status_idx} ON {partitions} (status, id)

-- name: index_items_open
-- The open index from before priorities: its successor below does its work (see postgres.sql).
DROP INDEX IF EXISTS {old_items_open_idx}

-- name: index_items_claim
-- The hot path, highest priority first then FIFO; partial, so finished items are never stepped over.
CREATE INDEX IF NOT EXISTS {raw_items_claim_idx} ON {items} (partition_id, gate, priority DESC, id)
WHERE status = 'available'

-- name: index_items_failed
CREATE INDEX IF NOT EXISTS {raw_items_failed_idx} ON {items} (partition_id) WHERE status = 'failed'

-- name: index_items_partition
-- Finished items only, so it never competes with the open index for the claim (postgres.sql).
CREATE INDEX IF NOT EXISTS {raw_items_partition_idx} ON {items} (partition_id, id) WHERE status <> 'available'

-- name: scheduled_at
-- not_before as one instant (see postgres.sql): `at` as ISO UTC text, or a delay modifier.
SELECT COALESCE(:at, strftime('%Y-%m-%dT%H:%M:%f', 'now', :delay_mod))

-- name: insert_partition
-- Scheduled: free, with lease_until at not_before (see postgres.sql); else the epoch.
INSERT INTO {partitions} (name, gate, attributes, lease_until, priority)
VALUES (:name, :gate, :attributes, COALESCE(:lease_until, '1970-01-01T00:00:00.000'), :priority)
RETURNING id

-- name: insert_items
-- Run with executemany inside the caller's transaction (in-process: no round trips to save).
INSERT INTO {items} (partition_id, gate, data, priority) VALUES (:partition_id, :gate, :data, :priority)

-- name: insert_items_at
-- Items with a not_before: it is their available_at (see postgres.sql).
INSERT INTO {items} (partition_id, gate, data, available_at, priority)
VALUES (:partition_id, :gate, :data, :available_at, :priority)

-- name: lock_partition
-- The transaction began IMMEDIATE: it already holds the write lock, so this read is stable.
SELECT id, status, gate, version FROM {partitions} WHERE name = :name

-- name: reopen_partition
UPDATE {partitions} SET status = 'available', version = version + 1,
    updated_at = strftime('%Y-%m-%dT%H:%M:%f', 'now')
WHERE id = :id AND version = :version

-- name: partition_by_name
SELECT id, name, status, gate, owner, lease_until, version, attributes, created_at, updated_at, priority
FROM {partitions} WHERE name = :name

-- name: partitions_page
SELECT id, name, status, gate, owner, lease_until, version, attributes, created_at, updated_at, priority
FROM {partitions} WHERE id > :after ORDER BY id LIMIT :limit

-- name: partitions_page_by_status
SELECT id, name, status, gate, owner, lease_until, version, attributes, created_at, updated_at, priority
FROM {partitions} WHERE status = :status AND id > :after ORDER BY status, id LIMIT :limit

-- name: items_page
-- Open and finished items live in different partial indexes: page through each, then merge.
SELECT * FROM (
  SELECT * FROM (
    SELECT id, partition_id, gate, status, attempts, available_at, data, result, last_error, version, created_at,
           updated_at, priority
    FROM {items} WHERE partition_id = :partition_id AND status = 'available' AND id > :after
    ORDER BY id LIMIT :limit)
  UNION ALL
  SELECT * FROM (
    SELECT id, partition_id, gate, status, attempts, available_at, data, result, last_error, version, created_at,
           updated_at, priority
    FROM {items} WHERE partition_id = :partition_id AND status <> 'available' AND id > :after
    ORDER BY id LIMIT :limit)
) ORDER BY id LIMIT :limit

-- name: renew
-- Guarded by owner: a lease another worker took is not touched (see postgres.sql).
UPDATE {partitions} SET lease_until = strftime('%Y-%m-%dT%H:%M:%f', 'now', :lease_mod), version = version + 1
WHERE owner = :owner AND status = 'available'

-- name: owned
SELECT id FROM {partitions} WHERE owner = :owner AND status = 'available'

-- name: census
-- Live owners, then (NULL owner) the available partitions, not counting those scheduled for
-- later (see postgres.sql).
SELECT owner, count(*) FROM {partitions}
WHERE status = 'available' AND owner IS NOT NULL AND lease_until > strftime('%Y-%m-%dT%H:%M:%f', 'now')
GROUP BY owner
UNION ALL
SELECT NULL, count(*) FROM {partitions}
WHERE status = 'available' AND (owner IS NOT NULL OR lease_until <= strftime('%Y-%m-%dT%H:%M:%f', 'now'))

-- name: free_partitions
-- Free partitions by priority (ready index), merged with expired leases read backwards from now
-- (free index); see postgres.sql.
SELECT id, version, priority FROM (
  SELECT * FROM (
    SELECT id, version, priority, lease_until FROM {partitions}
    WHERE status = 'available' AND owner IS NULL AND lease_until <= strftime('%Y-%m-%dT%H:%M:%f', 'now')
    ORDER BY priority DESC, lease_until, id LIMIT :limit)
  UNION ALL
  SELECT * FROM (
    SELECT id, version, priority, lease_until FROM {partitions}
    WHERE status = 'available' AND owner IS NOT NULL AND lease_until <= strftime('%Y-%m-%dT%H:%M:%f', 'now')
      AND lease_until > '1970-01-01T00:00:00.000'
    ORDER BY lease_until DESC, id DESC LIMIT :limit)
) ORDER BY priority DESC, lease_until, id LIMIT :limit

-- name: acquire_lock
-- Not used here: `acquire` locks and takes in one statement (MySQL needs two).
SELECT 1

-- name: acquire
-- Optimistic take of the page read above: :pairs is a JSON array of [id, version].
UPDATE {partitions}
SET owner = :owner, lease_until = strftime('%Y-%m-%dT%H:%M:%f', 'now', :lease_mod), version = version + 1,
    updated_at = strftime('%Y-%m-%dT%H:%M:%f', 'now')
WHERE (id, version) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:pairs))
  AND status = 'available' AND lease_until <= strftime('%Y-%m-%dT%H:%M:%f', 'now')

-- name: taken
SELECT id, name, attributes, gate FROM {partitions}
WHERE id IN (SELECT value FROM json_each(:ids)) AND owner = :owner AND status = 'available'

-- name: victim_partition
SELECT id, version FROM {partitions}
WHERE owner = :victim AND status = 'available' AND lease_until > strftime('%Y-%m-%dT%H:%M:%f', 'now')
ORDER BY id DESC LIMIT 1

-- name: steal
UPDATE {partitions}
SET owner = :owner, lease_until = strftime('%Y-%m-%dT%H:%M:%f', 'now', :lease_mod), version = version + 1,
    updated_at = strftime('%Y-%m-%dT%H:%M:%f', 'now')
WHERE id = :id AND version = :version AND status = 'available'

-- name: release
UPDATE {partitions}
SET owner = NULL, lease_until = '1970-01-01T00:00:00.000', version = version + 1,
    updated_at = strftime('%Y-%m-%dT%H:%M:%f', 'now')
WHERE id IN (SELECT value FROM json_each(:ids)) AND owner = :owner

-- name: claim
-- One atomic statement (SQLite 3.35+ RETURNING) under the write lock; see postgres.sql. The
-- ORDER BY is the order the loop already yields, so nothing is sorted: our partitions from the
-- owner index (owner, lease_until, then rowid, as every SQLite index entry ends), and within each
-- the claim index — highest priority first, then FIFO by id.
UPDATE {items}
SET version = version + 1, attempts = attempts + 1,
    available_at = strftime('%Y-%m-%dT%H:%M:%f', 'now', :lease_mod)
WHERE id IN (
  SELECT c.id FROM {partitions} AS p
  JOIN {items} AS c ON c.partition_id = p.id AND c.gate = p.gate AND c.status = 'available'
  WHERE p.owner = :owner AND p.status = 'available' AND p.lease_until > strftime('%Y-%m-%dT%H:%M:%f', 'now')
    AND c.available_at <= strftime('%Y-%m-%dT%H:%M:%f', 'now')
  ORDER BY p.lease_until, p.id, c.priority DESC, c.id
  LIMIT :limit
)
RETURNING id, partition_id, gate, data, attempts, version

-- name: claim_mark
-- Not used here: `claim` marks and returns in one statement (MySQL needs a second one).
SELECT 1

-- name: complete
-- One row per outcome, run with executemany in one transaction: one commit per batch. Each row
-- is conditional on the claim's version (see postgres.sql).
UPDATE {items}
SET status = :status, gate = :gate, data = COALESCE(:data, data), attempts = :attempts,
    available_at = strftime('%Y-%m-%dT%H:%M:%f', 'now', :delay_mod), result = COALESCE(:result, result),
    last_error = COALESCE(:error, last_error), version = version + 1,
    updated_at = strftime('%Y-%m-%dT%H:%M:%f', 'now')
WHERE id = :id AND version = :version

-- name: complete_done
-- Items finished without new data (the common case), executemany in the same transaction.
UPDATE {items}
SET status = 'complete', result = 'done', version = version + 1, updated_at = strftime('%Y-%m-%dT%H:%M:%f', 'now')
WHERE id = :id AND version = :version

-- name: summarize_owned
SELECT p.id, p.version, p.gate,
  EXISTS (SELECT 1 FROM {items} AS i
          WHERE i.partition_id = p.id AND i.gate = p.gate AND i.status = 'available'),
  EXISTS (SELECT 1 FROM {items} AS i WHERE i.partition_id = p.id AND i.status = 'failed'),
  (SELECT min(i.gate) FROM {items} AS i
   WHERE i.partition_id = p.id AND i.status = 'available' AND i.gate > p.gate)
FROM {partitions} AS p
WHERE p.id IN (SELECT value FROM json_each(:ids)) AND p.owner = :owner AND p.status = 'available'

-- name: summarize
SELECT p.id, p.version, p.gate,
  EXISTS (SELECT 1 FROM {items} AS i
          WHERE i.partition_id = p.id AND i.gate = p.gate AND i.status = 'available'),
  EXISTS (SELECT 1 FROM {items} AS i WHERE i.partition_id = p.id AND i.status = 'failed'),
  (SELECT min(i.gate) FROM {items} AS i
   WHERE i.partition_id = p.id AND i.status = 'available' AND i.gate > p.gate)
FROM {partitions} AS p
WHERE p.id = :id AND p.status = 'available'

-- name: advance_gate
UPDATE {partitions} SET gate = :gate, version = version + 1, updated_at = strftime('%Y-%m-%dT%H:%M:%f', 'now')
WHERE id = :id AND version = :version AND status = 'available'

-- name: close_partition
UPDATE {partitions}
SET status = :status, owner = NULL, lease_until = '1970-01-01T00:00:00.000', version = version + 1,
    updated_at = strftime('%Y-%m-%dT%H:%M:%f', 'now')
WHERE id = :id AND version = :version AND status = 'available'

-- name: reopen_failed
UPDATE {partitions} SET status = 'available', version = version + 1,
    updated_at = strftime('%Y-%m-%dT%H:%M:%f', 'now')
WHERE status <> 'complete' AND id IN (
  SELECT partition_id FROM {items}
  WHERE status = 'failed' AND (:partition_id IS NULL OR partition_id = :partition_id)
    AND (:item_id IS NULL OR id = :item_id)
)

-- name: retry_failed
UPDATE {items} SET status = 'available', attempts = 0, available_at = strftime('%Y-%m-%dT%H:%M:%f', 'now'),
    version = version + 1, updated_at = strftime('%Y-%m-%dT%H:%M:%f', 'now')
WHERE status = 'failed' AND (:partition_id IS NULL OR partition_id = :partition_id)
  AND (:item_id IS NULL OR id = :item_id)

-- name: resolve_failed
UPDATE {items} SET status = 'complete', result = 'resolved', version = version + 1,
    updated_at = strftime('%Y-%m-%dT%H:%M:%f', 'now')
WHERE status = 'failed' AND (:partition_id IS NULL OR partition_id = :partition_id)
  AND (:item_id IS NULL OR id = :item_id)

-- name: status_partitions
SELECT status, gate, count(*) FROM {partitions} GROUP BY status, gate ORDER BY status, gate LIMIT 200

-- name: status_priorities
-- Open work by priority (see postgres.sql).
SELECT 'partitions', priority, count(*) FROM {partitions} WHERE status = 'available' GROUP BY priority
UNION ALL
SELECT 'items', priority, count(*) FROM {items} WHERE status = 'available' GROUP BY priority
ORDER BY 1, 2 DESC LIMIT 200

-- name: status_items
-- By status and gate: what waits at which gate (few gates per feed, so few rows).
SELECT status, gate, count(*) FROM {items} GROUP BY status, gate ORDER BY status, gate LIMIT 1000

-- name: status_lag
SELECT coalesce(sum(available_at <= strftime('%Y-%m-%dT%H:%M:%f', 'now')), 0),
       (julianday('now') - julianday(min(created_at))) * 86400.0
FROM {items} WHERE status = 'available'

-- name: status_scheduled
-- Work held back to a time on purpose (see postgres.sql).
SELECT
  (SELECT count(*) FROM {partitions} WHERE status = 'available' AND owner IS NULL AND lease_until > strftime('%Y-%m-%dT%H:%M:%f', 'now')),
  (SELECT min(lease_until) FROM {partitions} WHERE status = 'available' AND owner IS NULL AND lease_until > strftime('%Y-%m-%dT%H:%M:%f', 'now')),
  (SELECT count(*) FROM {items} WHERE status = 'available' AND attempts = 0 AND available_at > strftime('%Y-%m-%dT%H:%M:%f', 'now')),
  (SELECT min(available_at) FROM {items} WHERE status = 'available' AND attempts = 0 AND available_at > strftime('%Y-%m-%dT%H:%M:%f', 'now'))

-- name: status_workers
-- The last column counts the owner's expired leases (a worker that died or lost its database).
SELECT owner, count(*), min(lease_until), max(lease_until),
       max(lease_until) > strftime('%Y-%m-%dT%H:%M:%f', 'now'),
       coalesce(sum(lease_until <= strftime('%Y-%m-%dT%H:%M:%f', 'now')), 0)
FROM {partitions} WHERE status = 'available' AND owner IS NOT NULL
GROUP BY owner ORDER BY owner LIMIT 1000

-- name: notify
-- Not used here: wake-ups are PostgreSQL's LISTEN/NOTIFY; workers on this database poll.
SELECT 1

-- name: listen
-- Not used here: wake-ups are PostgreSQL's LISTEN/NOTIFY; workers on this database poll.
SELECT 1

-- name: next_due
-- Not used here: only a worker sleeping on LISTEN needs to know when its next retry is due;
-- workers on this database poll.
SELECT 1

-- name: create_rates
-- Rate limits: one token bucket per row (see postgres.sql). refilled_at is epoch seconds by the
-- database clock. A table of its own: older feeds get it with CREATE TABLE IF NOT EXISTS.
CREATE TABLE IF NOT EXISTS {rates} (
  attribute       TEXT NOT NULL DEFAULT '',
  attribute_value TEXT NOT NULL DEFAULT '',
  max_rate        REAL NOT NULL,
  burst           REAL NOT NULL,
  tokens          REAL NOT NULL,
  refilled_at     REAL NOT NULL,
  PRIMARY KEY (attribute, attribute_value),
  CONSTRAINT {raw_rates_check} CHECK (max_rate > 0 AND burst >= 1)
)

-- name: rates_list
SELECT attribute, attribute_value, max_rate, burst, tokens, refilled_at,
       (julianday('now') - 2440587.5) * 86400.0
FROM {rates} ORDER BY attribute, attribute_value LIMIT 1000

-- name: rate_lock
-- A take, step 1: the transaction is BEGIN IMMEDIATE (the write lock, taken up front), which
-- serialises takes as FOR UPDATE does elsewhere.
SELECT tokens, burst, max_rate, refilled_at, (julianday('now') - 2440587.5) * 86400.0
FROM {rates} WHERE attribute = :attribute AND attribute_value = :value

-- name: rate_write
UPDATE {rates} SET tokens = :tokens, refilled_at = max(refilled_at, :at)
WHERE attribute = :attribute AND attribute_value = :value

-- name: rate_give_back
UPDATE {rates} SET tokens = min(burst, tokens + :tokens)
WHERE attribute = :attribute AND attribute_value = :value

-- name: rate_insert
-- A new limit starts with a full bucket (its burst).
INSERT INTO {rates} (attribute, attribute_value, max_rate, burst, tokens, refilled_at)
VALUES (:attribute, :value, :max_rate, :burst, :burst, (julianday('now') - 2440587.5) * 86400.0)

-- name: rate_update
UPDATE {rates} SET max_rate = :max_rate, burst = :burst, tokens = :tokens, refilled_at = max(refilled_at, :at)
WHERE attribute = :attribute AND attribute_value = :value

-- name: rate_delete
DELETE FROM {rates} WHERE attribute = :attribute AND attribute_value = :value

-- name: claim_in
-- `claim`, limited to some of our partitions (those sharing a set of rate limits).
UPDATE {items}
SET version = version + 1, attempts = attempts + 1,
    available_at = strftime('%Y-%m-%dT%H:%M:%f', 'now', :lease_mod)
WHERE id IN (
  SELECT c.id FROM {partitions} AS p
  JOIN {items} AS c ON c.partition_id = p.id AND c.gate = p.gate AND c.status = 'available'
  WHERE p.id IN (SELECT value FROM json_each(:ids))
    AND p.owner = :owner AND p.status = 'available' AND p.lease_until > strftime('%Y-%m-%dT%H:%M:%f', 'now')
    AND c.available_at <= strftime('%Y-%m-%dT%H:%M:%f', 'now')
  ORDER BY p.lease_until, p.id, c.priority DESC, c.id
  LIMIT :limit
)
RETURNING id, partition_id, gate, data, attempts, version
