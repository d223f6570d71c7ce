"""Fuzz target: the pipeline spec loader (``PipelineSpec.from_yaml``).

The input is the spec file's bytes. Contract: a valid spec, or
:class:`~sluiceway.pipeline.errors.SpecError` naming the file and field (the loader wraps YAML
and pydantic errors into it, ``pipeline/spec.py``).
"""

from __future__ import annotations

from fuzz._common import YAML_FINDINGS, as_file
from sluiceway.pipeline.errors import SpecError
from sluiceway.pipeline.spec import PipelineSpec

MAX_LEN = 4096


def fuzz_one(data: bytes) -> None:
    try:
        spec = PipelineSpec.from_yaml(as_file(data))
    except SpecError:
        return
    assert spec.sinks and len({s.name for s in spec.sinks}) == len(spec.sinks)
    for sink in spec.sinks:
        assert spec.sink(sink.name) is sink
        spec.checkpoint_dir(sink.name)


def seeds() -> dict[str, bytes]:
    return {
        "journal-to-many": rb"""pipeline:
  name: orders
  source: {type: journal, path: ./data/journal}
  namespace: "^orders\\."
  transforms:
    - python: myapp.transforms:enrich
    - sql: "SELECT *, upper(key) AS k2 FROM input"
  sinks:
    - {name: lake, type: parquet, path: ./data/lake, namespace: "^orders\\.created$"}
    - {name: bus, type: kafka, topic: orders-out, config: {bootstrap.servers: "${KAFKA:-localhost:9092}"}}
    - {name: db, type: postgres, dsn: "host=127.0.0.1 dbname=app", table: orders_view, key: key}
  checkpoint: ./data/checkpoints
  trigger: {interval: 1s}
""",
        "cdc": rb"""pipeline:
  name: shop
  source:
    type: postgres-cdc
    dsn: postgresql://app@127.0.0.1/app
    tables: [public.orders, public.customers]
    slot: shop_orders
    publication: shop_orders
    snapshot: initial
  sinks:
    - name: mirror
      type: postgres
      dsn: "postgresql://app@127.0.0.1/app"
      table: shop_mirror
      key: [namespace, key]
    - {name: lake, type: parquet, path: ./data/shop}
  checkpoint: ./data/checkpoints/shop
""",
        "brokers": rb"""pipeline:
  name: relay
  source: {type: nats, servers: ["nats://127.0.0.1:4222"], stream: ORDERS, max_records_per_batch: 50000}
  sinks:
    - {name: cache, type: redis, url: "redis://127.0.0.1:6379/0", topic: orders}
    - {name: bus, type: rabbitmq, url: "amqp://guest:guest@127.0.0.1:5672/", exchange: orders}
  checkpoint: ./data/checkpoints/relay
""",
        "outbox-feed": rb"""name: work
source: {type: outbox, dsn: "sqlite:///app.db", table: outbox}
sinks:
  - name: items
    type: feed
    dsn: sqlite:///work.db
    retry: {attempts: 5, backoff: 1s, max_backoff: 1m, record_attempts: 1, outage: 10m}
checkpoint: ./data/checkpoints/work
spark: {spark.sql.shuffle.partitions: "2"}
""",
        "kafka-redis": rb"""pipeline:
  name: k2r
  source: {type: kafka, topic: [a, b], config: {bootstrap.servers: "localhost:9092"}, dedup: true}
  sinks: [{name: out, type: json, path: ./out}, {name: c, type: console}, {name: j, type: journal, path: ./j}]
  checkpoint: ./cp
""",
        **YAML_FINDINGS,
    }
