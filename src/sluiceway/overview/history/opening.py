"""Which history a workspace has: the console's own, the operator's Prometheus, or none."""

from __future__ import annotations

from typing import Protocol

from sluiceway.overview.history.prometheus import PrometheusHistory
from sluiceway.overview.history.sampler import Sampler
from sluiceway.overview.history.store import Chart, SqliteHistory, Term
from sluiceway.overview.workspace import Workspace


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
