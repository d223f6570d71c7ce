"""The console's sampler: every ``every`` seconds, the workspace's status, kept as history.

One daemon thread. A sample reads what ``sluice status`` reads (:func:`~sluiceway.overview.collect`)
and records its figures (:mod:`~sluiceway.overview.history.figures`); a part that cannot be read
is kept as such (its health), and a history file that cannot be written is logged, once per
failure streak, without stopping the console.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sluiceway.overview.history.figures import Figures, part_id
from sluiceway.overview.history.store import HistoryError, SqliteHistory
from sluiceway.overview.report import StatusReport
from sluiceway.overview.status import collect
from sluiceway.overview.workspace import Workspace

log = logging.getLogger("sluiceway.ui.history")


def leader_terms(report: StatusReport) -> list[tuple[str, int, str]]:
    """(part, epoch, holder) of each outbox's and capture's leader in ``report``."""
    return [
        (part_id(kind, e.name), e.leader.epoch, e.leader.holder)
        for kind, entries in (("outboxes", report.outboxes), ("captures", report.captures))
        for e in entries
        if e.leader is not None
    ]


class Sampler:
    """Samples ``workspace`` into ``history`` every ``every`` seconds, on a thread of its own."""

    def __init__(
        self,
        workspace: Workspace,
        history: SqliteHistory,
        *,
        every: float = 5.0,
        read: Callable[[Workspace], StatusReport] = collect,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.workspace = workspace
        self.history = history
        self.every = every
        self._read = read
        self._clock = clock
        self._figures = Figures()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def sample(self) -> int:
        """Take one sample now; the number of points kept."""
        report = self._read(self.workspace)
        at = self._clock()
        points = self._figures.take(report, at)
        self.history.record(at, points, leader_terms(report))
        return len(points)

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="sluice-history", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample()
                if self._failing:
                    log.warning("history: samples are kept again")
                self._failing = False
            except HistoryError as exc:
                if not self._failing:
                    log.warning("history: %s (the console goes on; history has a gap)", exc)
                self._failing = True
            self._stop.wait(max(0.0, self.every - (time.monotonic() - started)))
