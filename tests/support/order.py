"""What a consumer sees: every message of a topic, and the per-key order check."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any


def read_topic(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[tuple[str, int, int]]:
    """(key, seq, partition) of every message of ``topic``, in partition order."""
    return [(key, seq, part) for key, seq, part, _ in read_topic_ids(bootstrap, topic, expected, timeout)]


def read_topic_ids(
    bootstrap: str, topic: str, expected: int, timeout: float = 60
) -> list[tuple[str, int, int, int | None]]:
    """(key, seq, partition, sluice-id) of every message of ``topic``, in partition order."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    from sluiceway.harvest.sequence import sequence_id

    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    parts = list(meta.topics[topic].partitions)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{time.time_ns()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list[tuple[str, int, int, int | None]] = []
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            msgs = consumer.consume(1000, 0.5)
            if msgs:
                quiet_since = time.monotonic()
            for m in msgs:
                if m.error():
                    continue
                seq = json.loads(m.value())["seq"]
                out.append((m.key().decode(), seq, m.partition(), sequence_id(m.headers())))
            if len(out) >= expected and time.monotonic() - quiet_since > 1.0:
                break
    finally:
        consumer.close()
    return out


def check_per_key_order(messages: Iterable[tuple[str, int]], expected: dict[str, int]) -> dict[str, int]:
    """Per key, collapse immediate repeats; the result must be exactly 1..n. Returns duplicate counts."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, seq in messages:
        by_key[key].append(seq)
    dups: dict[str, int] = {}
    assert set(by_key) == set(expected), f"keys missing: {sorted(set(expected) - set(by_key))[:5]}"
    for key, seqs in by_key.items():
        collapsed = [s for i, s in enumerate(seqs) if i == 0 or s != seqs[i - 1]]
        if collapsed != list(range(1, expected[key] + 1)):
            first_bad = next((i for i, s in enumerate(collapsed) if s != i + 1), len(collapsed))
            raise AssertionError(
                f"key {key}: sequence broken at position {first_bad}: "
                f"...{collapsed[max(0, first_bad - 3) : first_bad + 3]} (expected 1..{expected[key]})"
            )
        dups[key] = len(seqs) - len(collapsed)
    return dups


def check_resent_suffixes(messages: Iterable[tuple[str, int]], expected: dict[str, int]) -> int:
    """Per key, each record first appears after its predecessor and a repeat only restarts an
    earlier suffix (1, 2, 3, 2, 3, 4, …): what ``perKeyInFlight`` > 1 allows. Returns re-sends."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, seq in messages:
        by_key[key].append(seq)
    assert set(by_key) == set(expected), f"keys missing: {sorted(set(expected) - set(by_key))[:5]}"
    resent = 0
    for key, seqs in by_key.items():
        bad = next((i for i in range(1, len(seqs)) if seqs[i] > seqs[i - 1] + 1), None)
        if seqs[0] != 1 or bad is not None or max(seqs) != expected[key]:
            at = bad or 0
            raise AssertionError(
                f"key {key}: not 1..{expected[key]} with re-sent suffixes: ...{seqs[max(0, at - 4) : at + 4]}"
            )
        resent += len(seqs) - expected[key]
    return resent


def consume(bootstrap: str, topic: str, n: int, partitions: int = 3) -> list[Any]:
    """At least ``n`` messages of ``topic`` (from its first ``partitions`` partitions), as they are."""
    from confluent_kafka import Consumer, TopicPartition

    from sluiceway.testing import wait_until

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[Any] = []
    try:
        wait_until(
            lambda: got.extend(m for m in consumer.consume(100, 0.2) if not m.error()) or len(got) >= n,
            timeout=20,
            message=f"{n} messages on {topic}",
        )
    finally:
        consumer.close()
    return got
