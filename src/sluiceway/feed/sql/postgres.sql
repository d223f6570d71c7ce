-- Feed SQL for PostgreSQL. Parameters are bound (%(name)s); {partitions}/{items} are validated,
-- quoted table names; {raw_*} are index/constraint names our code builds from the same prefix.
--
-- Time: every lease and back-off is computed by the database clock (now(): the statement's start
-- in autocommit), never by a worker's clock, so workers with skewed clocks still agree.
-- A free partition has lease_until = the epoch (not NULL), so "free or expired" is a single
-- range scan of one index, ordered and LIMITed.
--
-- Concurrency: state changes are optimistic — `… SET version = version + 1 … WHERE id = … AND
-- version = …` — except the lease keeping of a partition's current owner (renew, release),
-- which is guarded by `owner = me` instead: a take always changes owner *and* bumps version,
-- and producers bump version too (add_items), which must not make an owner drop its lease.
-- Operator actions (retry/resolve) are guarded by the state they change (status = 'failed')
-- and bump version too, which voids any gate decision taken from older facts.

-- name: migrate_lock
-- Several workers may start at once; CREATE … IF NOT EXISTS is not safe against itself in
-- PostgreSQL (pg_type unique violations), so migrations queue on an advisory lock that ends
-- with the migration's transaction.
SELECT pg_advisory_xact_lock(hashtext(%(name)s))

-- name: migrate_unlock
-- The advisory lock above is transaction-scoped: nothing to release.
SELECT 1

-- name: create_partitions
-- fillfactor 70: room on each page so that frequent lease renewals can be HOT updates.
CREATE TABLE IF NOT EXISTS {partitions} (
  id          BIGSERIAL PRIMARY KEY,
  name        TEXT NOT NULL,
  status      VARCHAR(16) NOT NULL DEFAULT 'available',
  gate        INTEGER NOT NULL DEFAULT 0,
  owner       VARCHAR(128),
  lease_until TIMESTAMPTZ NOT NULL DEFAULT '1970-01-01 00:00:00+00',
  version     BIGINT NOT NULL DEFAULT 0,
  attributes  JSONB NOT NULL DEFAULT '{}',
  priority    INTEGER NOT NULL DEFAULT 0,
  created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
  CONSTRAINT {raw_partitions_name_key} UNIQUE (name),
  CONSTRAINT {raw_partitions_status_check} CHECK (status IN ('available', 'failed', 'complete'))
) WITH (fillfactor = 70)

-- name: create_items
-- available_at doubles as the item's claim lease: a claim pushes it into the future, so other
-- workers skip the item until the claimer reports back or the lease lapses. fillfactor 50:
-- a claim changes no indexed column, so with room on the page for the claimed version it is a
-- HOT update (no index writes); only the completion, which changes status, touches the indexes.
-- Half of each page is that room: at 80, about a third of claims were HOT and each of the rest
-- wrote two index entries (measured in bench/feed.py: 51,000 items/s at 80, 64,000 at 50 on
-- four workers; the heap takes twice the pages). Existing tables keep their setting until
-- `ALTER TABLE … SET (fillfactor = 50)`, which applies to rows written after it.
CREATE TABLE IF NOT EXISTS {items} (
  id           BIGSERIAL PRIMARY KEY,
  partition_id BIGINT NOT NULL REFERENCES {partitions} (id) ON DELETE CASCADE,
  gate         INTEGER NOT NULL DEFAULT 0,
  status       VARCHAR(16) NOT NULL DEFAULT 'available',
  attempts     INTEGER NOT NULL DEFAULT 0,
  available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  data         BYTEA NOT NULL,
  result       TEXT,
  last_error   TEXT,
  version      BIGINT NOT NULL DEFAULT 0,
  created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
  priority     INTEGER NOT NULL DEFAULT 0,
  CONSTRAINT {raw_items_status_check} CHECK (status IN ('available', 'failed', 'complete'))
) WITH (fillfactor = 50)

