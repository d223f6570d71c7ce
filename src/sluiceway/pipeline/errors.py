"""Pipeline errors: one branch of the ``SluicewayError`` tree, each carrying its fields."""

from __future__ import annotations

import errno
import os
import re
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


class TransformFailed(PipelineError):
    """A transform's own function raised on a record (or a batch): names the transform and where.

    Raised on Spark's Python workers; the driver reads it back out of Spark's error text
    (:func:`explain`), so its message is the one line the user sees.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)

    def __reduce__(self) -> Any:
        return type(self), (str(self),)


#: A line that states an exception: ``KeyError: 'total'``, ``pkg.mod.SomeError: text``.
_RAISED = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Failed|Violation|Exit|Interrupt)\w*)(?::\s?(?P<text>.*))?$"
)
#: The tail Spark appends to an analysis error's first line.
_SQL_TAIL = re.compile(r"\s*SQLSTATE: \w+;?.*$|;\s*line \d+ pos \d+;?.*$")
#: What a traceback of PySpark's Py4J plumbing adds before the Python worker's own exception.
_WORKER_INTRO = "An exception was thrown from the Python worker"


def explain(exc: BaseException, *, limit: int = 1000) -> str:
    """One line for an error that came out of Spark (or anything else): its cause, not its frames.

    - a transform's :class:`TransformFailed`, wherever in the text: its message;
    - a Python worker's exception (``PythonException``): the exception the worker's traceback ends
      with (``KeyError: 'total'``), not PySpark's "An exception was thrown from the Python worker:";
    - an ``AnalysisException`` and Spark's other errors with a condition: the first line of its
      message, without the ``SQLSTATE``/position tail and the logical plan;
    - a JVM error (``Py4JJavaError``): the Java exception's first line;
    - anything else: ``Type: first line``.

    >>> explain(ValueError("bad\\nvalue"))
    'ValueError: bad'
    """
    text = _text(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if ".TransformFailed: " in line or line.startswith("TransformFailed: "):
            return line.split("TransformFailed: ", 1)[1][:limit]
    name = type(exc).__name__
    if _WORKER_INTRO in text or name == "PythonException":
        raised = [m for line in lines if (m := _RAISED.match(line))]
        if raised:
            last = raised[-1]
            kind = last["type"].rsplit(".", 1)[-1]
            return (f"{kind}: {last['text']}" if last["text"] is not None else kind)[:limit]
    if name == "Py4JJavaError":
        java = getattr(exc, "java_exception", None)
        said = str(java) if java is not None else (lines[1] if len(lines) > 1 else text)
        return " ".join(said.splitlines()[0].split())[:limit] if said else name
    first = lines[0] if lines else name
    if name.endswith("Exception") and type(exc).__module__.startswith("pyspark"):
        # Spark's own errors (AnalysisException, StreamingQueryException, …): the message only.
        return _SQL_TAIL.sub("", first)[:limit]
    return f"{name}: {first}"[:limit] if lines else name


def from_python_worker(exc: BaseException) -> bool:
    """Whether ``exc`` is a Python worker's error (a transform's own, or PySpark's around it)."""
    text = _text(exc)
    return "TransformFailed" in text or type(exc).__name__ == "PythonException"


def error_detail(exc: BaseException, *, limit: int = 16_000) -> str:
    """An error's whole text for ``pipeline status`` (a worker's traceback, Spark's message), bounded."""
    text = _text(exc).strip()
    return text if len(text) <= limit else text[: limit // 2] + "\n…\n" + text[-limit // 2 :]


def _text(exc: BaseException) -> str:
    getter = getattr(exc, "getMessage", None)  # PySpark's captured errors: without the JVM frames
    try:
        text = getter() if callable(getter) else str(exc)
    except Exception:
        text = str(exc)
    return str(text) if str(text or "").strip() else str(exc)
