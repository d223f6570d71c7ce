"""Pipeline errors: one branch of the ``SluicewayError`` tree, each carrying its fields."""

from __future__ import annotations

import errno
import os
from typing import Any

from sluiceway.errors import ConfigError, SluicewayError


class PipelineError(SluicewayError):
    """Root of the pipeline's own errors."""


class SpecError(ConfigError):
    """A pipeline spec (YAML or Python) is invalid; ``path`` names the field (``sinks[1].table``)."""


class SinkFailed(PipelineError):
    """A sink could not write a record even one at a time: it stopped at the last good offset.

    ``offset`` is the offset of the record that failed, ``last_good`` the offset of the last
    record written before it in that batch (``None`` if it was the batch's first).
    """

    def __init__(
        self,
        sink: str,
        offset: int | None,
        error: str,
        *,
        batch_id: int | None = None,
        last_good: int | None = None,
    ) -> None:
        self.sink = sink
        self.offset = offset
        self.error = error
        self.batch_id = batch_id
        self.last_good = last_good
        at = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"sink {sink!r} failed{at}: {error}")


class StepPaused(PipelineError):
    """Raised inside a sink's batch when ``step`` has used its one-record budget (not an error)."""

    MARKER = "sluice-step-paused"

    def __init__(self, sink: str) -> None:
        self.sink = sink
        super().__init__(f"{self.MARKER}: sink {sink!r} processed its step")


class SourceError(PipelineError):
    """A source could not be read (missing journal, unreachable broker or database)."""


class SourceOptionError(PipelineError):
    """A data source's option is missing or invalid; ``option`` names it (``maxRecordsPerBatch``).

    >>> str(SourceOptionError("path", "sluice-journal: option 'path' is required"))
    "sluice-journal: option 'path' is required"
    """

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(message)

    def __reduce__(self) -> Any:
        # Raised on Spark's Python workers too: it must unpickle with its two arguments.
        return type(self), (self.option, str(self))


class RecordRefused(PipelineError):
    """A sink cannot write this record as it is (a truncate reaching a table that cannot tell
    namespaces apart): the record is blamed, as for a database's refusal of it."""


class NoSuchOffset(PipelineError):
    """An operator named an offset the source does not hold (``skip`` past its end)."""


class DestinationUnreachable(PipelineError):
    """A sink's destination cannot be reached, or refuses the connection (a missing database, a
    wrong password, a server that is down): not the fault of any record, so no record is blamed
    and none is replayed one at a time. ``permanent``: waiting will not help (the run stops at
    once); otherwise the sink waits for the destination with backoff for ``retry.outage``.
    """

    def __init__(self, problem: str, *, sink: str = "", permanent: bool = False) -> None:
        self.problem, self.sink, self.permanent = problem, sink, permanent
        where = f"sink {sink!r}: " if sink else ""
        super().__init__(f"{where}destination unreachable: {problem}")

    def __reduce__(self) -> Any:
        return _unreachable, (self.problem, self.sink, self.permanent)


def _unreachable(problem: str, sink: str, permanent: bool) -> DestinationUnreachable:
    return DestinationUnreachable(problem, sink=sink, permanent=permanent)


#: A file system that is full: space may be freed (the sink waits for ``retry.outage``).
_FS_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
#: A file system that refuses us: no permission, read-only. Waiting will not help.
_FS_REFUSED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def file_system_fault(exc: BaseException, path: str) -> DestinationUnreachable | None:
    """The :class:`DestinationUnreachable` for a file system error that is the destination's
    fault, not a record's (a full disk: transient; permission denied, a read-only file system:
    permanent), found in ``exc`` or what caused it; None for any other error. Told apart by
    ``errno`` (pyarrow sets it too), never by the message."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short cause chain; never loops on a cycle
        if seen is None:
            break
        code = seen.errno if isinstance(seen, OSError) else None
        if code is not None and (code in _FS_FULL or code in _FS_REFUSED):
            where = getattr(seen, "filename", None) or path
            return DestinationUnreachable(f"{where}: {os.strerror(code)}", permanent=code in _FS_REFUSED)
        seen = seen.__cause__ or seen.__context__
    return _jvm_file_system_fault(exc, path)


def _jvm_file_system_fault(exc: BaseException, path: str) -> DestinationUnreachable | None:
    """The same for an error raised in Spark's JVM (its own Parquet writer, its checkpoint): a Java
    ``IOException`` carries no errno, only the C library's text for it (the JDK makes the message
    with ``strerror``), so the trace is matched against those same codes' texts."""
    seen: BaseException | None = exc
    for _ in range(8):  # the exception and a short cause chain (PySpark may wrap the JVM's error)
        if seen is None:
            break
        if type(seen).__module__.startswith(("py4j", "pyspark")):
            text = str(seen)
            for code in (*_FS_FULL, *_FS_REFUSED):
                said = os.strerror(code)
                if f"IOException: {said}" in text or f"({said})" in text:
                    return DestinationUnreachable(f"{path}: {said}", permanent=code in _FS_REFUSED)
        seen = seen.__cause__ or seen.__context__
    return None


def one_line(text: object) -> str:
    """A driver's message as one line: its lines joined, runs of spaces collapsed."""
    return " ".join(str(text).split())