-- name: add_partitions_priority
-- Added with priorities: tables created before them get the column here (a constant default is
-- a catalogue change in PostgreSQL 11+, no table rewrite). Run only when has_column says it is
-- missing, and before any statement of the migration takes a weaker lock on the table (a lock
-- upgrade inside the migration's transaction could deadlock with a producer's).
ALTER TABLE {partitions} ADD COLUMN IF NOT EXISTS priority INTEGER NOT NULL DEFAULT 0

-- name: add_items_priority
ALTER TABLE {items} ADD COLUMN IF NOT EXISTS priority INTEGER NOT NULL DEFAULT 0

-- name: has_column
-- Asked before adding a column: ALTER TABLE takes an ACCESS EXCLUSIVE lock on the table even when
-- IF NOT EXISTS then finds the column, and every worker and producer migrates when it starts.
SELECT count(*) FROM pg_attribute
WHERE attrelid = to_regclass(%(qualified)s) AND attname = %(column)s AND NOT attisdropped

-- name: index_partitions_free
-- Finding free or expired partitions: a range scan up to now(), oldest lease first. Partial:
-- failed and complete partitions are never in it, however many accumulate.
CREATE INDEX IF NOT EXISTS {raw_partitions_free_idx} ON {partitions} (lease_until, id) WHERE status = 'available'

-- name: index_partitions_owner
-- Renewals, the claim's join and the census all start from "partitions this owner holds";
-- lease_until in the key lets the claim check the lease inside the index.
CREATE INDEX IF NOT EXISTS {raw_partitions_owner_idx} ON {partitions} (owner, lease_until) WHERE status = 'available'

-- name: index_partitions_ready
-- free_partitions, first part: free partitions (never leased, released) highest priority first,
-- oldest first within a priority, read in index order and LIMITed (no sort). Free only (owner IS
-- NULL): the leases workers hold are not in it, so a worker looking for work never steps over
-- them; a partition scheduled for later is (free, lease_until ahead) and is stepped over as an
-- index entry. Expired leases are found through the free index (free_partitions).
CREATE INDEX IF NOT EXISTS {raw_partitions_ready_idx} ON {partitions} (priority DESC, lease_until, id)
WHERE status = 'available' AND owner IS NULL

-- name: index_partitions_scheduled
-- next_due: the first free partition scheduled for later, one probe past now(). Free partitions
-- only (owner IS NULL), so the live leases of held partitions — which also lie ahead — are not
-- stepped over; a take or a release moves a row in or out, a claim never touches it.
CREATE INDEX IF NOT EXISTS {raw_partitions_scheduled_idx} ON {partitions} (lease_until)
WHERE status = 'available' AND owner IS NULL

-- name: index_partitions_status
-- Keyset-paged listings by status.
CREATE INDEX IF NOT EXISTS {raw_partitions_status_idx} ON {partitions} (status, id)

-- name: index_items_open
-- Tables from before priorities had the open index without them, (partition_id, gate, id). Its
-- successor below answers everything it did, so it goes: one index fewer to write per item.
DROP INDEX IF EXISTS {old_items_open_idx}

-- name: index_items_claim
-- The hot path: claimable items of a partition at its gate, highest priority first, then in id
-- order (FIFO). Partial, so finished items leave the index and workers never step over them;
-- also answers "is the gate open" and "what is the next gate" with an index probe.
CREATE INDEX IF NOT EXISTS {raw_items_claim_idx} ON {items} (partition_id, gate, priority DESC, id)
WHERE status = 'available'

-- name: index_items_failed
-- Failed items block their partition: found by retry/resolve and the gate check.
CREATE INDEX IF NOT EXISTS {raw_items_failed_idx} ON {items} (partition_id) WHERE status = 'failed'

-- name: index_items_partition
-- Listings of one partition's finished items (open ones are in the index above). Partial on
-- purpose: an index on (partition_id, id) over all rows would compete with the open index for
-- the claim, and with stale statistics the planner may pick it and step over finished rows.
CREATE INDEX IF NOT EXISTS {raw_items_partition_idx} ON {items} (partition_id, id) WHERE status <> 'available'

