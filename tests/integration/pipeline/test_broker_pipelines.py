"""Pipelines to and from NATS JetStream, RabbitMQ and Redis (the servers on this machine).

* journal -> each sink: every record arrives once, in per-key order, with the mapping's key,
  value, headers and tombstones; a second ``--once`` run writes nothing more;
* each source (a JetStream stream, a Redis stream) -> journal sink, ``--once`` twice: the first
  run takes exactly what was there (in bounded micro-batches), the second exactly what came since.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluiceway.brokers import Message, Sender, open_client
from sluiceway.config.brokers import NatsSettings, RedisSettings
from sluiceway.journal import Journal
from sluiceway.pipeline import Pipeline, PipelineSpec
from tests.support.brokers import Place, seqs
from tests.support.order import check_per_key_order

pytestmark = [pytest.mark.spark, pytest.mark.brokers, pytest.mark.timeout(300)]

KEYS = 10


def fill_journal(path: Path, start: int, n: int, expected: dict[str, int]) -> None:
    with Journal.open(path) as journal, journal.append() as tx:
        for i in range(start, start + n):
            key = f"key-{i % KEYS}"
            expected[key] = expected.get(key, 0) + 1
            value = None if i == 3 else json.dumps({"seq": expected[key]}).encode()
            tx.write(key, value, headers=[("n", str(i))], namespace="orders.created")


def run_once(spec: PipelineSpec, spark: Any) -> None:
    runs = Pipeline(spec, spark).run(once=True, handle_signals=False)
    assert all(r.state == "finished" for r in runs.values()), runs


@pytest.mark.parametrize("place", ["nats", "rabbitmq", "redis"], indirect=True)
def test_journal_to_broker_sink(sluice_spark: Any, place: Place, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    expected: dict[str, int] = {}
    fill_journal(journal, 0, 500, expected)
    topic = place.topic("out")
    sink = {k: v for k, v in place.target().items() if k != "type"}
    spec = (
        PipelineSpec.builder("to-broker")
        .source("journal", path=str(journal), max_records_per_batch=200)
        .sink("out", place.broker, topic=topic, **sink)
        .checkpoint(tmp_path / "cp")
        .build()
    )
    run_once(spec, sluice_spark)
    fill_journal(journal, 500, 100, expected)
    run_once(spec, sluice_spark)
    seen = place.read(topic if place.broker != "rabbitmq" else None, expected=600)
    assert len(seen) == 600  # exactly once each across the two runs
    tombstones = [m for m in seen if m[1] is None]
    assert [k for k, _, _ in tombstones] == ["key-3"]  # journal record 3: key-3's first
    assert all(h and h[0][0] == "n" for _, _, h in seen)
    by_key: dict[str, list[int]] = {}
    for key, seq in seqs(seen):
        by_key.setdefault(key, []).append(seq)
    for key, n in expected.items():
        want = [s for s in range(1, n + 1) if not (key == "key-3" and s == 1)]
        assert by_key[key] == want, key  # per-key order, nothing twice


def publish(place: Place, start: int, n: int, expected: dict[str, int]) -> None:
    settings: Any = (
        NatsSettings(servers=[place.url], stream=place.extra["stream"])
        if place.broker == "nats"
        else RedisSettings(url=place.url)
    )
    sender = Sender(open_client(settings), settings)
    errors: list[Any] = []
    for i in range(start, start + n):
        key = f"key-{i % KEYS}"
        expected[key] = expected.get(key, 0) + 1
        value = json.dumps({"seq": expected[key]}).encode()
        sender.submit(
            Message(place.topic("in"), key, value, (("n", str(i)),), f"m{i}"),
            lambda o: errors.append(o) if not hasattr(o, "duplicate") else None,
        )
    assert sender.flush(30) == 0
    sender.close()
    assert not errors


def read_journal(path: Path) -> list[tuple[str, int]]:
    with Journal.open(path, read_only=True) as journal:
        return [(r.key, json.loads(r.value)["seq"]) for r in journal.read(from_offset=0)]


@pytest.mark.parametrize("place", ["nats", "redis"], indirect=True)
def test_broker_source_to_journal(sluice_spark: Any, place: Place, tmp_path: Path) -> None:
    expected: dict[str, int] = {}
    publish(place, 0, 450, expected)
    source: dict[str, Any] = (
        {"servers": [place.url], "stream": place.extra["stream"]}
        if place.broker == "nats"
        else {"url": place.url, "stream": place.topic("in")}
    )
    out = tmp_path / "out"
    spec = (
        PipelineSpec.builder("from-broker")
        .source(place.broker, max_records_per_batch=100, **source)
        .sink("j", "journal", path=str(out))
        .checkpoint(tmp_path / "cp")
        .build()
    )
    run_once(spec, sluice_spark)
    assert len(read_journal(out)) == 450
    publish(place, 450, 120, expected)
    run_once(spec, sluice_spark)
    got = read_journal(out)
    assert len(got) == 570  # exactly what came since: nothing twice, nothing missed
    dups = check_per_key_order(got, expected)
    assert sum(dups.values()) == 0
