"""The workspace file, ``sluice.yaml``: which outboxes, journals, pipelines, feeds and captures to
watch, and the thresholds past which one of them counts as stuck.

Read at the edge like every configuration (YAML, ``${ENV}`` interpolation, validated, frozen);
every section is optional. Relative paths (journal directories, pipeline specs, capture files,
SQLite files) are relative to the workspace file's own directory, whatever directory ``sluice``
runs in — and so are the relative paths inside the pipeline specs and capture files it lists
(checkpoints, a journal source, a capture's state directory): they are read as if ``sluice`` ran
in that directory, where the pipelines and captures are meant to run. ``root:`` names another
directory for all of them (relative: from the file's)::

    outboxes:  [{name: shop, dsn: "${PG}", table: outbox}]
    journals:  [{name: bus, path: ./data/journal}]
    pipelines: [./orders.yaml]
    feeds:     [{name: work, dsn: "sqlite:///work.db"}]
    captures:  [./capture.yaml]
    checks:    {outbox_oldest_age: 5m, pipeline_lag: 10000, expired_leases: 0}
    history:   {retention: 7d}             # the console's own history (default: on)
    prometheus: {url: "http://prometheus:9090"}   # or: history from the operator's Prometheus
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Protocol, TypeVar

from pydantic import AfterValidator, Field, field_validator, model_validator

from sluiceway.config import DataSourceString, Duration, StrictModel, TableName, load_file
from sluiceway.config.paths import rooted, rooted_dsn
from sluiceway.election.lease import DEFAULT_LEASE_TABLE
from sluiceway.errors import SluicewayError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")

#: The kinds of things a workspace watches, as its keys name them, and one of each.
SINGULAR = {
    "outboxes": "outbox",
    "journals": "journal",
    "pipelines": "pipeline",
    "feeds": "feed",
    "captures": "capture",
}

#: The election name a harvester uses unless its reaper.yaml names one (``harvest.name``).
DEFAULT_ELECTION = "sluiceway"


class NotWatchedError(SluicewayError):
    """The workspace watches no outbox, journal, pipeline, feed or capture by that name."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"no {SINGULAR[kind]} named {name!r} in the workspace")


def _name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            "use letters, digits, '_', '.' and '-' (at most 63), starting with a letter or digit"
        )
    return value


Name = Annotated[str, AfterValidator(_name)]


class OutboxWatch(StrictModel):
    """An outbox table, and the database lease its harvesters elect their leader with."""

    name: Name
    dsn: DataSourceString
    table: TableName = "outbox"
    #: The harvesters' election name (their ``election.name``, else ``leaderGroupID``, else
    #: ``harvest.name``); ``null`` when they elect through Kafka (NELI), which has no row to read.
    election: str | None = DEFAULT_ELECTION
    lease_table: TableName = DEFAULT_LEASE_TABLE


class JournalWatch(StrictModel):
    name: Name
    path: str


class FeedWatch(StrictModel):
    name: Name
    dsn: DataSourceString
    prefix: str = "feed_"


class _Named(Protocol):
    @property
    def name(self) -> str: ...


_W = TypeVar("_W", bound=_Named)


def _named(entries: Sequence[_W], kind: str, name: str) -> _W:
    found = next((e for e in entries if e.name == name), None)
    if found is None:
        raise NotWatchedError(kind, name)
    return found


class Checks(StrictModel):
    """Thresholds: past one, the thing is *stuck* and ``sluice status --check`` exits 1.
    ``null`` turns a check off. A source that cannot be read and a failed sink always count."""

    #: The oldest outbox row is older than this.
    outbox_oldest_age: Duration | None = 300.0
    #: A sink is more than this many records behind its source.
    pipeline_lag: int | None = Field(10_000, ge=0)
    #: A postgres-cdc pipeline's or a ``sluice capture``'s slot retains more than this many bytes
    #: of WAL (the capture is behind or stopped; a pipeline's sinks' lag is records of the
    #: capture's journal, as for any source).
    cdc_lag_bytes: int | None = Field(1 << 30, ge=0)
    #: More than this many feed partitions are held by leases that have run out.
    expired_leases: int | None = Field(0, ge=0)
    #: More than this many dead letters in an outbox (off unless set).
    dead_letters: int | None = Field(None, ge=0)
    #: A named journal consumer is more than this many records behind the head (off unless set).
    journal_consumer_lag: int | None = Field(None, ge=0)


class HistorySettings(StrictModel):
    """The console's own history (``sluice ui``): sampled every ``every``, kept in a SQLite file."""

    enabled: bool = True
    #: The file (default: beside the workspace file, ``<its stem>.history.db``; relative: from ``root``).
    path: str | None = None
    #: How long minutes (mean and peak) are kept.
    retention: Duration = Field(7 * 86400.0, gt=0)
    #: How long every sample is kept (at most ``retention``).
    detail: Duration = Field(6 * 3600.0, gt=0)
    every: Duration = Field(5.0, gt=0)


