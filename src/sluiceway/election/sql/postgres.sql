-- Leader leases for PostgreSQL. Times are epoch seconds from the database's own clock
-- (clock_timestamp(): real time, not the transaction start), so no host clock decides expiry.

-- name: create_table
CREATE TABLE IF NOT EXISTS {leases} (
  name        VARCHAR(200) PRIMARY KEY,
  holder      VARCHAR(100),
  epoch       BIGINT NOT NULL DEFAULT 0,
  version     BIGINT NOT NULL DEFAULT 0,
  expires_at  DOUBLE PRECISION NOT NULL DEFAULT 0,
  acquired_at DOUBLE PRECISION NOT NULL DEFAULT 0
)

-- name: columns
-- Tables made before acquired_at existed get it on first use (add_acquired_at); a status view
-- reads them as they are (read_v1).
SELECT column_name FROM information_schema.columns
WHERE table_name = %(table)s AND table_schema = COALESCE(%(schema)s, current_schema())

-- name: add_acquired_at
-- When the current holder took the lease (database clock): the age of a leader's term.
ALTER TABLE {leases} ADD COLUMN IF NOT EXISTS acquired_at DOUBLE PRECISION NOT NULL DEFAULT 0

-- name: ensure_row
INSERT INTO {leases} (name) VALUES (%(name)s) ON CONFLICT (name) DO NOTHING

-- name: acquire
-- Take the lease only if nobody holds it or the holder's lease has expired (database clock).
-- The epoch grows on every acquisition: it fences writes of any earlier holder.
UPDATE {leases}
SET holder = %(holder)s, epoch = epoch + 1, version = version + 1,
    expires_at = EXTRACT(EPOCH FROM clock_timestamp()) + %(ttl)s,
    acquired_at = EXTRACT(EPOCH FROM clock_timestamp())
WHERE name = %(name)s AND (holder IS NULL OR expires_at < EXTRACT(EPOCH FROM clock_timestamp()))

-- name: read
-- The last column is the holder's term so far (NULL while the lease is free).
SELECT holder, epoch, version, expires_at - EXTRACT(EPOCH FROM clock_timestamp()),
       CASE WHEN holder IS NULL OR acquired_at = 0 THEN NULL
            ELSE EXTRACT(EPOCH FROM clock_timestamp()) - acquired_at END
FROM {leases} WHERE name = %(name)s

-- name: read_v1
-- A table not yet given acquired_at (no harvester of this version has used it): no term.
SELECT holder, epoch, version, expires_at - EXTRACT(EPOCH FROM clock_timestamp()) FROM {leases} WHERE name = %(name)s

-- name: renew
-- Optimistic concurrency: succeeds only if nobody changed the row since our last write.
UPDATE {leases}
SET version = version + 1, expires_at = EXTRACT(EPOCH FROM clock_timestamp()) + %(ttl)s
WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s AND version = %(version)s

-- name: release
UPDATE {leases} SET holder = NULL, expires_at = 0, version = version + 1
WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s
