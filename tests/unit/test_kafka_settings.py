"""One rule for librdkafka settings wherever a Kafka client is configured.

A pipeline Kafka sink refused ``message.timeout.ms: 5000`` ("Input should be a valid string") while
the harvester took it as the number 5000: the same YAML now loads the same way in the harvester's
``reaper.yaml``, a ``capture.yaml`` and a pipeline's Kafka source and sink, as librdkafka's text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sluiceway.capture import CaptureConfig
from sluiceway.errors import ConfigError
from sluiceway.harvest import HarvestConfig
from sluiceway.pipeline import PipelineSpec

SETTINGS_YAML = """\
bootstrap.servers: 127.0.0.1:9092
message.timeout.ms: 5000
enable.idempotence: true
socket.keepalive.enable: false
batch.size: 16384.0
queue.buffering.backoff.ms: 0.5
compression.type: lz4
"""
#: What librdkafka is given for them.
AS_TEXT = {
    "bootstrap.servers": "127.0.0.1:9092",
    "message.timeout.ms": "5000",
    "enable.idempotence": "true",
    "socket.keepalive.enable": "false",
    "batch.size": "16384",
    "queue.buffering.backoff.ms": "0.5",
    "compression.type": "lz4",
}


def _harvester(settings: Any) -> dict[str, str]:
    config = HarvestConfig.from_dict(
        {"harvest": {"baseKafkaConfig": settings, "producerKafkaConfig": settings}}
    )
    assert config.harvest.producer_kafka_config == config.harvest.base_kafka_config
    return dict(config.harvest.base_kafka_config)


def _capture(settings: Any) -> dict[str, str]:
    section = {"dsn": "postgresql://127.0.0.1/app", "tables": ["public.t"], "slot": "s", "publication": "p"}
    config = CaptureConfig.from_dict({"capture": {**section, "kafka": settings}})
    assert config.capture.kafka is not None
    return dict(config.capture.kafka)


def _pipeline(settings: Any, place: str) -> dict[str, str]:
    kafka = {"config": settings}
    spec = PipelineSpec.from_dict(
        {
            "pipeline": {
                "name": "p",
                "source": {"type": "kafka", "topic": "in", **kafka}
                if place == "source"
                else {"type": "journal", "path": "./j"},
                "sinks": [
                    {"name": "out", "type": "kafka", **kafka}
                    if place == "sink"
                    else {
                        "name": "out",
                        "type": "console",
                    }
                ],
                "checkpoint": "./cp",
            }
        },
        source="p.yaml",
        env={},
    )
    holder = spec.source if place == "source" else spec.sinks[0]
    return dict(holder.config)  # type: ignore[union-attr]


LOADERS = {
    "harvester": _harvester,
    "capture": _capture,
    "pipeline source": lambda s: _pipeline(s, "source"),
    "pipeline sink": lambda s: _pipeline(s, "sink"),
}


@pytest.mark.parametrize("where", LOADERS)
def test_numbers_and_booleans_load_as_the_text_librdkafka_takes(where: str) -> None:
    assert LOADERS[where](yaml.safe_load(SETTINGS_YAML)) == AS_TEXT


@pytest.mark.parametrize("where", LOADERS)
@pytest.mark.parametrize(("value", "shown"), [(None, "nothing"), ([1, 2], "a list"), ({"a": 1}, "a dict")])
def test_a_value_librdkafka_cannot_take_is_refused_naming_the_setting(
    where: str, value: Any, shown: str
) -> None:
    settings = {"bootstrap.servers": "127.0.0.1:9092", "linger.ms": value}
    with pytest.raises(ConfigError, match=rf"linger\.ms: expected text, a number or true/false, got {shown}"):
        LOADERS[where](settings)


def test_the_harvesters_gapless_check_reads_the_text(tmp_path: Path) -> None:
    # perKeyInFlight > 1 wants message.timeout.ms 0 and idempotence on: given as YAML's 0 and true
    # they are what it wants; false is refused.
    base = {"baseKafkaConfig": {"bootstrap.servers": "b:9092"}, "limits": {"perKeyInFlight": 4}}
    fine = {"message.timeout.ms": 0, "enable.idempotence": True, "enable.gapless.guarantee": True}
    HarvestConfig.from_dict({"harvest": {**base, "producerKafkaConfig": fine}})
    with pytest.raises(ConfigError, match=r"needs the producer setting enable\.idempotence=true"):
        HarvestConfig.from_dict({"harvest": {**base, "producerKafkaConfig": {"enable.idempotence": False}}})
