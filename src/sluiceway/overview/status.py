"""One view of every part: the figures of ``sluice status`` (and of ``sluice ui``'s ``/api/status``).

:func:`collect` reads each watched thing the way its own command does — ``outbox stats``,
``journal info``, ``pipeline status`` (checkpoints and state files, no Spark), ``feed status``, a
capture's slot, lease and state files — and returns a :class:`~sluiceway.overview.report.StatusReport`:
one typed entry per part, its ``health`` and ``problems`` judged by the workspace's checks
(:mod:`sluiceway.overview.checks`), and an ``error`` for what could not be read; the other
fields are then ``None``, so the shape never changes. Its JSON is a public interface, documented
in docs/operations.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sluiceway.config.paths import rooted
from sluiceway.db import Database
from sluiceway.feed import Feed, FeedStatus, Status
from sluiceway.journal import Journal
from sluiceway.overview.checks import evaluate
from sluiceway.overview.outbox import outbox_settings, outbox_status
from sluiceway.overview.report import (
    KINDS,
    CaptureEntry,
    Consumer,
    Entry,
    FeedEntry,
    GateCount,
    JournalEntry,
    OutboxEntry,
    PipelineEntry,
    RateLevel,
    Scheduled,
    SinkEntry,
    StatusReport,
    WorkerLeases,
)
from sluiceway.overview.workspace import FeedWatch, JournalWatch, NotWatchedError, OutboxWatch, Workspace

if TYPE_CHECKING:
    from sluiceway.capture import CaptureConfig
    from sluiceway.pipeline import PipelineSpec

__all__ = ["KINDS", "collect", "collect_one", "find"]

log = logging.getLogger("sluiceway.overview")

E = TypeVar("E", bound=Entry)


def _entry(known: E, read: Callable[[], E]) -> E:
    """The entry ``read`` gives — or ``known`` (the fields the workspace alone gives) with
    ``error`` saying why it could not be read."""
    try:
        return read()
    except Exception as exc:  # one unreachable database must not hide the rest of the view
        log.debug("status of %s: %s", known.name, exc, exc_info=True)
        return replace(known, error=" ".join(str(exc).split()) or type(exc).__name__)


def _database(dsn: str) -> Database:
    """A connection for reading only: a missing SQLite file is an error, not a new empty database,
    and an existing one is opened read-only (status writes nothing)."""
    return Database(dsn, read_only=True)


def outbox_entry(watch: OutboxWatch) -> OutboxEntry:
    def read() -> OutboxEntry:
        with _database(watch.dsn) as db:
            return outbox_status(db, watch)

    return _entry(outbox_settings(watch), read)


def journal_entry(watch: JournalWatch) -> JournalEntry:
    known = JournalEntry(name=watch.name, path=watch.path)

    def read() -> JournalEntry:
        with Journal.open(watch.path, read_only=True) as journal:
            head = journal.head
            segments = journal.segments()
            consumers = journal.consumers()
        return replace(
            known,
            head=head,
            start=segments[0].base if segments else 0,
            segments=len(segments),
            bytes=sum(s.size for s in segments),
            consumers=[
                Consumer(name, offset, max(0, head - offset)) for name, offset in sorted(consumers.items())
            ],
        )

    return _entry(known, read)


def load_pipeline(spec_path: str, root: str | None) -> PipelineSpec:
    """A watched pipeline's spec, its relative paths read from the workspace's ``root`` (the
    directory the pipeline runs in; ``None``: the current one)."""
    from sluiceway.pipeline import PipelineSpec

    spec = PipelineSpec.from_yaml(spec_path)
    return spec if root is None else spec.rooted(root)


def load_capture(path: str, root: str | None) -> CaptureConfig:
    """A watched capture's file, its state directory and journals read from the workspace's
    ``root`` (the directory the capture runs in; ``None``: the current one)."""
    from sluiceway.capture import CaptureConfig

    config = CaptureConfig.from_file(path)
    if root is None:
        return config
    c = config.capture
    journal = c.journal and c.journal.model_copy(update={"path": rooted(c.journal.path, root)})
    capture = c.model_copy(update={"state_dir": rooted(c.state_path, root), "journal": journal})
    return config.model_copy(update={"capture": capture})


def pipeline_entry(spec_path: str, root: str | None = None) -> PipelineEntry:
    from sluiceway.pipeline.operator import source_status, status

    name = Path(spec_path).stem
    try:
        spec: PipelineSpec | None = load_pipeline(spec_path, root)
    except Exception:  # reported by read() below, under the file's name
        spec = None
    if spec is not None:
        name = spec.name
    known = PipelineEntry(name=name, spec=spec_path, source=None if spec is None else spec.source.type)

    def read() -> PipelineEntry:
        parsed = spec or load_pipeline(spec_path, root)
        sinks = [
            SinkEntry(
                name=s.sink,
                state=s.state,
                committed_batch=s.committed_batch,
                committed_offset=s.position,
                last_offset=s.last_offset,
                lag=s.lag,
                records=s.records,
                dead_lettered=s.dead_lettered,
                error=s.error,
                skipped=s.skipped,
            )
            for s in status(parsed)
        ]
        return replace(known, source=parsed.source.type, sinks=sinks, cdc=source_status(parsed))

    return _entry(known, read)


def feed_fields(known: FeedEntry, s: FeedStatus) -> FeedEntry:
    """``known`` with a feed's status."""
    return replace(
        known,
        partitions=[GateCount(st, g, n) for st, g, n in s.partitions],
        items=[GateCount(st, g, n) for st, g, n in s.items_by_gate],
        items_by_status={st.value: s.items.get(st.value, 0) for st in Status},
        ready_items=s.ready_items,
        oldest_available_age_seconds=s.oldest_available_age,
        workers=[
            WorkerLeases(
                owner=w.owner,
                partitions=w.partitions,
                live_leases=w.partitions - w.expired,
                expired_leases=w.expired,
                lease_until=None if w.latest_expiry is None else w.latest_expiry.isoformat(),
            )
            for w in s.workers
        ],
        live_leases=sum(w.partitions - w.expired for w in s.workers),
        expired_leases=sum(w.expired for w in s.workers),
        rate_limits=[
            RateLevel(
                attribute=r.attribute,
                value=r.value,
                max_rate=r.max_rate,
                burst=r.burst,
                tokens=round(r.tokens, 3),
            )
            for r in s.rate_limits
        ],
        scheduled=Scheduled(
            partitions=s.scheduled.partitions,
            items=s.scheduled.items,
            next_due=None if s.scheduled.next_due is None else s.scheduled.next_due.isoformat(),
        ),
    )


