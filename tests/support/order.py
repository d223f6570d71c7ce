"""What a consumer sees: every message of a topic, and the per-key order check."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable


def read_topic(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[tuple[str, int, int]]:
    """(key, seq, partition) of every message of ``topic``, in partition order."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    parts = list(meta.topics[topic].partitions)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{time.time_ns()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list[tuple[str, int, int]] = []
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
                out.append((m.key().decode(), json.loads(m.value())["seq"], m.partition()))
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
