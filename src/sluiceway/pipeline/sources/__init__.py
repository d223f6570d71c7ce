"""sluiceway's PySpark Python data sources: ``sluice-journal``, ``sluice-kafka``, ``sluice-outbox``."""
