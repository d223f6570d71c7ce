-- Leader leases for SQLite. Times are epoch seconds from SQLite's clock ('now' in UTC).

-- name: create_table
CREATE TABLE IF NOT EXISTS {leases} (
  name        TEXT PRIMARY KEY,
  holder      TEXT,
  epoch       INTEGER NOT NULL DEFAULT 0,
  version     INTEGER NOT NULL DEFAULT 0,
  expires_at  REAL NOT NULL DEFAULT 0,
  acquired_at REAL NOT NULL DEFAULT 0
)

-- name: columns
-- See postgres.sql (SQLite ignores the unused :schema parameter).
SELECT name FROM pragma_table_info(:table)

-- name: add_acquired_at
-- No IF NOT EXISTS for columns here: the caller checks `columns` first, and re-checks if it lost a race.
ALTER TABLE {leases} ADD COLUMN acquired_at REAL NOT NULL DEFAULT 0

-- name: ensure_row
INSERT OR IGNORE INTO {leases} (name) VALUES (:name)

-- name: acquire
-- See postgres.sql. (julianday('now') - 2440587.5) * 86400 is the Unix time, in seconds.
UPDATE {leases}
SET holder = :holder, epoch = epoch + 1, version = version + 1,
    expires_at = (julianday('now') - 2440587.5) * 86400.0 + :ttl,
    acquired_at = (julianday('now') - 2440587.5) * 86400.0
WHERE name = :name AND (holder IS NULL OR expires_at < (julianday('now') - 2440587.5) * 86400.0)

-- name: read
-- The last column is the holder's term so far (NULL while the lease is free).
SELECT holder, epoch, version, expires_at - (julianday('now') - 2440587.5) * 86400.0,
       CASE WHEN holder IS NULL OR acquired_at = 0 THEN NULL
            ELSE (julianday('now') - 2440587.5) * 86400.0 - acquired_at END
FROM {leases} WHERE name = :name

-- name: read_v1
SELECT holder, epoch, version, expires_at - (julianday('now') - 2440587.5) * 86400.0 FROM {leases} WHERE name = :name

-- name: renew
UPDATE {leases}
SET version = version + 1, expires_at = (julianday('now') - 2440587.5) * 86400.0 + :ttl
WHERE name = :name AND holder = :holder AND epoch = :epoch AND version = :version

-- name: release
UPDATE {leases} SET holder = NULL, expires_at = 0, version = version + 1
WHERE name = :name AND holder = :holder AND epoch = :epoch
