"""sluiceway's PySpark Python data sources (``sluice-journal``, ``sluice-kafka``, ``sluice-outbox``,
``sluice-nats``, ``sluice-redis``, ``sluice-postgres-cdc``), and in :mod:`.adapters` one adapter
per kind of pipeline source: what the runner, the operator tools and the CLI ask of it."""