-- name: scheduled_at
-- not_before as one instant, computed once per add so a partition and its items agree: an aware
-- `at` as given, or `delay` seconds from the database's now (the clock every lease and backoff
-- is compared with). Bound back into insert_partition / insert_items_at.
SELECT COALESCE(%(at)s::timestamptz, now() + %(delay)s::float8 * interval '1 second')

-- name: insert_partition
-- A unique violation on name means the partition exists (the caller decides what that means).
-- Scheduled (not_before): the partition starts free with its lease_until at that instant, so the
-- free-partition scan (lease_until <= now()) passes over it until then — no column of its own,
-- nothing added to the scan. Unscheduled (NULL): the epoch, like any free partition.
INSERT INTO {partitions} (name, gate, attributes, lease_until, priority)
VALUES (%(name)s, %(gate)s, %(attributes)s::jsonb, COALESCE(%(lease_until)s::timestamptz, '1970-01-01 00:00:00+00'),
        %(priority)s)
RETURNING id

-- name: insert_items
-- One statement per chunk of rows, whatever its size: arrays unnested server-side. One priority
-- for the chunk (the items of one add share it).
INSERT INTO {items} (partition_id, gate, data, priority)
SELECT t.partition_id, t.gate, t.data, %(priority)s
FROM unnest(%(partition_ids)s::bigint[], %(gates)s::int[], %(datas)s::bytea[]) AS t(partition_id, gate, data)

-- name: insert_items_at
-- Items with a not_before: available_at is the column retries and claims already use, so the
-- claim skips them until then (same index, same condition) and status counts them as not ready.
INSERT INTO {items} (partition_id, gate, data, available_at, priority)
SELECT t.partition_id, t.gate, t.data, %(available_at)s::timestamptz, %(priority)s
FROM unnest(%(partition_ids)s::bigint[], %(gates)s::int[], %(datas)s::bytea[]) AS t(partition_id, gate, data)

-- name: lock_partition
-- add_items: lock the partition row for the transaction so the gate check and the inserts are
-- atomic against a concurrent gate advance (which then fails its version check).
SELECT id, status, gate, version FROM {partitions} WHERE name = %(name)s FOR UPDATE

-- name: reopen_partition
-- New items (or retried ones) make a failed partition workable again. Bumping the version voids
-- any gate decision a worker took from a summary read before this change.
UPDATE {partitions} SET status = 'available', version = version + 1, updated_at = now()
WHERE id = %(id)s AND version = %(version)s

-- name: partition_by_name
SELECT id, name, status, gate, owner, lease_until, version, attributes, created_at, updated_at, priority
FROM {partitions} WHERE name = %(name)s

-- name: partitions_page
-- Keyset paging: bounded result sets whatever the table's size.
SELECT id, name, status, gate, owner, lease_until, version, attributes, created_at, updated_at, priority
FROM {partitions} WHERE id > %(after)s ORDER BY id LIMIT %(limit)s

-- name: partitions_page_by_status
SELECT id, name, status, gate, owner, lease_until, version, attributes, created_at, updated_at, priority
FROM {partitions} WHERE status = %(status)s AND id > %(after)s ORDER BY status, id LIMIT %(limit)s

-- name: items_page
-- Open and finished items live in different partial indexes: page through each, then merge.
SELECT * FROM (
  (SELECT id, partition_id, gate, status, attempts, available_at, data, result, last_error, version, created_at,
          updated_at, priority
   FROM {items} WHERE partition_id = %(partition_id)s AND status = 'available' AND id > %(after)s
   ORDER BY id LIMIT %(limit)s)
  UNION ALL
  (SELECT id, partition_id, gate, status, attempts, available_at, data, result, last_error, version, created_at,
          updated_at, priority
   FROM {items} WHERE partition_id = %(partition_id)s AND status <> 'available' AND id > %(after)s
   ORDER BY id LIMIT %(limit)s)
) AS page ORDER BY id LIMIT %(limit)s

