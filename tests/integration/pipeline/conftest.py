"""Spark fixtures for the pipeline tests: the session's SparkSession with our sources registered."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from sluiceway.journal import Journal


@pytest.fixture(scope="session")
def sluice_spark(spark: Any) -> Any:
    from sluiceway.pipeline import register_sources

    register_sources(spark)
    return spark


def make_journal(
    path: Path | str, records: Iterable[tuple[str, str, bytes | None]], *, per_append: int = 100
) -> int:
    """Append ``(namespace, key, value)`` records; returns the head offset."""
    with Journal.open(path, fsync=False) as j:
        tx = j.append()
        for i, (ns, key, value) in enumerate(records):
            tx.write(key, value, headers=[("i", str(i))], namespace=ns)
            if tx.count >= per_append:
                tx.commit()
                tx = j.append()
        if tx.count:
            tx.commit()
        return j.head


def read_journal(path: Path | str) -> list[tuple[int, str, str, bytes | None]]:
    if not os.path.exists(path):
        return []
    with Journal.open(path, read_only=True) as j:
        return [(r.offset, r.namespace, r.key, r.value) for r in j.read()]
