-- Leader leases for SQLite. Times are epoch seconds from SQLite's clock ('now' in UTC).

-- name: create_table
CREATE TABLE IF NOT EXISTS {leases} (
  name        TEXT PRIMARY KEY,
  holder      TEXT,
  epoch       INTEGER NOT NULL DEFAULT 0,
  version     INTEGER NOT NULL DEFAULT 0,
  expires_at  REAL NOT NULL DEFAULT 0
)

-- name: ensure_row
INSERT OR IGNORE INTO {leases} (name) VALUES (:name)

-- name: acquire
-- See postgres.sql. (julianday('now') - 2440587.5) * 86400 is the Unix time, in seconds.
UPDATE {leases}
SET holder = :holder, epoch = epoch + 1, version = version + 1,
    expires_at = (julianday('now') - 2440587.5) * 86400.0 + :ttl
WHERE name = :name AND (holder IS NULL OR expires_at < (julianday('now') - 2440587.5) * 86400.0)

-- name: read
SELECT holder, epoch, version, expires_at - (julianday('now') - 2440587.5) * 86400.0 FROM {leases} WHERE name = :name

-- name: renew
UPDATE {leases}
SET version = version + 1, expires_at = (julianday('now') - 2440587.5) * 86400.0 + :ttl
WHERE name = :name AND holder = :holder AND epoch = :epoch AND version = :version

-- name: release
UPDATE {leases} SET holder = NULL, expires_at = 0, version = version + 1
WHERE name = :name AND holder = :holder AND epoch = :epoch