-- name: renew
-- Extend every lease this worker still holds, in one statement. A lease another worker took
-- has another owner now and is not touched; `owned` then tells what is still ours. Rows locked
-- right now (another worker taking a lease of ours that lapsed) are skipped, never waited on:
-- such a row is about to be theirs, and waiting is how two workers' writes deadlock.
UPDATE {partitions} SET lease_until = now() + %(lease)s * interval '1 second', version = version + 1
WHERE id IN (
  SELECT id FROM {partitions} WHERE owner = %(owner)s AND status = 'available'
  ORDER BY id
  FOR UPDATE SKIP LOCKED
)

-- name: owned
SELECT id FROM {partitions} WHERE owner = %(owner)s AND status = 'available'

-- name: census
-- What a balance needs, in one round trip (an idle worker's look is this and little else): the
-- live owners — owners of unexpired leases, by the database clock; rows bounded by the number of
-- workers — and, as the row with a NULL owner, the partitions available to work on. Partitions
-- scheduled for later (free, lease_until ahead) are not work yet: counting them would raise every
-- worker's target for partitions nobody can take.
SELECT owner, count(*) FROM {partitions}
WHERE status = 'available' AND owner IS NOT NULL AND lease_until > now()
GROUP BY owner
UNION ALL
SELECT NULL, count(*) FROM {partitions}
WHERE status = 'available' AND (owner IS NOT NULL OR lease_until <= now())

-- name: free_partitions
-- One page of free or expired partitions (never an unbounded list), highest priority first. The
-- version is read so that the take below is optimistic: whoever updates first wins, the others
-- match 0 rows. Two ordered, LIMITed index scans, merged: free partitions by priority (the ready
-- index: held leases are not in it), and expired leases (a dead worker's) through the free index,
-- newest expiry first — read backwards from now() that range holds only expired leases and
-- scheduled partitions come due, never the free ones at the epoch that the first part reads.
-- The final sort is of at most 2 × limit rows.
SELECT id, version, priority FROM (
  (SELECT id, version, priority, lease_until FROM {partitions}
   WHERE status = 'available' AND owner IS NULL AND lease_until <= now()
   ORDER BY priority DESC, lease_until, id LIMIT %(limit)s)
  UNION ALL
  (SELECT id, version, priority, lease_until FROM {partitions}
   WHERE status = 'available' AND owner IS NOT NULL AND lease_until <= now()
     AND lease_until > '1970-01-01 00:00:00+00'
   ORDER BY lease_until DESC, id DESC LIMIT %(limit)s)
) AS free ORDER BY priority DESC, lease_until, id LIMIT %(limit)s

-- name: acquire_lock
-- Not used here: `acquire` locks and takes in one statement (MySQL needs two).
SELECT 1

-- name: acquire
-- Take the free partitions read above, all in one statement. The rows are locked first, in id
-- order and SKIP LOCKED: a partition another worker is taking (or renewing, or releasing) at
-- this moment is simply not ours this time. Never waiting on a row lock means concurrent
-- acquires cannot deadlock; updating in the order of the array we were given could (each
-- worker picks its own random part of the free page). Re-checking version and expiry under the
-- lock guards against a renewal or take that landed between the read and this write.
WITH mine AS (
  SELECT p.id FROM {partitions} AS p
  JOIN unnest(%(ids)s::bigint[], %(versions)s::bigint[]) AS t(id, version)
    ON p.id = t.id AND p.version = t.version
  WHERE p.status = 'available' AND p.lease_until <= now()
  ORDER BY p.id
  FOR UPDATE OF p SKIP LOCKED
)
UPDATE {partitions} AS p
SET owner = %(owner)s, lease_until = now() + %(lease)s * interval '1 second', version = p.version + 1,
    updated_at = now()
FROM mine
WHERE p.id = mine.id

-- name: taken
-- What we now hold among the partitions we tried to take (names and attributes for processors).
SELECT id, name, attributes, gate FROM {partitions}
WHERE id = ANY(%(ids)s) AND owner = %(owner)s AND status = 'available'

-- name: victim_partition
-- Steal from the most loaded owner the partition it took most recently (its newest work is the
-- least likely to have items in flight).
SELECT id, version FROM {partitions}
WHERE owner = %(victim)s AND status = 'available' AND lease_until > now()
ORDER BY id DESC LIMIT 1

-- name: steal
-- Taking a live lease: only if nothing changed since we read it. The victim learns at its next
-- renewal; its items in flight stay protected by their own claim (version + available_at).
UPDATE {partitions}
SET owner = %(owner)s, lease_until = now() + %(lease)s * interval '1 second', version = version + 1,
    updated_at = now()
WHERE id = %(id)s AND version = %(version)s AND status = 'available'

-- name: release
-- Give partitions back (over target, stopping): free at once, no need to wait for expiry.
UPDATE {partitions}
SET owner = NULL, lease_until = '1970-01-01 00:00:00+00', version = version + 1, updated_at = now()
WHERE id = ANY(%(ids)s) AND owner = %(owner)s

-- name: claim
-- The hot path: one statement claims up to `limit` items at the current gate of partitions we
-- hold (lease checked by the database clock). The claim bumps version (completions must match
-- it), counts the attempt and hides the item until available_at, its claim lease. SKIP LOCKED:
-- never queue behind another transaction's row lock. Per partition (LATERAL), items in the claim
-- index's order — highest priority first, then FIFO by id — read in index order and stopped at
-- the limit: the ORDER BY is the index's own, so nothing is sorted, and the partitions are taken
-- one after another instead of sorting every open item we hold.
UPDATE {items} AS i
SET version = i.version + 1, attempts = i.attempts + 1,
    available_at = now() + %(lease)s * interval '1 second'
FROM (
  SELECT c.id FROM {partitions} AS p
  CROSS JOIN LATERAL (
    SELECT o.id FROM {items} AS o
    WHERE o.partition_id = p.id AND o.gate = p.gate AND o.status = 'available' AND o.available_at <= now()
    ORDER BY o.priority DESC, o.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
  ) AS c
  WHERE p.owner = %(owner)s AND p.status = 'available' AND p.lease_until > now()
  LIMIT %(limit)s
) AS picked
WHERE i.id = picked.id
RETURNING i.id, i.partition_id, i.gate, i.data, i.attempts, i.version

-- name: claim_mark
-- Not used here: `claim` marks and returns in one statement (MySQL needs a second one).
SELECT 1

-- name: complete
-- One statement per batch of outcomes, whatever the mix of done/moved/retry/failed. Each row
-- is written only if the item still has the version our claim gave it; a lapsed claim that
-- another worker re-took matches nothing (its result is dropped: at-least-once).
UPDATE {items} AS i
SET status = o.status, gate = o.gate, data = COALESCE(o.data, i.data), attempts = o.attempts,
    available_at = now() + o.delay * interval '1 second', result = COALESCE(o.result, i.result),
    last_error = COALESCE(o.error, i.last_error), version = i.version + 1, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(versions)s::bigint[], %(statuses)s::text[], %(gates)s::int[],
            %(datas)s::bytea[], %(attempts)s::int[], %(delays)s::float8[], %(results)s::text[],
            %(errors)s::text[])
  AS o(id, version, status, gate, data, attempts, delay, result, error)
WHERE i.id = o.id AND i.version = o.version

-- name: complete_done
-- The common case on its own: items finished without new data. Two arrays instead of nine
-- (building the arrays costs the worker more than the database spends on the update).
UPDATE {items} AS i
SET status = 'complete', result = 'done', version = i.version + 1, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(versions)s::bigint[]) AS o(id, version)
WHERE i.id = o.id AND i.version = o.version

