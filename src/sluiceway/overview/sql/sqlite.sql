-- What the operator's views read from an outbox, for SQLite. See
-- postgres.sql. create_time is ISO-8601 UTC text, as the stasher writes it.

-- name: oldest_rows
SELECT id, create_time, (julianday('now') - julianday(create_time)) * 86400.0, kafka_topic, kafka_key, leader_id,
       kafka_value
FROM {outbox} ORDER BY id LIMIT :limit

-- name: dead_letters
SELECT id, create_time, kafka_topic, kafka_key, error, attempts, dead_time, kafka_value
FROM {dead} ORDER BY id LIMIT :limit
