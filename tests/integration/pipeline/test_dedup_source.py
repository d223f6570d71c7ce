"""``dedup: true`` on a Kafka source under Spark: re-sent records dropped, per key, across batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from sluiceway.pipeline import Pipeline, PipelineSpec
from sluiceway.testing import Broker
from tests.support.journal import read_journal

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def produce(bootstrap: str, topic: str, records: list[tuple[str, int]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, sid in records:
        producer.produce(topic, key=key, value=str(sid).encode(), headers=[("sluice-id", str(sid))])
    assert producer.flush(30) == 0


def test_kafka_source_dedup_drops_re_sent_suffixes(
    sluice_spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    spec = PipelineSpec.from_dict(
        {
            "pipeline": {
                "name": "dedup",
                "source": {
                    "type": "kafka",
                    "topic": topic,
                    "config": {"bootstrap.servers": kafka.bootstrap},
                    "dedup": True,
                },
                "sinks": [{"name": "copy", "type": "journal", "path": str(tmp_path / "copy")}],
                "checkpoint": str(tmp_path / "cp"),
            }
        }
    )
    produce(kafka.bootstrap, topic, [("a", 1), ("a", 2), ("a", 3), ("b", 10), ("a", 2), ("a", 3), ("b", 10)])
    assert Pipeline(spec, sluice_spark).run(once=True, handle_signals=False)["copy"].state == "finished"
    produce(kafka.bootstrap, topic, [("a", 3), ("a", 4), ("b", 11)])  # the state carries over
    assert Pipeline(spec, sluice_spark).run(once=True, handle_signals=False)["copy"].state == "finished"
    got: dict[str, list[int]] = {}
    for _, _, key, value in read_journal(tmp_path / "copy"):
        got.setdefault(key, []).append(int(value or b"0"))
    assert got == {"a": [1, 2, 3, 4], "b": [10, 11]}
