-- Leader leases for PostgreSQL. Times are epoch seconds from the database's own clock
-- (clock_timestamp(): real time, not the transaction start), so no host clock decides expiry.

-- name: create_table
CREATE TABLE IF NOT EXISTS {leases} (
  name        VARCHAR(200) PRIMARY KEY,
  holder      VARCHAR(100),
  epoch       BIGINT NOT NULL DEFAULT 0,
  version     BIGINT NOT NULL DEFAULT 0,
  expires_at  DOUBLE PRECISION NOT NULL DEFAULT 0
)

-- name: ensure_row
INSERT INTO {leases} (name) VALUES (%(name)s) ON CONFLICT (name) DO NOTHING

-- name: acquire
-- Take the lease only if nobody holds it or the holder's lease has expired (database clock).
-- The epoch grows on every acquisition: it fences writes of any earlier holder.
UPDATE {leases}
SET holder = %(holder)s, epoch = epoch + 1, version = version + 1,
    expires_at = EXTRACT(EPOCH FROM clock_timestamp()) + %(ttl)s
WHERE name = %(name)s AND (holder IS NULL OR expires_at < EXTRACT(EPOCH FROM clock_timestamp()))

-- name: read
SELECT holder, epoch, version, expires_at - EXTRACT(EPOCH FROM clock_timestamp()) FROM {leases} WHERE name = %(name)s

-- name: renew
-- Optimistic concurrency: succeeds only if nobody changed the row since our last write.
UPDATE {leases}
SET version = version + 1, expires_at = EXTRACT(EPOCH FROM clock_timestamp()) + %(ttl)s
WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s AND version = %(version)s

-- name: release
UPDATE {leases} SET holder = NULL, expires_at = 0, version = version + 1
WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s
