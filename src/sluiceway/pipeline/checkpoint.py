"""Reading a sink's Spark checkpoint without Spark: its last committed and last planned batch.

``offsets/<n>`` holds the source offset batch ``n`` was planned to read up to, ``commits/<n>``
marks it done. Both the operator tools (status, lag) and the source adapters (the outbox's purge
at the end of a run) read it, so it lives below both.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Checkpoint:
    committed_batch: int | None
    committed: dict[str, Any] | None
    planned_batch: int | None
    planned: dict[str, Any] | None


def _numbered(path: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit())
    except FileNotFoundError:
        return []


def _offset_of(path: Path) -> dict[str, Any] | None:
    """The source offset in one ``offsets/<n>`` file: ``v1``, metadata, then one line per source."""
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    except FileNotFoundError:
        return None
    if len(lines) < 3 or lines[-1] == "-":
        return None
    value = json.loads(lines[-1])
    return value if isinstance(value, dict) else None


def read_checkpoint(directory: str | os.PathLike[str]) -> Checkpoint:
    d = Path(directory)
    commits = _numbered(d / "commits")
    offsets = _numbered(d / "offsets")
    cb = commits[-1] if commits else None
    pb = offsets[-1] if offsets else None
    return Checkpoint(
        cb,
        _offset_of(d / "offsets" / str(cb)) if cb is not None else None,
        pb,
        _offset_of(d / "offsets" / str(pb)) if pb is not None else None,
    )