-- name: summarize_owned
-- The fan-in facts for partitions we hold, in one snapshot: is anything still open at the
-- gate, has anything failed, and which gate comes next. EXISTS/min are index probes on the
-- partial indexes, never counts of a partition's items.
SELECT p.id, p.version, p.gate,
  EXISTS (SELECT 1 FROM {items} AS i
          WHERE i.partition_id = p.id AND i.gate = p.gate AND i.status = 'available'),
  EXISTS (SELECT 1 FROM {items} AS i WHERE i.partition_id = p.id AND i.status = 'failed'),
  (SELECT min(i.gate) FROM {items} AS i
   WHERE i.partition_id = p.id AND i.status = 'available' AND i.gate > p.gate)
FROM {partitions} AS p
WHERE p.id = ANY(%(ids)s) AND p.owner = %(owner)s AND p.status = 'available'

-- name: summarize
-- The same facts for one partition, whoever holds it (manual checkpoints by the caller).
SELECT p.id, p.version, p.gate,
  EXISTS (SELECT 1 FROM {items} AS i
          WHERE i.partition_id = p.id AND i.gate = p.gate AND i.status = 'available'),
  EXISTS (SELECT 1 FROM {items} AS i WHERE i.partition_id = p.id AND i.status = 'failed'),
  (SELECT min(i.gate) FROM {items} AS i
   WHERE i.partition_id = p.id AND i.status = 'available' AND i.gate > p.gate)
