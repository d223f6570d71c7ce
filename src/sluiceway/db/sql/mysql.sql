-- Statements of the database layer itself, not of one part.

-- name: whoami
-- The account statements run as ('user'@'host', as GRANT names it) and the current database
-- (MySQL's schema): named in a refusal's fix.
SELECT CURRENT_USER(), DATABASE()
