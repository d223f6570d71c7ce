-- What the operator's views read from an outbox, for PostgreSQL.
-- {outbox}/{dead} are validated, quoted identifiers.
-- Ages are taken by the database's clock, as `outbox stats` does.

-- name: oldest_rows
-- The head of the backlog, in the order the harvester marks it (id): what is stuck at the front.
SELECT id, create_time, EXTRACT(EPOCH FROM (now() - create_time)), kafka_topic, kafka_key, leader_id, kafka_value
FROM {outbox} ORDER BY id LIMIT %(limit)s

-- name: dead_letters
SELECT id, create_time, kafka_topic, kafka_key, error, attempts, dead_time, kafka_value
FROM {dead} ORDER BY id LIMIT %(limit)s
