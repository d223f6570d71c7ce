"""The console's own history: a small SQLite file (beside the workspace file by default).

Two tiers, as round-robin databases keep them: every sample for ``detail`` (6 h by default), and
per minute (mean and peak) for ``retention`` (7 days). A range within the detail reads the samples;
a longer one reads the minutes. Either is bucketed to at most :data:`MAX_POINTS` per series, so
a week is as cheap to draw as a quarter of an hour. Older rows are deleted once a minute, so the
file stays bounded: about 20 parts, 7 series each, 10,080 minutes.

Leader terms (which holder took which epoch, first seen when) are kept until the retention has
passed since they were last seen (a term held for a month stays): a capture's page lists them.

One connection, guarded by a lock: the sampler's thread writes, the console's request threads read.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sluiceway.clock import duration_seconds
from sluiceway.errors import SluicewayError
from sluiceway.overview.history.figures import HEALTH, Point, Series, series_of, split_part

#: The most points a series is drawn with, whatever the range.
MAX_POINTS = 600

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sample (
  part TEXT NOT NULL, series TEXT NOT NULL, at REAL NOT NULL, value REAL NOT NULL,
  PRIMARY KEY (part, series, at)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS minute (
  part TEXT NOT NULL, series TEXT NOT NULL, at INTEGER NOT NULL,
  total REAL NOT NULL, n INTEGER NOT NULL, peak REAL NOT NULL,
  PRIMARY KEY (part, series, at)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS term (
  part TEXT NOT NULL, epoch INTEGER NOT NULL, holder TEXT NOT NULL, at REAL NOT NULL, last REAL NOT NULL,
  PRIMARY KEY (part, epoch)) WITHOUT ROWID;
"""


class HistoryError(SluicewayError):
    """The history file cannot be opened or written (its directory is missing, it is not SQLite…)."""


@dataclass(frozen=True, slots=True)
class Line:
    """One series of a chart: its values, aligned with the chart's ``times`` (``None``: no sample)."""

    name: str
    label: str
    unit: str
    values: list[float | None]


@dataclass(frozen=True, slots=True)
class Chart:
    """A part's history over ``[since, until]``: the answer of ``GET /api/history``."""

    part: str
    source: str
    since: float
    until: float
    #: Seconds per point (a bucket's mean is its value).
    step: float
    times: list[float]
    series: list[Line]

    def to_json(self) -> dict[str, object]:
        return {
            "part": self.part,
            "source": self.source,
            "from": self.since,
            "to": self.until,
            "step": self.step,
            "times": self.times,
            "series": [
                {"name": s.name, "label": s.label, "unit": s.unit, "values": s.values} for s in self.series
            ],
        }


@dataclass(frozen=True, slots=True)
class Term:
    epoch: int
    holder: str
    #: When the console first saw this epoch (seconds since the epoch).
    at: float


def chart(
    part: str,
    source: str,
    since: float,
    until: float,
    step: float,
    rows: Iterable[tuple[str, float, float]],
    only: Sequence[str] | None = None,
    known: Callable[[str, list[str]], list[Series]] = series_of,
) -> Chart:
    """A :class:`Chart` from ``(series, bucket time, value)`` rows: the series ``known`` gives for
    the part's kind and the names found (the kind's own, in order, then its sinks'); ``only``
    keeps just those named."""
    kind, _ = split_part(part)
    found: dict[str, dict[float, float]] = {}
    for name, at, value in rows:
        found.setdefault(name, {})[at] = value
    times = sorted({at for values in found.values() for at in values})
    wanted = known(kind, list(found))
    if only is not None:
        wanted = [s for s in wanted if s.name in only]
    lines = [Line(s.name, s.label, s.unit, [found.get(s.name, {}).get(t) for t in times]) for s in wanted]
    return Chart(part, source, since, until, step, times, lines)


def range_seconds(text: str) -> float:
    """A chart's range: a duration (``15m``, ``1h``, ``90s``) or days (``7d``), as Prometheus
    writes them; :class:`ValueError` for anything else.

    >>> range_seconds("7d"), range_seconds("1h30m")
    (604800.0, 5400.0)
    """
    days = text.strip().removesuffix("d")
    if days != text.strip() and days.isdigit():
        return int(days) * 86400.0
    try:
        return duration_seconds(text)
    except ValueError:
        raise ValueError(f"expected a range like '15m', '1h', '24h' or '7d', got {text!r}") from None


