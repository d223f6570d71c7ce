"""One view of every part: the figures of ``sluice status`` (and of ``sluice ui``'s ``/api/status``).

:func:`collect` reads each watched thing the way its own command does — ``outbox stats``,
``journal info``, ``pipeline status`` (checkpoints and state files, no Spark), ``feed status``, a
capture's slot, lease and state files — and returns one JSON-ready object with the keys
``outboxes``, ``journals``, ``pipelines``, ``feeds`` and ``captures``. Each entry has a ``name``,
a ``health`` (``ok``, ``stuck`` or ``unavailable``), the ``problems`` behind it
(:mod:`sluiceway.overview.checks`) and an ``error`` when it could not be read; the other fields
are then ``null``, so the shape never changes. The fields are a public interface, documented in
docs/operations.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluiceway.config.paths import rooted
from sluiceway.db import Database, parse_dsn
from sluiceway.feed import Feed, FeedStatus, Status
from sluiceway.journal import Journal
from sluiceway.overview.checks import evaluate
from sluiceway.overview.outbox import outbox_status
from sluiceway.overview.workspace import FeedWatch, JournalWatch, NotWatchedError, OutboxWatch, Workspace

if TYPE_CHECKING:
    from sluiceway.capture import CaptureConfig
    from sluiceway.pipeline import PipelineSpec

log = logging.getLogger("sluiceway.overview")

KINDS = ("outboxes", "journals", "pipelines", "feeds", "captures")

_OUTBOX_FIELDS = ("table", "rows", "oldest_age_seconds", "in_flight", "dead_letters", "leader")
_JOURNAL_FIELDS = ("path", "head", "start", "segments", "bytes", "consumers")
_PIPELINE_FIELDS = ("spec", "source", "sinks", "cdc")
_CAPTURE_FIELDS = (
    "file",
    "destination",
    "slot_name",
    "election",
    "state_dir",
    "slot",
    "leader",
    "published_lsn",
    "tables",
)
_FEED_FIELDS = (
    "prefix",
    "partitions",
    "items",
    "items_by_status",
    "ready_items",
    "oldest_available_age_seconds",
    "workers",
    "live_leases",
    "expired_leases",
    "rate_limits",
    "scheduled",
)


def _entry(
    name: str, fields: tuple[str, ...], read: Callable[[], dict[str, Any]], **known: Any
) -> dict[str, Any]:
    """An entry with every field (``known`` ones from the workspace, the rest ``null``), filled by
    ``read`` — or with ``error`` saying why it could not be read."""
    entry: dict[str, Any] = {"name": name, "health": "ok", "problems": [], "error": None}
    entry.update(dict.fromkeys(fields))
    entry.update(known)
    try:
        entry.update(read())
    except Exception as exc:  # one unreachable database must not hide the rest of the view
        log.debug("status of %s: %s", name, exc, exc_info=True)
        entry["error"] = " ".join(str(exc).split()) or type(exc).__name__
    return entry


def _database(dsn: str) -> Database:
    """A connection for reading only: a missing SQLite file is an error, not a new empty database,
    and an existing one is opened read-only (status writes nothing)."""
    return Database(dsn, read_only=True)


def outbox_entry(watch: OutboxWatch) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        with _database(watch.dsn) as db:
            return outbox_status(db, watch)

    dsn = parse_dsn(watch.dsn).redacted()
    return _entry(watch.name, ("dsn", *_OUTBOX_FIELDS), read, dsn=dsn, table=watch.table)


def journal_entry(watch: JournalWatch) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        with Journal.open(watch.path, read_only=True) as journal:
            head = journal.head
            segments = journal.segments()
            consumers = journal.consumers()
        return {
            "path": watch.path,
            "head": head,
            "start": segments[0].base if segments else 0,
            "segments": len(segments),
            "bytes": sum(s.size for s in segments),
            "consumers": [
                {"name": name, "offset": offset, "lag": max(0, head - offset)}
                for name, offset in sorted(consumers.items())
            ],
        }

    return _entry(watch.name, _JOURNAL_FIELDS, read, path=watch.path)


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


def pipeline_entry(spec_path: str, root: str | None = None) -> dict[str, Any]:
    from sluiceway.pipeline.operator import source_status, status

    name = Path(spec_path).stem
    try:
        spec: PipelineSpec | None = load_pipeline(spec_path, root)
    except Exception:  # reported by read() below, under the file's name
        spec = None
    if spec is not None:
        name = spec.name

    def read() -> dict[str, Any]:
        parsed = spec or load_pipeline(spec_path, root)
        sinks = [
            {
                "name": s.sink,
                "state": s.state,
                "committed_batch": s.committed_batch,
                "committed_offset": s.position,
                "last_offset": s.last_offset,
                "lag": s.lag,
                "records": s.records,
                "dead_lettered": s.dead_lettered,
                "error": s.error,
                "skipped": s.skipped,
            }
            for s in status(parsed)
        ]
        return {"spec": spec_path, "source": parsed.source.type, "sinks": sinks, "cdc": source_status(parsed)}

    return _entry(name, _PIPELINE_FIELDS, read, spec=spec_path, source=spec and spec.source.type)


def feed_fields(prefix: str, s: FeedStatus) -> dict[str, Any]:
    """A feed's status in the view's JSON shape."""
    return {
        "prefix": prefix,
        "partitions": [{"status": st, "gate": g, "count": n} for st, g, n in s.partitions],
        "items": [{"status": st, "gate": g, "count": n} for st, g, n in s.items_by_gate],
        "items_by_status": {st.value: s.items.get(st.value, 0) for st in Status},
        "ready_items": s.ready_items,
        "oldest_available_age_seconds": s.oldest_available_age,
        "workers": [
            {
                "owner": w.owner,
                "partitions": w.partitions,
                "live_leases": w.partitions - w.expired,
                "expired_leases": w.expired,
                "lease_until": None if w.latest_expiry is None else w.latest_expiry.isoformat(),
            }
            for w in s.workers
        ],
        "live_leases": sum(w.partitions - w.expired for w in s.workers),
        "expired_leases": sum(w.expired for w in s.workers),
        # Rate limits (docs/feed.md#rate-limits): each bucket's level now; [] when none is set.
        "rate_limits": [
            {
                "attribute": r.attribute,
                "value": r.value,
                "max_rate": r.max_rate,
                "burst": r.burst,
                "tokens": round(r.tokens, 3),
            }
            for r in s.rate_limits
        ],
        # Scheduled work not due yet (docs/feed.md#scheduled-work) and when the first of it is.
        "scheduled": {
            "partitions": s.scheduled.partitions,
            "items": s.scheduled.items,
            "next_due": None if s.scheduled.next_due is None else s.scheduled.next_due.isoformat(),
        },
    }


def feed_entry(watch: FeedWatch) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        with _database(watch.dsn) as db, Feed(db, prefix=watch.prefix, migrate=False) as feed:
            return feed_fields(watch.prefix, feed.status())

    return _entry(watch.name, _FEED_FIELDS, read, prefix=watch.prefix)


def capture_entry(path: str, root: str | None = None) -> dict[str, Any]:
    """A ``sluice capture`` named by its file (``capture.name``): read, never changed."""
    from sluiceway.overview.capture import capture_settings, capture_status

    try:
        config: CaptureConfig | None = load_capture(path, root)
    except Exception:  # reported by read() below, under the file's name
        config = None
    name = Path(path).stem if config is None else config.capture.name
    known = {"file": path} if config is None else capture_settings(config, path)

    def read() -> dict[str, Any]:
        return capture_status(config or load_capture(path, root))

    return _entry(name, _CAPTURE_FIELDS, read, **known)


def collect(workspace: Workspace) -> dict[str, Any]:
    """Read everything the workspace watches; one object with the keys ``outboxes``,
    ``journals``, ``pipelines``, ``feeds``, ``captures`` (and ``generated_at``), health judged by
    its checks.

    >>> collect(Workspace())["journals"]
    []
    """
    report: dict[str, Any] = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "outboxes": [outbox_entry(w) for w in workspace.outboxes],
        "journals": [journal_entry(w) for w in workspace.journals],
        "pipelines": [pipeline_entry(p, workspace.root) for p in workspace.pipelines],
        "feeds": [feed_entry(w) for w in workspace.feeds],
        "captures": [capture_entry(p, workspace.root) for p in workspace.captures],
    }
    evaluate(report, workspace.checks)
    return report


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


def collect_one(workspace: Workspace, kind: str, name: str) -> dict[str, Any]:
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
    entry = find(collect(chosen), kind, name)
    if entry is None:  # not watched (or a spec that stopped parsing since: it has no name now)
        raise NotWatchedError(kind, name)
    return entry


def find(report: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    """The entry ``name`` of ``kind`` (``outboxes`` …) in a report, or None."""
    return next((e for e in report.get(kind, []) if e["name"] == name), None)
