-- Leader leases for MySQL/MariaDB. Times are epoch seconds from the server's clock.

-- name: create_table
CREATE TABLE IF NOT EXISTS {leases} (
  name        VARCHAR(200) NOT NULL PRIMARY KEY,
  holder      VARCHAR(100) NULL,
  epoch       BIGINT NOT NULL DEFAULT 0,
  version     BIGINT NOT NULL DEFAULT 0,
  expires_at  DOUBLE NOT NULL DEFAULT 0,
  acquired_at DOUBLE NOT NULL DEFAULT 0
) ENGINE = InnoDB

-- name: columns
-- See postgres.sql.
SELECT column_name FROM information_schema.columns
WHERE table_name = %(table)s AND table_schema = COALESCE(%(schema)s, DATABASE())

-- name: add_acquired_at
-- MySQL has no ADD COLUMN IF NOT EXISTS (MariaDB has): the caller checks `columns` first, and
-- re-checks if another process added it at the same moment.
ALTER TABLE {leases} ADD COLUMN acquired_at DOUBLE NOT NULL DEFAULT 0

-- name: ensure_row
INSERT IGNORE INTO {leases} (name) VALUES (%(name)s)

-- name: acquire
UPDATE {leases}
SET holder = %(holder)s, epoch = epoch + 1, version = version + 1,
    expires_at = UNIX_TIMESTAMP(SYSDATE(6)) + %(ttl)s, acquired_at = UNIX_TIMESTAMP(SYSDATE(6))
WHERE name = %(name)s AND (holder IS NULL OR expires_at < UNIX_TIMESTAMP(SYSDATE(6)))

-- name: read
-- The last column is the holder's term so far (NULL while the lease is free).
SELECT holder, epoch, version, expires_at - UNIX_TIMESTAMP(SYSDATE(6)),
       CASE WHEN holder IS NULL OR acquired_at = 0 THEN NULL
            ELSE UNIX_TIMESTAMP(SYSDATE(6)) - acquired_at END
FROM {leases} WHERE name = %(name)s

-- name: read_v1
SELECT holder, epoch, version, expires_at - UNIX_TIMESTAMP(SYSDATE(6)) FROM {leases} WHERE name = %(name)s

-- name: renew
UPDATE {leases}
SET version = version + 1, expires_at = UNIX_TIMESTAMP(SYSDATE(6)) + %(ttl)s
WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s AND version = %(version)s

-- name: release
UPDATE {leases} SET holder = NULL, expires_at = 0, version = version + 1
WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s