FROM {partitions} AS p
WHERE p.id = %(id)s AND p.status = 'available'

-- name: advance_gate
-- Fan-in checkpoint, only if the partition is exactly as summarised.
UPDATE {partitions} SET gate = %(gate)s, version = version + 1, updated_at = now()
WHERE id = %(id)s AND version = %(version)s AND status = 'available'

-- name: close_partition
-- complete (all items done) or failed (blocked): either way nobody needs to hold it any more.
UPDATE {partitions}
SET status = %(status)s, owner = NULL, lease_until = '1970-01-01 00:00:00+00', version = version + 1,
    updated_at = now()
WHERE id = %(id)s AND version = %(version)s AND status = 'available'

-- name: reopen_failed
-- retry/resolve, step 1 (partitions before items: the same lock order as add_items): partitions
-- with matching failed items become available again, and their version bump voids any stale
-- gate decision.
UPDATE {partitions} SET status = 'available', version = version + 1, updated_at = now()
WHERE status <> 'complete' AND id IN (
  SELECT partition_id FROM {items}
  WHERE status = 'failed' AND (%(partition_id)s::bigint IS NULL OR partition_id = %(partition_id)s)
    AND (%(item_id)s::bigint IS NULL OR id = %(item_id)s)
)

-- name: retry_failed
-- retry, step 2: failed items start their step again with fresh attempts, at once.
UPDATE {items} SET status = 'available', attempts = 0, available_at = now(), version = version + 1,
    updated_at = now()
WHERE status = 'failed' AND (%(partition_id)s::bigint IS NULL OR partition_id = %(partition_id)s)
  AND (%(item_id)s::bigint IS NULL OR id = %(item_id)s)

-- name: resolve_failed
-- resolve, step 2: an operator declares failed items done; `result` records that they were
-- resolved rather than processed.
UPDATE {items} SET status = 'complete', result = 'resolved', version = version + 1, updated_at = now()
WHERE status = 'failed' AND (%(partition_id)s::bigint IS NULL OR partition_id = %(partition_id)s)
  AND (%(item_id)s::bigint IS NULL OR id = %(item_id)s)

-- name: status_partitions
SELECT status, gate, count(*) FROM {partitions} GROUP BY status, gate ORDER BY status, gate LIMIT 200

-- name: status_priorities
-- Open work by priority (few distinct priorities per feed, so few rows): partitions not closed,
-- and items not finished.
SELECT 'partitions', priority, count(*) FROM {partitions} WHERE status = 'available' GROUP BY priority
UNION ALL
SELECT 'items', priority, count(*) FROM {items} WHERE status = 'available' GROUP BY priority
ORDER BY 1, 2 DESC LIMIT 200

-- name: status_items
-- By status and gate: what waits at which gate (few gates per feed, so few rows).
SELECT status, gate, count(*) FROM {items} GROUP BY status, gate ORDER BY status, gate LIMIT 1000

-- name: status_lag
-- Ready = claimable now; the lag is the age of the oldest item not yet finished.
SELECT count(*) FILTER (WHERE available_at <= now()), EXTRACT(EPOCH FROM now() - min(created_at))
FROM {items} WHERE status = 'available'

