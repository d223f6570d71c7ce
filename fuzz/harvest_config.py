"""Fuzz target: the harvester's ``reaper.yaml`` loader (``HarvestConfig.from_file``).

The input is the file's bytes. Contract: a valid configuration whose derived values
(resolved limits, destination, producer settings, election) can all be computed, or
:class:`~sluiceway.errors.ConfigError` — the loader wraps YAML and pydantic errors into it
(``config/loader.py``), so ``sluice reap`` says one line naming the file and key.
"""

from __future__ import annotations

from fuzz._common import YAML_FINDINGS, as_file
from sluiceway.errors import ConfigError
from sluiceway.harvest.config import HarvestConfig

MAX_LEN = 4096


def fuzz_one(data: bytes) -> None:
    try:
        config = HarvestConfig.from_file(as_file(data))
    except ConfigError:
        return
    harvest = config.harvest
    limits = config.limits
    assert limits.send_buffer >= 1 and limits.per_key_in_flight >= 1
    assert harvest.destination in ("kafka", "journal", "nats", "rabbitmq", "redis")
    assert isinstance(harvest.describe_destination(), str)
    assert isinstance(harvest.producer_config, dict)
    assert harvest.election_kind in ("kafka", "database")
    assert isinstance(harvest.election_name, str) and isinstance(harvest.sequence_headers, bool)
    harvest.dialect  # noqa: B018 - the data source parses (checked when loaded)
    assert isinstance(config.logging.python_level, int)


def seeds() -> dict[str, bytes]:
    return {
        "goharvest": b"""harvest:
  baseKafkaConfig:
    bootstrap.servers: localhost:9092
  producerKafkaConfig:
    compression.type: lz4
  leaderTopic: my-app
  leaderGroupID: my-app
  dataSource: host=localhost port=5432 user=postgres password= dbname=postgres sslmode=disable
  outboxTable: outbox
  limits:
    ioErrorBackoff: 500ms
    pollDuration: 1ms
    minPollInterval: 100ms
    maxPollInterval: 1m30s
    heartbeatTimeout: 5s
    queueTimeout: 30s
    markBackoff: 10ms
    maxInFlightRecords: 1000
    sendConcurrency: 8
    sendBuffer: 10
    markQueryRecords: 100
    minMetricsInterval: 5s
logging:
  level: Info
""",
        "journal": b"""harvest:
  name: shop
  dataSource: sqlite:///app.db
  journal: {path: ./data/journal, segmentBytes: 67108864, fsync: false, epochRegister: epoch}
  election: {kind: database, name: shop, leaseTimeout: 2.5}
  deadLetter: {enabled: true, maxAttempts: 3, permanentErrors: true, parkKey: false}
  metricsAddr: "127.0.0.1:9464"
  limits: {perKeyInFlight: 4}
  sequenceHeaders: true
""",
        "nats": b"""harvest:
  dataSource: postgresql://app:${PGPASSWORD:-secret}@127.0.0.1/app
  target: {type: nats, servers: ["nats://127.0.0.1:4222"], stream: ORDERS}
""",
        "rabbitmq": b"""harvest:
  dataSource: mysql://app@127.0.0.1:3306/app
  outboxTable: shop.outbox
  target: {type: rabbitmq, url: "amqp://guest:guest@127.0.0.1:5672/", exchange: orders}
""",
        "redis": b"""harvest:
  dataSource: sqlite:///app.db
  target: {type: redis, url: "redis://127.0.0.1:6379/0"}
logging: {level: Debug}
""",
        **YAML_FINDINGS,
    }
