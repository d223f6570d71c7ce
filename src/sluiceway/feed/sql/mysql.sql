-- Feed SQL for MariaDB (10.6+: SKIP LOCKED, INSERT … RETURNING) and MySQL-compatible servers.
-- Same statements as postgres.sql in MySQL's terms; see there for the design notes.
-- Timestamps are DATETIME(6) in UTC from the database clock (UTC_TIMESTAMP(6)), so the session
-- time zone cannot shift them; intervals are bound as whole microseconds. Lists are bound as
-- Python tuples, which PyMySQL renders as SQL lists; (id, version) pairs as tuples of tuples.
-- There are no partial indexes: status is a leading index column instead, so the hot path
-- still reads only available rows. Indexes are declared in CREATE TABLE (MySQL has no CREATE INDEX IF
-- NOT EXISTS); those added later come with MariaDB's IF [NOT] EXISTS clauses, for older tables.

-- name: migrate_lock
-- DDL commits implicitly here, so a named lock (not a transaction) serialises concurrent starts.
SELECT GET_LOCK(%(name)s, 60)

-- name: migrate_unlock
SELECT RELEASE_LOCK(%(name)s)

-- name: create_partitions
CREATE TABLE IF NOT EXISTS {partitions} (
  id          BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  name        VARCHAR(255) NOT NULL,
  status      VARCHAR(16) NOT NULL DEFAULT 'available',
  gate        INT NOT NULL DEFAULT 0,
  owner       VARCHAR(128) NULL,
  lease_until DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00',
  version     BIGINT NOT NULL DEFAULT 0,
  attributes  JSON NOT NULL DEFAULT ('{}'),
  priority    INT NOT NULL DEFAULT 0,
  created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
  updated_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
  CONSTRAINT {raw_partitions_name_key} UNIQUE KEY (name),
  CONSTRAINT {raw_partitions_status_check} CHECK (status IN ('available', 'failed', 'complete')),
  -- expired leases, read backwards from now (free_partitions)
  KEY {raw_partitions_free_idx} (status, lease_until, id),
  -- free partitions (owner IS NULL), highest priority first (descending keys: MariaDB 10.8+)
  KEY {raw_partitions_ready_idx} (status, owner, priority DESC, lease_until, id),
  -- renewals, the claim's join and the census start from an owner
  KEY {raw_partitions_owner_idx} (owner, status, lease_until),
  -- keyset-paged listings by status
  KEY {raw_partitions_status_idx} (status, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4

-- name: create_items
-- available_at doubles as the item's claim lease (see postgres.sql).
CREATE TABLE IF NOT EXISTS {items} (
  id           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  partition_id BIGINT NOT NULL,
  gate         INT NOT NULL DEFAULT 0,
  status       VARCHAR(16) NOT NULL DEFAULT 'available',
  attempts     INT NOT NULL DEFAULT 0,
  available_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
  data         LONGBLOB NOT NULL,
  result       TEXT NULL,
  last_error   TEXT NULL,
  version      BIGINT NOT NULL DEFAULT 0,
  created_at   DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
  updated_at   DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
  priority     INT NOT NULL DEFAULT 0,
  CONSTRAINT {raw_items_status_check} CHECK (status IN ('available', 'failed', 'complete')),
  -- the hot path: (partition, 'available', gate) is one range, highest priority first, then in
  -- id order (descending keys: MariaDB 10.8+); finished items sit in other ranges and are never
  -- stepped over. Also serves the failed-items probes.
  KEY {raw_items_claim_idx} (partition_id, status, gate, priority DESC, id),
  -- retry/resolve across all partitions
  KEY {raw_items_failed_idx} (status, partition_id),
  -- listings of one partition's items
  KEY {raw_items_partition_idx} (partition_id, id),
  CONSTRAINT {raw_items_partition_fk} FOREIGN KEY (partition_id) REFERENCES {partitions} (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4

-- name: has_column
-- Asked before adding a column, so that a start where nothing is missing runs no ALTER TABLE.
SELECT count(*) FROM information_schema.columns
WHERE table_schema = COALESCE(%(schema)s, DATABASE()) AND table_name = %(table)s AND column_name = %(column)s

-- name: add_partitions_priority
-- Added with priorities: tables created before them get the column here (MariaDB's IF NOT
-- EXISTS; MySQL has none — the feed needs MariaDB 10.6+ anyway).
ALTER TABLE {partitions} ADD COLUMN IF NOT EXISTS priority INT NOT NULL DEFAULT 0

-- name: add_items_priority
ALTER TABLE {items} ADD COLUMN IF NOT EXISTS priority INT NOT NULL DEFAULT 0

-- name: index_partitions_free
-- Declared in create_partitions.
SELECT 1

-- name: index_partitions_owner
-- Declared in create_partitions.
SELECT 1

-- name: index_partitions_ready
-- Declared in create_partitions; tables from before priorities get it here.
CREATE INDEX IF NOT EXISTS {raw_partitions_ready_idx} ON {partitions} (status, owner, priority DESC, lease_until, id)

-- name: index_partitions_scheduled
-- Not used here: only next_due (PostgreSQL wake-ups) looks for the next scheduled partition.
SELECT 1

-- name: index_partitions_status
-- Declared in create_partitions.
SELECT 1

-- name: index_items_open
-- Tables from before priorities had (partition_id, status, gate, id); the claim index below does
-- its work (the foreign key keeps items_partition_idx), so it goes.
DROP INDEX IF EXISTS {raw_items_open_idx} ON {items}

-- name: index_items_claim
-- Declared in create_items; tables from before priorities get it here.
CREATE INDEX IF NOT EXISTS {raw_items_claim_idx} ON {items} (partition_id, status, gate, priority DESC, id)

-- name: index_items_failed
-- Declared in create_items.
SELECT 1

-- name: index_items_partition
-- Declared in create_items.
SELECT 1

-- name: scheduled_at
-- not_before as one instant (see postgres.sql): `at` as a naive UTC DATETIME, or a delay.
SELECT COALESCE(%(at)s, UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND)

-- name: insert_partition
-- Scheduled: free, with lease_until at not_before (see postgres.sql); else the epoch.
INSERT INTO {partitions} (name, gate, attributes, lease_until, priority)
VALUES (%(name)s, %(gate)s, %(attributes)s, COALESCE(%(lease_until)s, '1970-01-01 00:00:00'), %(priority)s)
RETURNING id

-- name: insert_items
-- Run with executemany: PyMySQL folds it into multi-row INSERTs (one round trip per ~1 MB).
INSERT INTO {items} (partition_id, gate, data, priority) VALUES (%(partition_id)s, %(gate)s, %(data)s, %(priority)s)

-- name: insert_items_at
-- Items with a not_before: it is their available_at (see postgres.sql), computed once by
-- scheduled_at and bound here as a plain value — placeholders only, so PyMySQL still folds the
-- executemany into multi-row INSERTs (an expression in VALUES would cost a round trip per row).
INSERT INTO {items} (partition_id, gate, data, available_at, priority)
VALUES (%(partition_id)s, %(gate)s, %(data)s, %(available_at)s, %(priority)s)

-- name: lock_partition
SELECT id, status, gate, version FROM {partitions} WHERE name = %(name)s FOR UPDATE

-- name: reopen_partition
UPDATE {partitions} SET status = 'available', version = version + 1, updated_at = UTC_TIMESTAMP(6)
WHERE id = %(id)s AND version = %(version)s

-- name: partition_by_name
SELECT id, name, status, gate, owner, lease_until, version, attributes, created_at, updated_at, priority
FROM {partitions} WHERE name = %(name)s

-- name: partitions_page
SELECT id, name, status, gate, owner, lease_until, version, attributes, created_at, updated_at, priority
FROM {partitions} WHERE id > %(after)s ORDER BY id LIMIT %(limit)s

-- name: partitions_page_by_status
SELECT id, name, status, gate, owner, lease_until, version, attributes, created_at, updated_at, priority
FROM {partitions} WHERE status = %(status)s AND id > %(after)s ORDER BY status, id LIMIT %(limit)s

-- name: items_page
SELECT id, partition_id, gate, status, attempts, available_at, data, result, last_error, version, created_at,
       updated_at, priority
FROM {items} WHERE partition_id = %(partition_id)s AND id > %(after)s ORDER BY partition_id, id LIMIT %(limit)s

-- name: renew
UPDATE {partitions} SET lease_until = UTC_TIMESTAMP(6) + INTERVAL %(lease_us)s MICROSECOND, version = version + 1
WHERE owner = %(owner)s AND status = 'available'

-- name: owned
SELECT id FROM {partitions} WHERE owner = %(owner)s AND status = 'available'

-- name: census
-- Live owners, then (NULL owner) the available partitions, not counting those scheduled for
-- later (see postgres.sql).
SELECT owner, count(*) FROM {partitions}
WHERE status = 'available' AND owner IS NOT NULL AND lease_until > UTC_TIMESTAMP(6)
GROUP BY owner
UNION ALL
SELECT NULL, count(*) FROM {partitions}
WHERE status = 'available' AND (owner IS NOT NULL OR lease_until <= UTC_TIMESTAMP(6))

-- name: free_partitions
-- Free partitions by priority (ready index), merged with expired leases read backwards from now
-- (free index); see postgres.sql.
SELECT id, version, priority FROM (
  (SELECT id, version, priority, lease_until FROM {partitions}
   WHERE status = 'available' AND owner IS NULL AND lease_until <= UTC_TIMESTAMP(6)
   ORDER BY priority DESC, lease_until, id LIMIT %(limit)s)
  UNION ALL
  (SELECT id, version, priority, lease_until FROM {partitions}
   WHERE status = 'available' AND owner IS NOT NULL AND lease_until <= UTC_TIMESTAMP(6)
     AND lease_until > '1970-01-01 00:00:00'
   ORDER BY lease_until DESC, id DESC LIMIT %(limit)s)
) AS free ORDER BY priority DESC, lease_until, id LIMIT %(limit)s

-- name: acquire_lock
-- Step one of a take, in a short transaction: lock the free partitions read above that are
-- still as read, in id order, SKIP LOCKED (one another worker is taking, renewing or releasing
-- right now is not ours this time; never waiting means concurrent takes cannot deadlock).
SELECT id FROM {partitions}
WHERE (id, version) IN %(pairs)s AND status = 'available' AND lease_until <= UTC_TIMESTAMP(6)
ORDER BY id
FOR UPDATE SKIP LOCKED

-- name: acquire
-- Step two, same transaction: the rows are locked and still free, so this takes them all.
UPDATE {partitions}
SET owner = %(owner)s, lease_until = UTC_TIMESTAMP(6) + INTERVAL %(lease_us)s MICROSECOND,
    version = version + 1, updated_at = UTC_TIMESTAMP(6)
WHERE id IN %(ids)s

-- name: taken
SELECT id, name, attributes, gate FROM {partitions}
WHERE id IN %(ids)s AND owner = %(owner)s AND status = 'available'

-- name: victim_partition
SELECT id, version FROM {partitions}
WHERE owner = %(victim)s AND status = 'available' AND lease_until > UTC_TIMESTAMP(6)
ORDER BY id DESC LIMIT 1

-- name: steal
UPDATE {partitions}
SET owner = %(owner)s, lease_until = UTC_TIMESTAMP(6) + INTERVAL %(lease_us)s MICROSECOND,
    version = version + 1, updated_at = UTC_TIMESTAMP(6)
WHERE id = %(id)s AND version = %(version)s AND status = 'available'

-- name: release
UPDATE {partitions}
SET owner = NULL, lease_until = '1970-01-01 00:00:00', version = version + 1, updated_at = UTC_TIMESTAMP(6)
WHERE id IN %(ids)s AND owner = %(owner)s

-- name: claim
-- No UPDATE … RETURNING here: select-and-lock up to `limit` claimable items in a short
-- transaction (SKIP LOCKED: never wait behind another transaction), then `claim_mark` them.
-- No ORDER BY: MySQL sorts (and, FOR UPDATE, locks) every joined row for an ORDER BY that spans
-- two tables. The join instead reads each partition's items from the claim index, in its order:
-- highest priority first, then by id. FORCE INDEX, because on small tables the optimizer may
-- prefer items_partition_idx (id order, priorities ignored); the order needs descending index
-- keys (MariaDB 10.8+; earlier ones parse DESC and build the key ascending).
SELECT c.id, c.partition_id, c.gate, c.data, c.attempts, c.version
FROM {partitions} AS p
JOIN {items} AS c FORCE INDEX ({raw_items_claim_idx}) ON c.partition_id = p.id AND c.status = 'available' AND c.gate = p.gate
WHERE p.owner = %(owner)s AND p.status = 'available' AND p.lease_until > UTC_TIMESTAMP(6)
  AND c.available_at <= UTC_TIMESTAMP(6)
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: claim_mark
-- Step two of the claim, same transaction: the rows are locked, so this cannot miss.
UPDATE {items}
SET version = version + 1, attempts = attempts + 1,
    available_at = UTC_TIMESTAMP(6) + INTERVAL %(lease_us)s MICROSECOND
WHERE id IN %(ids)s

-- name: complete
-- One row per outcome, executemany in one transaction (one commit per batch); each row is
-- conditional on the claim's version.
UPDATE {items}
SET status = %(status)s, gate = %(gate)s, data = COALESCE(%(data)s, data), attempts = %(attempts)s,
    available_at = UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND, result = COALESCE(%(result)s, result),
    last_error = COALESCE(%(error)s, last_error), version = version + 1, updated_at = UTC_TIMESTAMP(6)
WHERE id = %(id)s AND version = %(version)s

-- name: complete_done
-- Items finished without new data (the common case), executemany in the same transaction.
UPDATE {items}
SET status = 'complete', result = 'done', version = version + 1, updated_at = UTC_TIMESTAMP(6)
WHERE id = %(id)s AND version = %(version)s

-- name: summarize_owned
SELECT p.id, p.version, p.gate,
  EXISTS (SELECT 1 FROM {items} AS i
          WHERE i.partition_id = p.id AND i.status = 'available' AND i.gate = p.gate),
  EXISTS (SELECT 1 FROM {items} AS i WHERE i.partition_id = p.id AND i.status = 'failed'),
  (SELECT min(i.gate) FROM {items} AS i
   WHERE i.partition_id = p.id AND i.status = 'available' AND i.gate > p.gate)
FROM {partitions} AS p
WHERE p.id IN %(ids)s AND p.owner = %(owner)s AND p.status = 'available'

-- name: summarize
SELECT p.id, p.version, p.gate,
  EXISTS (SELECT 1 FROM {items} AS i
          WHERE i.partition_id = p.id AND i.status = 'available' AND i.gate = p.gate),
  EXISTS (SELECT 1 FROM {items} AS i WHERE i.partition_id = p.id AND i.status = 'failed'),
  (SELECT min(i.gate) FROM {items} AS i
   WHERE i.partition_id = p.id AND i.status = 'available' AND i.gate > p.gate)
FROM {partitions} AS p
WHERE p.id = %(id)s AND p.status = 'available'

-- name: advance_gate
UPDATE {partitions} SET gate = %(gate)s, version = version + 1, updated_at = UTC_TIMESTAMP(6)
WHERE id = %(id)s AND version = %(version)s AND status = 'available'

-- name: close_partition
UPDATE {partitions}
SET status = %(status)s, owner = NULL, lease_until = '1970-01-01 00:00:00', version = version + 1,
    updated_at = UTC_TIMESTAMP(6)
WHERE id = %(id)s AND version = %(version)s AND status = 'available'

-- name: reopen_failed
UPDATE {partitions} SET status = 'available', version = version + 1, updated_at = UTC_TIMESTAMP(6)
WHERE status <> 'complete' AND id IN (
  SELECT partition_id FROM {items}
  WHERE status = 'failed' AND (%(partition_id)s IS NULL OR partition_id = %(partition_id)s)
    AND (%(item_id)s IS NULL OR id = %(item_id)s)
)

-- name: retry_failed
UPDATE {items} SET status = 'available', attempts = 0, available_at = UTC_TIMESTAMP(6), version = version + 1,
    updated_at = UTC_TIMESTAMP(6)
WHERE status = 'failed' AND (%(partition_id)s IS NULL OR partition_id = %(partition_id)s)
  AND (%(item_id)s IS NULL OR id = %(item_id)s)

-- name: resolve_failed
UPDATE {items} SET status = 'complete', result = 'resolved', version = version + 1,
    updated_at = UTC_TIMESTAMP(6)
WHERE status = 'failed' AND (%(partition_id)s IS NULL OR partition_id = %(partition_id)s)
  AND (%(item_id)s IS NULL OR id = %(item_id)s)

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
SELECT COALESCE(SUM(available_at <= UTC_TIMESTAMP(6)), 0),
       TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) / 1e6
FROM {items} WHERE status = 'available'

-- name: status_scheduled
-- Work held back to a time on purpose (see postgres.sql).
SELECT
  (SELECT count(*) FROM {partitions} WHERE status = 'available' AND owner IS NULL AND lease_until > UTC_TIMESTAMP(6)),
  (SELECT min(lease_until) FROM {partitions} WHERE status = 'available' AND owner IS NULL AND lease_until > UTC_TIMESTAMP(6)),
  (SELECT count(*) FROM {items} WHERE status = 'available' AND attempts = 0 AND available_at > UTC_TIMESTAMP(6)),
  (SELECT min(available_at) FROM {items} WHERE status = 'available' AND attempts = 0 AND available_at > UTC_TIMESTAMP(6))

-- name: status_workers
-- The last column counts the owner's expired leases (a worker that died or lost its database).
SELECT owner, count(*), min(lease_until), max(lease_until), max(lease_until) > UTC_TIMESTAMP(6),
       COALESCE(SUM(lease_until <= UTC_TIMESTAMP(6)), 0)
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
  attribute       VARCHAR(64) NOT NULL DEFAULT '',
  attribute_value VARCHAR(255) NOT NULL DEFAULT '',
  max_rate        DOUBLE NOT NULL,
  burst           DOUBLE NOT NULL,
  tokens          DOUBLE NOT NULL,
  refilled_at     DOUBLE NOT NULL,
  PRIMARY KEY (attribute, attribute_value),
  CONSTRAINT {raw_rates_check} CHECK (max_rate > 0 AND burst >= 1)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4

-- name: rates_list
-- SYSDATE(6), not NOW(6): the time the function runs, not the statement's start (see rate_lock).
-- UNIX_TIMESTAMP reads it in the session's time zone, the zone SYSDATE gives it in.
SELECT attribute, attribute_value, max_rate, burst, tokens, refilled_at, UNIX_TIMESTAMP(SYSDATE(6))
FROM {rates} ORDER BY attribute, attribute_value LIMIT 1000

-- name: rate_lock
-- A take, step 1: lock the bucket, then read the clock — SYSDATE(6) is evaluated when the row is
-- read, after any wait behind another worker's take (NOW(6) would be the statement's start).
SELECT tokens, burst, max_rate, refilled_at, UNIX_TIMESTAMP(SYSDATE(6))
FROM {rates} WHERE attribute = %(attribute)s AND attribute_value = %(value)s
FOR UPDATE

-- name: rate_write
UPDATE {rates} SET tokens = %(tokens)s, refilled_at = GREATEST(refilled_at, %(at)s)
WHERE attribute = %(attribute)s AND attribute_value = %(value)s

-- name: rate_give_back
UPDATE {rates} SET tokens = LEAST(burst, tokens + %(tokens)s)
WHERE attribute = %(attribute)s AND attribute_value = %(value)s

-- name: rate_insert
-- A new limit starts with a full bucket (its burst).
INSERT INTO {rates} (attribute, attribute_value, max_rate, burst, tokens, refilled_at)
VALUES (%(attribute)s, %(value)s, %(max_rate)s, %(burst)s, %(burst)s, UNIX_TIMESTAMP(SYSDATE(6)))

-- name: rate_update
UPDATE {rates} SET max_rate = %(max_rate)s, burst = %(burst)s, tokens = %(tokens)s,
    refilled_at = GREATEST(refilled_at, %(at)s)
WHERE attribute = %(attribute)s AND attribute_value = %(value)s

-- name: rate_delete
DELETE FROM {rates} WHERE attribute = %(attribute)s AND attribute_value = %(value)s

-- name: claim_in
-- `claim`, limited to some of our partitions (those sharing a set of rate limits); claim_mark
-- follows in the same transaction.
SELECT c.id, c.partition_id, c.gate, c.data, c.attempts, c.version
FROM {partitions} AS p
JOIN {items} AS c FORCE INDEX ({raw_items_claim_idx}) ON c.partition_id = p.id AND c.status = 'available' AND c.gate = p.gate
WHERE p.id IN %(ids)s AND p.owner = %(owner)s AND p.status = 'available' AND p.lease_until > UTC_TIMESTAMP(6)
  AND c.available_at <= UTC_TIMESTAMP(6)
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
