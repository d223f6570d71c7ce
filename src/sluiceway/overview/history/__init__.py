"""The console's history: every figure it shows, over time (``GET /api/history``, the charts).

Kept by the console itself in a small SQLite file (:class:`SqliteHistory`, sampled by
:class:`Sampler`), or read from the operator's Prometheus when the workspace names one
(:class:`PrometheusHistory`). :func:`open_history` picks by the workspace.
"""

from __future__ import annotations

from sluiceway.overview.history.figures import SERIES, Series, headline, part_id, split_part
from sluiceway.overview.history.opening import History, open_history
from sluiceway.overview.history.prometheus import PrometheusHistory
from sluiceway.overview.history.sampler import Sampler
from sluiceway.overview.history.store import Chart, HistoryError, Line, SqliteHistory, Term, range_seconds

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
