-- Statements of the database layer itself, not of one part.

-- name: whoami
-- The role statements run as (after any SET ROLE) and the schema an unqualified CREATE TABLE
-- puts a table in (NULL when no schema on the search_path exists): named in a refusal's fix.
SELECT current_user, current_schema()
