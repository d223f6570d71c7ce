"""Kafka sink: produce in order, wait for every ack before the batch counts as written."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sluiceway.pipeline.sources.kafka import produce_table


class KafkaSink:
    def __init__(self, topic: str | None, config: dict[str, str]) -> None:
        self.topic = topic
        # Idempotent producer by default: broker-side retries cannot reorder or duplicate a key.
        self.config = {"enable.idempotence": "true", "linger.ms": "5", **config}
        self._producer: Any = None

    def write(self, table: pa.Table, token: str) -> None:
        if self._producer is None:
            from confluent_kafka import Producer

            self._producer = Producer(self.config)
        try:
            produce_table(self._producer, table, self.topic)
        except BaseException:
            self.close()  # a fresh producer after a failure: no stale queue, no fatal idempotence state
            raise

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None
