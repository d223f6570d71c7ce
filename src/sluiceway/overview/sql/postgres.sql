-- What the operator's views read from an outbox, and the dead-letter actions, for PostgreSQL.
-- {outbox}/{dead} are validated, quoted identifiers; {raw_payload} is the outbox's own column
-- list after create_time (kafka_topic … kafka_header_values, and kafka_partition if present).
-- Ages are taken by the database's clock, as `outbox stats` does.

-- name: oldest_rows
-- The head of the backlog, in the order the harvester marks it (id): what is stuck at the front.
SELECT id, create_time, EXTRACT(EPOCH FROM (now() - create_time)), kafka_topic, kafka_key, leader_id, kafka_value
FROM {outbox} ORDER BY id LIMIT %(limit)s

-- name: dead_letters
SELECT id, create_time, kafka_topic, kafka_key, error, attempts, dead_time, kafka_value
FROM {dead} ORDER BY id LIMIT %(limit)s

-- name: requeue_dead
-- Retry: the dead letter becomes a new outbox row (a new id, so it goes out after its key's
-- current backlog); runs in one transaction with `delete_dead`, so it is never both or neither.
INSERT INTO {outbox} (create_time, {raw_payload})
SELECT now(), {raw_payload} FROM {dead} WHERE id = %(id)s

-- name: delete_dead
-- Resolve (and the second half of a retry): the operator has dealt with it.
DELETE FROM {dead} WHERE id = %(id)s