def feed_entry(watch: FeedWatch) -> FeedEntry:
    known = FeedEntry(name=watch.name, prefix=watch.prefix)

    def read() -> FeedEntry:
        with _database(watch.dsn) as db, Feed(db, prefix=watch.prefix, migrate=False) as feed:
            return feed_fields(known, feed.status())

    return _entry(known, read)


def capture_entry(path: str, root: str | None = None) -> CaptureEntry:
    """A ``sluice capture`` named by its file (``capture.name``): read, never changed."""
    from sluiceway.overview.capture import capture_settings, capture_status

    try:
        config: CaptureConfig | None = load_capture(path, root)
    except Exception:  # reported by read() below, under the file's name
        config = None
    known = (
        CaptureEntry(name=Path(path).stem, file=path) if config is None else capture_settings(config, path)
    )

    def read() -> CaptureEntry:
        return capture_status(config or load_capture(path, root), path)

    return _entry(known, read)


def collect(workspace: Workspace) -> StatusReport:
    """Read everything the workspace watches, health judged by its checks.

    >>> collect(Workspace()).journals
    []
    """
    report = StatusReport(
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        outboxes=[outbox_entry(w) for w in workspace.outboxes],
        journals=[journal_entry(w) for w in workspace.journals],
        pipelines=[pipeline_entry(p, workspace.root) for p in workspace.pipelines],
        feeds=[feed_entry(w) for w in workspace.feeds],
        captures=[capture_entry(p, workspace.root) for p in workspace.captures],
    )
    return evaluate(report, workspace.checks)


def pipeline_specs(workspace: Workspace) -> dict[str, str]:
    """Pipeline name → spec file, for the specs that parse (a name is its spec's ``name``)."""
    found = {}
    for path in workspace.pipelines:
        try:
            found[load_pipeline(path, workspace.root).name] = path
        except Exception:  # an unreadable spec has no name to act on; the views show its error
            continue
    return found


def pipeline_spec(workspace: Workspace, name: str) -> str:
    """The spec file of the pipeline ``name``; :class:`NotWatchedError` if the workspace has none."""
    spec = pipeline_specs(workspace).get(name)
    if spec is None:
        raise NotWatchedError("pipelines", name)
    return spec


def capture_files(workspace: Workspace) -> dict[str, str]:
    """Capture name → its file, for the files that parse (a name is its ``capture.name``)."""
    found = {}
    for path in workspace.captures:
        try:
            found[load_capture(path, workspace.root).capture.name] = path
        except Exception:  # an unreadable file has no name to look up; the views show its error
            continue
    return found


def collect_one(workspace: Workspace, kind: str, name: str) -> Entry:
    """The entry ``name`` of ``kind`` alone (read, checks applied); :class:`NotWatchedError` if
    the workspace has none."""
    root = workspace.root
    if kind == "pipelines":
        chosen = Workspace(pipelines=[pipeline_spec(workspace, name)], checks=workspace.checks, root=root)
    elif kind == "captures":
        path = capture_files(workspace).get(name)
        if path is None:
            raise NotWatchedError(kind, name)
        chosen = Workspace(captures=[path], checks=workspace.checks, root=root)
    else:
        entries = [w for w in getattr(workspace, kind) if w.name == name]
        chosen = Workspace.model_validate({kind: entries, "checks": workspace.checks, "root": root})
    entry = collect(chosen).find(kind, name)
    if entry is None:  # not watched (or a spec that stopped parsing since: it has no name now)
        raise NotWatchedError(kind, name)
    return entry


def find(report: StatusReport, kind: str, name: str) -> Entry | None:
    """The entry ``name`` of ``kind`` (``outboxes`` …) in a report, or None."""
    return report.find(kind, name)


def watched(workspace: Workspace) -> list[tuple[str, str]]:
    """(kind, name) of every part the workspace watches (pipelines and captures whose files
    parse), in the report's order, found without reading the parts themselves."""
    named: dict[str, list[str]] = {
        "outboxes": [w.name for w in workspace.outboxes],
        "journals": [w.name for w in workspace.journals],
        "pipelines": list(pipeline_specs(workspace)),
        "feeds": [w.name for w in workspace.feeds],
        "captures": list(capture_files(workspace)),
    }
    return [(kind, name) for kind in KINDS for name in named[kind]]
