"""Each sink's own small state beside its Spark checkpoint: progress inside a batch, last error,
records an operator skipped, and the ``step`` budget.

Spark's checkpoint says which micro-batches a sink's query committed (each writer's own offset
in the one log). This file adds what Spark cannot know: how far *inside* an uncommitted batch the
sink got before it stopped, so a replay resumes after the last good record rather than
rewriting the batch; that the last batch was written in full (a replay after a crash between
the write and Spark's commit is then skipped); and the operator's ``skip``/``step`` requests.

Read-modify-write under an exclusive ``flock``, written by rename, so the running pipeline and
the CLI can both update it.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from sluiceway.files import exclusive, write_json


class RunState(StrEnum):
    """How a sink's query ended, or that it is still running (a ``str``: JSON shows the word)."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    PAUSED = "paused"


class SinkHealth(StrEnum):
    """A sink as ``status`` sees it from its checkpoint and state file (a ``str`` likewise)."""

    NEW = "new"
    IN_FLIGHT = "in-flight"
    OK = "ok"
    FAILED = "failed"


@dataclass
class SinkState:
    #: Random id of this checkpoint's life: makes idempotency tokens unique to it.
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    batch: int | None = None
    #: The batch was written in full (a replay of it writes nothing).
    done: bool = False
    #: Progress in ``batch``: every record below ``last``, plus ``rank`` records at ``last``.
    last: int | None = None
    rank: int = 0
    #: The same, per part of ``batch`` written by Spark tasks: {part: [last, rank]}.
    parts: dict[str, list[Any]] = field(default_factory=dict)
    #: Where the last batch's parts were written: [{part, pid, jvm, records}].
    writers: list[dict[str, Any]] = field(default_factory=list)
    #: Offset of the last record written, across batches (for ``status``).
    last_offset: int | None = None
    records: int = 0
    dead_lettered: int = 0
    error: dict[str, Any] | None = None
    skip: list[int] = field(default_factory=list)
    #: Records ``step`` may still write (``None``: no limit — a normal run).
    step: int | None = None

    def failed(self, offset: int | None, message: str, batch: int, *, detail: str | None = None) -> None:
        """Record why the sink stopped: ``message`` is the one line shown; ``detail`` the error's
        whole text where there is more to it (a Python worker's traceback), for ``status --json``."""
        self.error = {
            "offset": offset,
            "batch": batch,
            "message": message[:4000],
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        if detail and detail.strip() != message.strip():
            self.error["detail"] = detail


class StateStore:
    """The state file of one sink: ``<checkpoint>/<sink>/sluice/state.json``."""

    def __init__(self, checkpoint_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(checkpoint_dir) / "sluice"
        self.path = self.dir / "state.json"

    def load(self) -> SinkState:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return SinkState()
        known = {k: v for k, v in data.items() if k in SinkState.__dataclass_fields__}
        return SinkState(**known)

    def save(self, state: SinkState) -> None:
        write_json(self.path, asdict(state))

    @contextlib.contextmanager
    def update(self) -> Iterator[SinkState]:
        """Load, let the block change it, save — all under the state's lock."""
        with exclusive(self.dir / "lock"):
            state = self.load()
            yield state
            self.save(state)
