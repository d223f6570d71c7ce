-- What the operator's views read from an outbox, and the dead-letter actions, for SQLite. See
-- postgres.sql. create_time is ISO-8601 UTC text, as the stasher writes it.

-- name: oldest_rows
SELECT id, create_time, (julianday('now') - julianday(create_time)) * 86400.0, kafka_topic, kafka_key, leader_id,
       kafka_value
FROM {outbox} ORDER BY id LIMIT :limit

-- name: dead_letters
SELECT id, create_time, kafka_topic, kafka_key, error, attempts, dead_time, kafka_value
FROM {dead} ORDER BY id LIMIT :limit

-- name: requeue_dead
-- One transaction with `delete_dead` (see postgres.sql).
INSERT INTO {outbox} (create_time, {raw_payload})
SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), {raw_payload} FROM {dead} WHERE id = :id

-- name: delete_dead
DELETE FROM {dead} WHERE id = :id