-- name: status_scheduled
-- Work held back to a time on purpose, with the first due time of each kind: free partitions
-- scheduled for later (not_before: free, lease_until ahead — a range of the scheduled index), and
-- open items never attempted whose available_at lies ahead (not_before, or a retry_in before any
-- failure). A claim counts an attempt, so items in flight and retries backing off are not in it.
-- Two minima, not one LEAST: MySQL's and SQLite's return NULL when either side is NULL.
SELECT
  (SELECT count(*) FROM {partitions} WHERE status = 'available' AND owner IS NULL AND lease_until > now()),
  (SELECT min(lease_until) FROM {partitions} WHERE status = 'available' AND owner IS NULL AND lease_until > now()),
  (SELECT count(*) FROM {items} WHERE status = 'available' AND attempts = 0 AND available_at > now()),
  (SELECT min(available_at) FROM {items} WHERE status = 'available' AND attempts = 0 AND available_at > now())

-- name: status_workers
-- The last column counts the owner's expired leases (a worker that died or lost its database).
SELECT owner, count(*), min(lease_until), max(lease_until), max(lease_until) > now(),
       count(*) FILTER (WHERE lease_until <= now())
FROM {partitions} WHERE status = 'available' AND owner IS NOT NULL
GROUP BY owner ORDER BY owner LIMIT 1000

-- name: notify
-- Wake-ups: run inside the transaction that makes work available (add, add_items, a gate advanced
-- by hand, a lease released, retry/resolve). PostgreSQL delivers a notification only when its
-- transaction commits, and not at all when it rolls back, so a woken worker always finds the work
-- visible. Notifications with the same channel and payload in one transaction are delivered once.
-- pg_notify takes the channel as a bound value: no identifier is pasted into this statement.
SELECT pg_notify(%(channel)s, %(event)s)

-- name: listen
-- A worker's listening connection (a connection of its own, in autocommit, so the LISTEN takes
-- effect at once). LISTEN takes an identifier, not a parameter: {raw_wake_channel} is the channel
-- named from the validated table prefix, quoted by our code.
LISTEN {raw_wake_channel}

-- name: next_due
-- An idle worker sleeps until the first thing that becomes workable without anyone committing
-- (so without a notification): an item open at its gates that is not claimable yet (a retry
-- backing off, a retry_in, a not_before, a lapsed claim of a worker that died), or a free
-- partition scheduled for later (not_before) — or one that came due since the worker last
-- looked for free partitions (`since` seconds ago: it may have come due while the worker was busy,
-- and it must not sleep past it; older ones it has seen, and leaves to others when at its target,
-- so they cannot keep it awake — unless partitions of its own ran out since that look: then it is
-- below the target it left them at, and asks with a `since` of any age). Seconds from now by the database clock (skewed worker clocks do
-- not matter; negative: due already); NULL when there is none (LEAST ignores NULLs). The items
-- part has the claim's join and conditions (our lease too: an item the claim would not take must
-- not count as due, or the worker would wake for nothing until its renewal), over the open
-- index; the partitions part is one probe of the scheduled index.
SELECT EXTRACT(EPOCH FROM LEAST(
  (SELECT min(c.available_at)
   FROM {partitions} AS p
   JOIN {items} AS c ON c.partition_id = p.id AND c.gate = p.gate AND c.status = 'available'
   WHERE p.owner = %(owner)s AND p.status = 'available' AND p.lease_until > now()),
  (SELECT min(s.lease_until) FROM {partitions} AS s
   WHERE s.status = 'available' AND s.owner IS NULL
     AND s.lease_until > now() - %(since)s::float8 * interval '1 second')
) - now())

-- name: create_rates
-- Rate limits (feed/rate.py): one token bucket per row, shared by every worker of the feed. The
-- whole feed's bucket has attribute = '' (and value = ''); the others apply to the partitions
-- whose attributes->>attribute is value. refilled_at is epoch seconds by the database clock: the
-- bucket held `tokens` then. Added with rate limits as a table of its own, so older feeds get it
-- with CREATE TABLE IF NOT EXISTS — no ALTER TABLE of the busy tables, no lock on them.
CREATE TABLE IF NOT EXISTS {rates} (
  attribute       VARCHAR(64) NOT NULL DEFAULT '',
  attribute_value VARCHAR(255) NOT NULL DEFAULT '',
  max_rate        DOUBLE PRECISION NOT NULL,
  burst           DOUBLE PRECISION NOT NULL,
  tokens          DOUBLE PRECISION NOT NULL,
  refilled_at     DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (attribute, attribute_value),
  CONSTRAINT {raw_rates_check} CHECK (max_rate > 0 AND burst >= 1)
)