class PrometheusSettings(StrictModel):
    """History read from this Prometheus server instead (the console then keeps none)."""

    url: str
    timeout: Duration = Field(5.0, gt=0)

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("expected the server's http:// or https:// address, as http://prometheus:9090")
        return value


class Workspace(StrictModel):
    """What ``sluice status`` and ``sluice ui`` watch.

    >>> from sluiceway.config import validate
    >>> ws = validate(Workspace, {"journals": [{"name": "bus", "path": "./data/journal"}]})
    >>> [j.name for j in ws.journals], ws.checks.expired_leases
    (['bus'], 0)
    """

    outboxes: list[OutboxWatch] = Field(default_factory=list)
    journals: list[JournalWatch] = Field(default_factory=list)
    #: Pipeline spec files; each pipeline is named by its spec.
    pipelines: list[str] = Field(default_factory=list)
    feeds: list[FeedWatch] = Field(default_factory=list)
    #: ``sluice capture`` files (capture.yaml); each capture is named by its ``capture.name``.
    captures: list[str] = Field(default_factory=list)
    checks: Checks = Field(default_factory=Checks)
    history: HistorySettings = Field(default_factory=HistorySettings)
    prometheus: PrometheusSettings | None = None
    #: The directory relative paths are read from: this file's, and those of the specs and capture
    #: files it lists (the directory the pipelines and captures run in). Default: the workspace
    #: file's own directory; a relative one is from there. Absolute once loaded by ``from_file``;
    #: ``None`` (a workspace made in code) reads them from the current directory.
    root: str | None = None

    @field_validator("pipelines")
    @classmethod
    def _specs(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a pipeline spec is listed twice")
        return value

    @field_validator("captures")
    @classmethod
    def _captures(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a capture file is listed twice")
        return value

    @model_validator(mode="after")
    def _unique(self) -> Workspace:
        for kind, entries in (
            ("outboxes", self.outboxes),
            ("journals", self.journals),
            ("feeds", self.feeds),
        ):
            names = [e.name for e in entries]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{kind}: the name {twice[0]!r} is used twice")
        return self

    def outbox(self, name: str) -> OutboxWatch:
        """The watched outbox ``name``; :class:`NotWatchedError` if there is none."""
        return _named(self.outboxes, "outboxes", name)

    def journal(self, name: str) -> JournalWatch:
        """The watched journal ``name``; :class:`NotWatchedError` if there is none."""
        return _named(self.journals, "journals", name)

    def feed(self, name: str) -> FeedWatch:
        """The watched feed ``name``; :class:`NotWatchedError` if there is none."""
        return _named(self.feeds, "feeds", name)

    @classmethod
    def from_file(cls, path: str | Path) -> Workspace:
        """Read and validate a workspace file (``validate(Workspace, data)`` for parsed data); its
        relative paths are made absolute from its directory (or ``root``), see :meth:`rooted`."""
        file = Path(path).absolute()
        workspace = load_file(cls, path).rooted(file.parent)
        if workspace.history.path is not None:
            return workspace
        beside = str(file.parent / f"{file.stem}.history.db")
        return workspace.model_copy(update={"history": workspace.history.model_copy(update={"path": beside})})

    def rooted(self, directory: str | Path) -> Workspace:
        """This workspace with ``root`` and every relative path in it made absolute from
        ``directory`` (the file's; ``root`` itself, when relative, is from it too).

        >>> ws = Workspace.model_validate({"journals": [{"name": "bus", "path": "./journal"}],
        ...                                "pipelines": ["orders.yaml"], "root": "run"})
        >>> ws = ws.rooted("/srv/shop")
        >>> ws.root, ws.journals[0].path, ws.pipelines
        ('/srv/shop/run', '/srv/shop/run/journal', ['/srv/shop/run/orders.yaml'])
        """
        root = rooted(self.root or ".", directory)
        return self.model_copy(
            update={
                "root": root,
                "outboxes": [w.model_copy(update={"dsn": rooted_dsn(w.dsn, root)}) for w in self.outboxes],
                "journals": [w.model_copy(update={"path": rooted(w.path, root)}) for w in self.journals],
                "pipelines": [rooted(p, root) for p in self.pipelines],
                "feeds": [w.model_copy(update={"dsn": rooted_dsn(w.dsn, root)}) for w in self.feeds],
                "captures": [rooted(p, root) for p in self.captures],
                "history": self.history.model_copy(
                    update={"path": None if self.history.path is None else rooted(self.history.path, root)}
                ),
            }
        )
