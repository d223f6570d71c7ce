-- Statements of the database layer itself, not of one part.

-- name: whoami
-- SQLite has no roles: the file's permissions decide. Its one schema is "main".
SELECT NULL, 'main'
