-- What the operator's views read from an outbox, for MySQL/MariaDB.
-- See postgres.sql. create_time is UTC (DATETIME(6)), as the stasher writes it.

-- name: oldest_rows
SELECT id, create_time, TIMESTAMPDIFF(MICROSECOND, create_time, UTC_TIMESTAMP(6)) / 1e6, kafka_topic, kafka_key,
       leader_id, kafka_value
FROM {outbox} ORDER BY id LIMIT %(limit)s

-- name: dead_letters
SELECT id, create_time, kafka_topic, kafka_key, error, attempts, dead_time, kafka_value
FROM {dead} ORDER BY id LIMIT %(limit)s
