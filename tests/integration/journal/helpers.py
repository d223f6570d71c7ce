"""Shared helpers for the journal's integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from sluiceway.journal import Journal, Record

REPO = Path(__file__).resolve().parents[3]


def spawn(code: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    """Run ``code`` in a fresh interpreter (the same venv) with ``args`` as ``sys.argv[1:]``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")])
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
