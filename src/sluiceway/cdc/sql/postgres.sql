-- Change data capture from PostgreSQL: every statement the reader runs that is not built from a
-- table's columns at run time (those are in sluiceway.cdc.postgres, with quoted identifiers).
-- PostgreSQL only: logical decoding has no equivalent in the other dialects.

-- name: server
-- What logical decoding needs of the server and of our role, read once before anything else.
SELECT current_setting('wal_level'),
       current_setting('server_encoding'),
       current_user,
       (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user),
       current_database(),
       current_setting('server_version_num')::int;

-- name: session
-- The text forms of values that the JSON mapping relies on (sluiceway.cdc.values), and commits
-- that flush: a watermark must be on disk before anyone can decode past it.
SET TimeZone = 'UTC';
SET DateStyle = 'ISO, YMD';
SET IntervalStyle = 'postgres';
SET extra_float_digits = 1;
SET bytea_output = 'hex';
SET synchronous_commit = 'on';

-- name: tables
-- Every ordinary or partitioned table, as schema.table: matched against a configured pattern.
SELECT n.nspname || '.' || c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg\_toast%'
  AND n.nspname NOT LIKE 'pg\_temp%'
ORDER BY 1;

-- name: table
-- One configured table by name (to_regclass parses it as SQL would; NULL when there is none):
-- its catalog name, replica identity and whether we may read it.
SELECT c.oid, n.nspname, c.relname, c.relreplident, has_table_privilege(c.oid, 'SELECT')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass(%(name)s);

-- name: columns
-- A table's columns in attribute order, as pgoutput sends them: dropped and generated columns
-- are not replicated, so the copy leaves them out too.
SELECT a.attname, a.atttypid::int
FROM pg_attribute a
WHERE a.attrelid = %(oid)s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum;

-- name: primary_key
-- The primary key's columns in key order (what a record's key is made of, and the copy's order).
SELECT a.attname
FROM pg_index i
JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %(oid)s AND i.indisprimary
ORDER BY k.ord;

-- name: types
-- pg_type rows for the JSON mapping: domains resolve to their base, arrays to their element.
SELECT oid::int, typtype, typcategory, typelem::int, typdelim, typbasetype::int
FROM pg_type WHERE oid = ANY(%(oids)s);

-- name: publication
-- Whether the publication exists and which operations it publishes.
SELECT pubinsert, pubupdate, pubdelete, pubtruncate, puballtables
FROM pg_publication WHERE pubname = %(name)s;

-- name: publication_tables
-- The tables a publication covers, by catalog name.
SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = %(name)s;

-- name: slot
-- A replication slot's kind, owner database, and how much WAL it holds back.
SELECT plugin, slot_type, database,
       (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint,
       (restart_lsn - '0/0'::pg_lsn)::bigint,
       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint,
       active_pid
FROM pg_replication_slots WHERE slot_name = %(slot)s;

-- name: create_slot
-- A logical slot for pgoutput; it keeps every change from now on until it is advanced.
SELECT (lsn - '0/0'::pg_lsn)::bigint FROM pg_create_logical_replication_slot(%(slot)s, 'pgoutput');

-- name: drop_slot
-- Releases the WAL the slot held. Fails while a session is using it.
SELECT pg_drop_replication_slot(%(slot)s);

-- name: emit
-- A watermark: a non-transactional logical message (its position in the stream is its own LSN).
-- pg_current_xact_id() gives the statement a transaction whose commit flushes the WAL up to the
-- message (synchronous_commit is on in our sessions), so decoding can reach it at once.
SELECT (pg_logical_emit_message(false, %(prefix)s, %(content)s) - '0/0'::pg_lsn)::bigint, pg_current_xact_id();

-- name: snapshot
-- The snapshot a chunk is read in (first statement of its REPEATABLE READ transaction, so the
-- chunk's SELECT uses exactly this one): which transactions its rows already reflect.
SELECT pg_current_snapshot()::text, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;

-- name: chunk_transaction
-- A chunk's transaction, set before its first statement: REPEATABLE READ so the snapshot query
-- and the chunk's SELECT see the same snapshot; READ ONLY, as a copy never writes.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY;

-- name: table_size
-- A table without a key is copied by ranges of heap pages: its size in pages (at least one) and
-- the planner's row estimate, to size a chunk's page range.
SELECT greatest(pg_relation_size(%(oid)s::oid) / current_setting('block_size')::int, 1),
       greatest(reltuples, 0)
FROM pg_class WHERE oid = %(oid)s::oid;

-- name: local_socket
-- Where the server listens on this host (its first Unix socket directory, and its port): the
-- replication connection's DSN when the capture is told to use the socket.
SELECT current_setting('unix_socket_directories'), current_setting('port')::int;

-- name: publication_owned
-- Whether this role may alter the publication: it owns it, or is a member of its owner (a
-- superuser is a member of every role).
SELECT pg_has_role(current_user, pubowner, 'USAGE') FROM pg_publication WHERE pubname = %(name)s;

-- name: may_create_publication
-- CREATE PUBLICATION needs CREATE on the database (and, FOR TABLE, ownership of each table:
-- not_owned).
SELECT has_database_privilege(current_database(), 'CREATE');

-- name: not_owned
-- Which of these tables this role does not own (nor is a member of the owner of): CREATE
-- PUBLICATION … FOR TABLE and ALTER PUBLICATION … ADD TABLE need their owner.
SELECT n.nspname || '.' || c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = ANY(%(oids)s) AND NOT pg_has_role(current_user, c.relowner, 'USAGE')
ORDER BY 1;
