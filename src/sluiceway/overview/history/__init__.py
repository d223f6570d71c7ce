"""The console's history: every figure it shows, over time (``GET /api/history``, the charts).

Kept by the console itself in a small SQLite file (:class:`SqliteHistory`, sampled by
:class:`Sampler`), or read from the operator's Prometheus when the workspace names one
(:class:`PrometheusHistory`). :func:`open_history` picks by the workspace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from sluiceway.overview.history.figures import SERIES, Series, headline, part_id, split_part
from sluiceway.overview.history.prometheus import PrometheusHistory
from sluiceway.overview.history.sampler import Sampler
from sluiceway.overview.history.store import Chart, HistoryError, Line, SqliteHistory, Term, range_seconds

if TYPE_CHECKING:
    from sluiceway.overview.workspace import Workspace

__all__ = [
    "SERIES",
    "Chart",
    "History",
    "HistoryError",
    "Line",
    "PrometheusHistory",
    "Sampler",
    "Series",
    "SqliteHistory",
    "Term",
    "headline",
    "open_history",
    "part_id",
    "range_seconds",
    "split_part",
]


class History(Protocol):
    """What the console reads history through."""

    source: str

    def read(self, part: str, span: float, *, only: list[str] | None = None) -> Chart: ...

    def trouble_since(self, part: str) -> float | None: ...

    def terms(self, part: str, limit: int = 20) -> list[Term]: ...

    def close(self) -> None: ...


def open_history(workspace: Workspace) -> tuple[History | None, Sampler | None]:
    """The workspace's history and, when the console keeps it itself, the sampler to start
    (``(None, None)``: history is off, or the workspace was made in code without a file)."""
    if workspace.prometheus is not None:
        p = workspace.prometheus
        return PrometheusHistory(p.url, workspace, timeout=p.timeout), None
    h = workspace.history
    if not h.enabled or h.path is None:
        return None, None
    store = SqliteHistory(h.path, retention=h.retention, detail=h.detail, every=h.every)
    return store, Sampler(workspace, store, every=h.every)
