"""The operator's actions that ``sluice ui --allow-actions`` offers, each through its part's own API
(the same calls as ``sluice outbox dead retry|resolve``, ``sluice pipeline skip|step`` and
``sluice feed retry``).

Each action takes the workspace and the names the operator chose, does one thing, and returns the
sentence the operator is shown. A name the workspace does not watch raises
:class:`~sluiceway.overview.workspace.NotWatchedError`; a refusal of the part (no such sink, an
offset past the end of the source) raises its own :class:`~sluiceway.errors.SluicewayError` or
``ValueError``. A dead letter that is already gone is not an error: a second click of the same
button says so.

>>> ws = Workspace()
>>> retry_feed(ws, "work", None, None)
Traceback (most recent call last):
    ...
sluiceway.overview.workspace.NotWatchedError: no feed named 'work' in the workspace
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sluiceway.db import Database
from sluiceway.feed import Feed
from sluiceway.outbox import discover
from sluiceway.outbox.deadletters import DeadLetterNotFoundError, resolve_dead_letter, retry_dead_letter
from sluiceway.overview.status import load_pipeline, pipeline_spec
from sluiceway.overview.workspace import Workspace

#: Starts ``sluice pipeline step SPEC --sink SINK`` in a directory (the workspace's ``root``: its
#: relative paths are read from there; ``None``: the current one); returns the process to reap
#: (None: nothing to).
StepLauncher = Callable[[str, str, "str | None"], "subprocess.Popen[bytes] | None"]


def retry_dead(workspace: Workspace, outbox: str, dead_id: int) -> str:
    """Put dead letter ``dead_id`` of ``outbox`` back into the outbox (``sluice outbox dead retry``)."""
    watch = workspace.outbox(outbox)
    with Database(watch.dsn) as db:
        try:
            head = retry_dead_letter(db, discover(db, watch.table), dead_id)
        except DeadLetterNotFoundError:
            return f"no dead letter {dead_id}"
    where = "put back at the head of its key" if head else "put back into the outbox"
    return f"dead letter {dead_id} {where}"


def resolve_dead(workspace: Workspace, outbox: str, dead_id: int) -> str:
    """Discard dead letter ``dead_id`` of ``outbox``, releasing its key (``sluice outbox dead resolve``)."""
    watch = workspace.outbox(outbox)
    with Database(watch.dsn) as db:
        try:
            resolve_dead_letter(db, discover(db, watch.table), dead_id)
        except DeadLetterNotFoundError:
            return f"no dead letter {dead_id}"
    return f"dead letter {dead_id} resolved (discarded; its key released)"


def skip(workspace: Workspace, pipeline: str, sink: str, offset: int) -> str:
    """Have ``sink`` of ``pipeline`` skip the record at ``offset`` (``sluice pipeline skip``)."""
    from sluiceway.pipeline.operator import skip as skip_record

    skip_record(load_pipeline(pipeline_spec(workspace, pipeline), workspace.root), sink, offset)
    return f"sink {sink} will skip offset {offset} (when the pipeline runs)"


def retry_feed(workspace: Workspace, feed: str, partition: str | None, item: int | None) -> str:
    """Make the failed items of ``feed`` available again: every one, a partition's, or one item
    (``sluice feed retry``)."""
    watch = workspace.feed(feed)
    with Feed(watch.dsn, prefix=watch.prefix, migrate=False) as client:
        count = client.retry(partition, item)
    scope = f" of partition {partition}" if partition else ""
    return f"{count} failed item(s){scope} made available again"


def launch_step(spec: str, sink: str, cwd: str | None = None) -> subprocess.Popen[bytes]:
    """``sluice pipeline step SPEC --sink SINK`` in a process of its own (it starts Spark), run in
    ``cwd``, its output in a log file; the sink's status shows the outcome."""
    log_file = Path(tempfile.gettempdir()) / f"sluice-step-{sink}-{int(time.time())}.log"
    with open(log_file, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sluiceway.cli.main", "pipeline", "step", spec, "--sink", sink],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
        )


class Steps:
    """The one-step runs a console started (``sluice pipeline step``, each in a process of its own).

    It keeps the processes only to reap them: a finished child that nobody waits for stays a
    zombie until its parent exits, and a console runs for days. Each start first waits (without
    blocking) for the ones that have finished. Requests run on a thread pool, hence the lock.
    """

    def __init__(self, launch: StepLauncher = launch_step) -> None:
        self._launch = launch
        self._running: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()

    def start(self, workspace: Workspace, pipeline: str, sink: str) -> str:
        """Start one step of ``sink`` of ``pipeline``; the sink's status shows how it ends."""
        spec = pipeline_spec(workspace, pipeline)
        load_pipeline(spec, workspace.root).sink(sink)  # no process for a sink the spec does not name
        with self._lock:
            self._running = [p for p in self._running if p.poll() is None]
            process = self._launch(spec, sink, workspace.root)
            if process is not None:
                self._running.append(process)
        return f"sink {sink}: one step started (Spark starts first; refresh to see it)"