-- name: rates_list
-- Every limit with the database's now, so the caller can say how full each bucket is (few rows:
-- limits are set by hand). Workers read it at every renewal to learn which limits exist.
SELECT attribute, attribute_value, max_rate, burst, tokens, refilled_at,
       EXTRACT(EPOCH FROM clock_timestamp())::float8
FROM {rates} ORDER BY attribute, attribute_value LIMIT 1000

-- name: rate_lock
-- A take, step 1 (in a transaction with rate_write): lock the bucket and read it with the
-- database's now. clock_timestamp(), not now(): the time after the lock was granted — now() is the
-- transaction's start, before any wait behind another worker's take, and would credit the wait to
-- nobody (rate.refill also ignores a now older than refilled_at).
SELECT tokens, burst, max_rate, refilled_at, EXTRACT(EPOCH FROM clock_timestamp())::float8
FROM {rates} WHERE attribute = %(attribute)s AND attribute_value = %(value)s
FOR UPDATE

-- name: rate_write
-- A take, step 2: the level after the refill and the take, as of `at` (never moved backwards).
UPDATE {rates} SET tokens = %(tokens)s, refilled_at = GREATEST(refilled_at, %(at)s)
WHERE attribute = %(attribute)s AND attribute_value = %(value)s

-- name: rate_give_back
-- Tokens a claim did not use go back into the bucket (never above its burst). One statement:
-- a row lock held only for the update.
UPDATE {rates} SET tokens = LEAST(burst, tokens + %(tokens)s)
WHERE attribute = %(attribute)s AND attribute_value = %(value)s

-- name: rate_insert
-- A new limit starts with a full bucket (its burst): the bound burst + max_rate · T holds from
-- the start.
INSERT INTO {rates} (attribute, attribute_value, max_rate, burst, tokens, refilled_at)
VALUES (%(attribute)s, %(value)s, %(max_rate)s, %(burst)s, %(burst)s, EXTRACT(EPOCH FROM clock_timestamp()))

-- name: rate_update
-- A changed limit (rate_lock first): the bucket keeps its level, refilled at the old rate up to
-- `at`, capped by the new burst.
UPDATE {rates} SET max_rate = %(max_rate)s, burst = %(burst)s, tokens = %(tokens)s,
    refilled_at = GREATEST(refilled_at, %(at)s)
WHERE attribute = %(attribute)s AND attribute_value = %(value)s

-- name: rate_delete
DELETE FROM {rates} WHERE attribute = %(attribute)s AND attribute_value = %(value)s

-- name: claim_in
-- The claim of `claim`, limited to some of our partitions (those sharing a set of rate limits):
-- a worker with rate-limited partitions claims each set up to the tokens it took for it. The same
-- plan as `claim`, with the partitions narrowed by primary key.
UPDATE {items} AS i
SET version = i.version + 1, attempts = i.attempts + 1,
    available_at = now() + %(lease)s * interval '1 second'
FROM (
  SELECT c.id FROM {partitions} AS p
  CROSS JOIN LATERAL (
    SELECT o.id FROM {items} AS o
    WHERE o.partition_id = p.id AND o.gate = p.gate AND o.status = 'available' AND o.available_at <= now()
    ORDER BY o.priority DESC, o.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
  ) AS c
  WHERE p.id = ANY(%(ids)s) AND p.owner = %(owner)s AND p.status = 'available' AND p.lease_until > now()
  LIMIT %(limit)s
) AS picked
WHERE i.id = picked.id
RETURNING i.id, i.partition_id, i.gate, i.data, i.attempts, i.version
