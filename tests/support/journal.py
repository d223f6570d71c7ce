"""Journals in tests: appends in one line, journals filled with records, other processes on them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

from sluiceway.journal import Journal, Record
from tests.support import ROOT


def spawn(code: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    """Run ``code`` in a fresh interpreter (the same venv) with ``args`` as ``sys.argv[1:]``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kwargs,
    )


def append(j: Journal, *records: tuple[str, bytes | None], **kwargs: object) -> range:
    with j.append(**kwargs) as tx:  # type: ignore[arg-type]
        for key, value in records:
            tx.write(key, value)
    return tx.offsets


def fill(j: Journal, n: int, *, per_append: int = 1, size: int = 50, prefix: str = "k") -> None:
    for start in range(0, n, per_append):
        with j.append() as tx:
            for i in range(start, min(n, start + per_append)):
                tx.write(f"{prefix}{i}", i.to_bytes(4, "big") * (size // 4))


def keys(records: list[Record]) -> list[str]:
    return [r.key for r in records]


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