def bucket_step(span: float, finest: float) -> float:
    """Seconds per point for a range of ``span``: ``finest`` or coarser, at most MAX_POINTS points."""
    step = max(finest, span / MAX_POINTS)
    for nice in (1, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400):
        if nice >= step:
            return float(nice)
    return float(step)


class SqliteHistory:
    """History kept by the console in ``path``."""

    source = "sqlite"

    def __init__(
        self,
        path: str | Path,
        *,
        retention: float = 7 * 86400.0,
        detail: float = 6 * 3600.0,
        every: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.retention = retention
        self.detail = min(detail, retention)
        self.every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._pruned = 0.0
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise HistoryError(f"history file {self.path}: {exc}") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> SqliteHistory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------------
    def record(self, at: float, points: Sequence[Point], terms: Sequence[tuple[str, int, str]] = ()) -> None:
        """Keep one sample's ``points`` (and the leader ``terms`` seen: part, epoch, holder)."""
        minute = int(at // 60 * 60)
        with self._lock:
            try:
                self._db.execute("BEGIN")
                self._db.executemany(
                    "INSERT OR REPLACE INTO sample VALUES (?, ?, ?, ?)", [(p, s, at, v) for p, s, v in points]
                )
                self._db.executemany(
                    "INSERT INTO minute VALUES (?, ?, ?, ?, 1, ?) ON CONFLICT DO UPDATE SET "
                    "total = total + excluded.total, n = n + 1, peak = max(peak, excluded.peak)",
                    [(p, s, minute, v, v) for p, s, v in points],
                )
                self._db.executemany(
                    "INSERT INTO term VALUES (?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET last = excluded.last",
                    [(p, e, h, at, at) for p, e, h in terms],
                )
                if at - self._pruned >= 60:
                    self._prune(at)
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise HistoryError(f"history file {self.path}: {exc}") from None

    def _prune(self, now: float) -> None:
        self._db.execute("DELETE FROM sample WHERE at < ?", (now - self.detail,))
        self._db.execute("DELETE FROM minute WHERE at < ?", (now - self.retention,))
        self._db.execute("DELETE FROM term WHERE last < ?", (now - self.retention,))
        self._pruned = now

    # -- reading --------------------------------------------------------------------------------
    def read(self, part: str, span: float, *, only: Sequence[str] | None = None) -> Chart:
        """``part``'s series over the last ``span`` seconds (``only``: just those series)."""
        until = self._clock()
        since = until - span
        if since >= until - self.detail:  # every sample is still here
            step, table, mean = bucket_step(span, self.every), "sample", "avg(value)"
        else:
            step, table, mean = bucket_step(span, 60), "minute", "sum(total) / sum(n)"
        params: dict[str, object] = {"step": step, "part": part, "since": since}
        asked = ""
        if only is not None:  # just those series read (a sparkline asks for one)
            params |= {f"s{i}": name for i, name in enumerate(only)}
            asked = f" AND series IN ({', '.join(f':s{i}' for i in range(len(only)))})"
        sql = (
            f"SELECT series, CAST(at / :step AS INTEGER) * :step AS b, {mean} FROM {table} "
            f"WHERE part = :part AND at >= :since{asked} GROUP BY series, b"
        )
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        return chart(part, self.source, since, until, step, rows, only)

    def trouble_since(self, part: str) -> float | None:
        """When ``part`` was first seen not ok, of the trouble it is in now (``None``: it is ok,
        or has no samples within the detail)."""
        with self._lock:
            row = self._db.execute(
                "SELECT value, (SELECT min(at) FROM sample WHERE part = :part AND series = :health AND "
                " at > coalesce((SELECT max(at) FROM sample WHERE part = :part AND series = :health "
                " AND value = 0), 0)) FROM sample WHERE part = :part AND series = :health "
                "ORDER BY at DESC LIMIT 1",
                {"part": part, "health": HEALTH.name},
            ).fetchone()
        if row is None or row[0] == 0:
            return None
        return float(row[1])

    def terms(self, part: str, limit: int = 20) -> list[Term]:
        """The last ``limit`` leader terms of ``part``, newest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT epoch, holder, at FROM term WHERE part = ? ORDER BY epoch DESC LIMIT ?", (part, limit)
            ).fetchall()
        return [Term(int(e), str(h), float(a)) for e, h, a in rows]
