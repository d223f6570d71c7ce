"""Sink writers (journal, kafka, postgres, parquet/json/csv, console, feed, and the brokers: nats,
rabbitmq, redis) and the batch handler."""
