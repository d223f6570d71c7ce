"""What a sink does when a write fails: retry, then replay one record at a time (pure logic).

The rule, kept exactly: a failing bulk write is retried with backoff; if it keeps failing the
batch is replayed *one record at a time, in order*, so every record before the bad one is
written; the bad record then either stops the sink (the error names its offset; everything
before it is done) or, with a dead-letter sink, goes there and the replay carries on. Records
are never written out of order, and never skipped silently.

``deliver`` takes a ``write(lo, hi)`` callback over positions of the batch and an injected
``sleep``, so every path is tested without Spark, sinks or clocks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sluiceway.outage import OUTAGE_REMINDER, WarningThrottle, ride_out
from sluiceway.pipeline.errors import DestinationUnreachable

log = logging.getLogger("sluiceway.pipeline.failures")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 3
    backoff: float = 0.5
    max_backoff: float = 10.0
    record_attempts: int = 2
    #: Seconds a sink waits, retrying with backoff, for an unreachable destination to come back.
    outage: float = 60.0


def backoff_delays(attempts: int, first: float, cap: float) -> Iterator[float]:
    """The waits between ``attempts`` tries: first, 2 * first, 4 * first … capped (one fewer than tries)."""
    delay = first
    for _ in range(max(0, attempts - 1)):
        yield min(delay, cap)
        delay *= 2


class Progress(Protocol):
    def __call__(self, written: int) -> None: ...


@dataclass
class Outcome:
    """How a batch went: ``written`` positions done (a prefix), dead-lettered positions, and the
    failure that stopped it, if any."""

    written: int
    dead: list[tuple[int, str]] = field(default_factory=list)
    failed_at: int | None = None
    error: str | None = None
    replayed: bool = False
    #: The destination could not be reached (no record is to blame): why.
    unreachable: str | None = None

    @property
    def ok(self) -> bool:
        return self.failed_at is None and self.unreachable is None


def _try(
    action: Callable[[], None], attempts: int, policy: RetryPolicy, sleep: Callable[[float], None], what: str
) -> str | None:
    """Run ``action`` up to ``attempts`` times; the last error's text, or None on success."""
    error: str | None = None
    delays = backoff_delays(attempts, policy.backoff, policy.max_backoff)
    for attempt in range(attempts):
        try:
            action()
            return None
        except DestinationUnreachable:
            raise  # not this write's fault: no retry of it, no replay (see ``reaching``)
        except Exception as exc:  # any failure of a sink is retried; the text is kept for the report
            error = f"{type(exc).__name__}: {exc}"
            log.warning("%s failed (attempt %d/%d): %s", what, attempt + 1, attempts, error)
            delay = next(delays, None)
            if delay is not None:
                sleep(delay)
    return error


def _bind(write: Callable[[int, int], None], i: int) -> Callable[[], None]:
    return lambda: write(i, i + 1)


def deliver(
    n: int,
    write: Callable[[int, int], None],
    policy: RetryPolicy,
    *,
    dead_letter: Callable[[int, str], None] | None = None,
    progress: Progress | None = None,
    sleep: Callable[[float], None] = time.sleep,
    what: str = "sink",
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Write positions ``[0, n)`` through ``write(lo, hi)``; see the module docstring.

    ``progress(written)`` is called as the written prefix grows during a replay (so a crash or a
    stop mid-replay resumes after the last good record). ``dead_letter(position, error)`` takes a
    record that failed ``record_attempts`` times; if it raises, the replay stops there.
    A :class:`DestinationUnreachable` is no record's fault: waited out (``reaching``), and if it
    persists the outcome says so in ``unreachable``, with the records written before it.
    """
    if n == 0:
        return Outcome(0)
    outcome = Outcome(0)
    try:
        return _deliver(
            n,
            reaching(write, policy, sleep, clock, what),
            policy,
            outcome,
            dead_letter,
            progress,
            sleep,
            what,
        )
    except DestinationUnreachable as exc:
        outcome.unreachable = str(exc)
        return outcome


def reaching(
    write: Callable[[int, int], None],
    policy: RetryPolicy,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
    what: str,
) -> Callable[[int, int], None]:
    """``write``, waiting out an unreachable destination: tried again with backoff for up to
    ``policy.outage`` seconds (one warning, a reminder a minute), then the error is raised. A
    permanent one (a missing database, a refused login) is raised at once."""

    def attempt(lo: int, hi: int) -> None:
        ride_out(
            lambda: write(lo, hi),
            what=what,
            errors=(DestinationUnreachable,),
            limit=policy.outage,
            throttle=WarningThrottle(log, OUTAGE_REMINDER, clock=clock),
            backoff=policy.backoff,
            max_backoff=policy.max_backoff,
            sleep=sleep,
            clock=clock,
            hopeless=lambda exc: bool(getattr(exc, "permanent", False)),
        )

    return attempt


def _deliver(
    n: int,
    write: Callable[[int, int], None],
    policy: RetryPolicy,
    outcome: Outcome,
    dead_letter: Callable[[int, str], None] | None,
    progress: Progress | None,
    sleep: Callable[[float], None],
    what: str,
) -> Outcome:
    error = _try(lambda: write(0, n), policy.attempts, policy, sleep, f"{what}: batch of {n}")
    if error is None:
        return Outcome(n)
    log.warning("%s: batch keeps failing; replaying its %d records one at a time", what, n)
    outcome.replayed = True
    for i in range(n):
        rec_error = _try(_bind(write, i), policy.record_attempts, policy, sleep, f"{what}: record {i}")
        if rec_error is not None:
            if dead_letter is None:
                outcome.failed_at, outcome.error = i, rec_error
                return outcome
            try:
                dead_letter(i, rec_error)
            except Exception as exc:
                outcome.failed_at = i
                outcome.error = (
                    f"{rec_error}; and the dead-letter sink failed too: {type(exc).__name__}: {exc}"
                )
                return outcome
            outcome.dead.append((i, rec_error))
        outcome.written = i + 1
        if progress is not None:
            progress(i + 1)
    return outcome


# --- positions in a sorted batch -----------------------------------------------------------------
def resume_position(offsets: Sequence[int], last: int | None, rank: int) -> int:
    """Where to resume in a batch sorted by offset (stable), after ``(last, rank)`` progress.

    Progress is stored by offset — "every record below ``last``, plus the first ``rank`` with
    offset ``last``" — not by position, so it stays right if an operator skips a record in
    between. ``last=None`` means nothing was written.
    """
    if last is None:
        return 0
    import bisect

    lo = bisect.bisect_left(offsets, last)
    hi = bisect.bisect_right(offsets, last)
    return min(lo + rank, hi)


def progress_at(offsets: Sequence[int], position: int) -> tuple[int | None, int]:
    """The ``(last, rank)`` progress after the first ``position`` records of a sorted batch."""
    if position <= 0:
        return None, 0
    last = offsets[position - 1]
    import bisect

    return last, position - bisect.bisect_left(offsets, last)
