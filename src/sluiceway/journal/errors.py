"""Errors raised by the journal. All derive from :class:`JournalError` (a ``SluicewayError``)."""

from __future__ import annotations

from sluiceway.errors import SluicewayError


class JournalError(SluicewayError):
    """Something went wrong with a journal (I/O failure, misuse, missing files)."""


class JournalNotFoundError(JournalError):
    """There is no journal at the path (only writers create one)."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"no journal at {path}")


class JournalLockedError(JournalError):
    """Another writer holds the journal's lock: there is one writer process at a time."""

    def __init__(self, path: str, holder: str = "") -> None:
        self.path = path
        self.holder = holder
        who = f" (held by {holder})" if holder else ""
        super().__init__(f"journal {path} is locked by another writer{who}")


class JournalClosedError(JournalError):
    """The journal was closed (or failed and must be reopened) before the operation finished."""


class JournalReadOnlyError(JournalError):
    """A write was attempted on a journal opened with ``read_only=True``."""


class ExpectationFailed(JournalError):
    """An append's expectation did not hold; the append changed nothing.

    ``what`` is ``"offset"`` for ``expect_offset`` or ``"register:NAME"`` for a register;
    ``expected`` and ``actual`` are the values compared (``None`` for an unset register).
    """

    def __init__(self, what: str, expected: object, actual: object) -> None:
        self.what = what
        self.expected = expected
        self.actual = actual
        super().__init__(f"append expectation failed on {what}: expected {expected!r}, found {actual!r}")


class CorruptRecordError(JournalError):
    """Committed bytes failed verification (CRC or structure). They are never returned as data.

    ``path`` is the segment file, ``position`` the byte position of the bad frame in it and
    ``offset`` the journal offset concerned, when it is known.
    """

    def __init__(self, path: str, position: int, offset: int | None, reason: str) -> None:
        self.path = path
        self.position = position
        self.offset = offset
        self.reason = reason
        at = f" offset {offset}" if offset is not None else ""
        super().__init__(f"corrupt journal data in {path} at byte {position}{at}: {reason}")


class AppendAborted(JournalError):
    """The append was aborted (``tx.abort()`` or an exception); it wrote nothing."""


class InvalidJournalRecord(JournalError, ValueError):
    """A record passed to ``tx.write`` was rejected before anything was written."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"invalid journal record: {field}: {problem}")
