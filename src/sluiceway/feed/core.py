"""The feed's pure decisions: what a processor's answer does to an item, when a gate advances,
how long to back off. No I/O and no wall clock: time and randomness are passed in, so every
rule is unit-tested without a database or a sleep.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from sluiceway.feed.errors import ProcessorError
from sluiceway.feed.model import Item, ProcessorResult, Status

#: Longest error text kept on an item (a huge traceback or HTML error page is cut, not stored).
MAX_ERROR_CHARS = 2000

Processor = Callable[[Item], object]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How failures are retried: ``max_attempts`` per step, then the item is ``failed``.

    Delays grow exponentially from ``backoff`` seconds up to ``max_backoff``, with "equal jitter"
    (a random point in the upper half of the window) so that items failing together — say
    because a downstream service restarted — do not come back together.
    """

    max_attempts: int = 5
    backoff: float = 1.0
    max_backoff: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("backoff delays must not be negative")

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before attempt ``attempt + 1`` after attempt ``attempt`` failed."""
        window = min(self.max_backoff, self.backoff * (2.0 ** max(0, attempt - 1)))
        return window * (0.5 + 0.5 * rand())


class Claimed(NamedTuple):
    """An item row as the claim returned it: ``version`` is the one the claim wrote.

    (Claimed and Outcome are tuples: the worker makes two per item on its hot path.)
    """

    id: int
    partition_id: int
    gate: int
    data: bytes
    attempts: int
    version: int


class OutcomeKind(enum.StrEnum):
    DONE = "done"  # the processor finished the item
    MOVED = "moved"  # the item waits at a later (or the same) gate for its next step
    RETRY = "retry"  # it failed; it comes back after a backoff
    FAILED = "failed"  # it failed max_attempts times (or permanently); it blocks its gate
    REQUEUE = "requeue"  # never started (lease nearly spent, or the worker is stopping)
    DEFERRED = "deferred"  # the processor asked for it again later (retry_in): not a failure


class Outcome(NamedTuple):
    """What to write back for one claimed item: one row of the batched completion.

    Every write is conditional on ``version`` (the claim's), so an outcome for an item whose
    claim has lapsed and been taken by another worker changes nothing.
    """

    kind: OutcomeKind
    id: int
    partition_id: int
    version: int
    status: Status
    gate: int
    attempts: int
    data: bytes | None = None
    delay: float = 0.0
    result: str | None = None
    error: str | None = None


def describe_error(exc: BaseException) -> str:
    text = str(exc).strip()
    kind = type(exc).__name__
    message = f"{kind}: {text}" if text and not isinstance(exc, ProcessorError) else (text or kind)
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 1] + "…"


def success_outcome(claimed: Claimed, result: ProcessorResult) -> Outcome:
    """Turn a processor's answer into an outcome; a move below the current gate is an error."""
    if result.retry_in is not None:
        # Not a failure: the attempt the claim counted is given back (as a requeue does), so an
        # item polled for an hour is not "failed" by max_attempts, and its backoff is its own.
        return Outcome(
            OutcomeKind.DEFERRED, claimed.id, claimed.partition_id, claimed.version, Status.AVAILABLE,
            claimed.gate, max(0, claimed.attempts - 1), data=result.data, delay=result.retry_in,
        )  # fmt: skip
    if result.done:
        # Positional: keywords cost a tuple's __new__ a third more, once per item.
        return Outcome(
            OutcomeKind.DONE, claimed.id, claimed.partition_id, claimed.version, Status.COMPLETE,
            claimed.gate, claimed.attempts, result.data, 0.0, "done",
        )  # fmt: skip
    assert result.gate is not None  # ProcessorResult.coerce guarantees a gate when not done
    if result.gate < claimed.gate:
        # The partition's gate only moves forward: an item below it would never run again and
        # would keep the partition from completing.
        raise ProcessorError(
            f"processor moved item {claimed.id} back to gate {result.gate}, below its gate {claimed.gate}"
        )
    # A new step starts with fresh attempts: its failures are not the previous step's.
    return Outcome(
        OutcomeKind.MOVED, claimed.id, claimed.partition_id, claimed.version, Status.AVAILABLE,
        result.gate, 0, data=result.data,
    )  # fmt: skip


def failure_outcome(
    claimed: Claimed,
    error: str,
    policy: RetryPolicy,
    *,
    retryable: bool = True,
    rand: Callable[[], float] = random.random,
) -> Outcome:
    if retryable and claimed.attempts < policy.max_attempts:
        return Outcome(
            OutcomeKind.RETRY, claimed.id, claimed.partition_id, claimed.version, Status.AVAILABLE,
            claimed.gate, claimed.attempts, delay=policy.delay(claimed.attempts, rand), error=error,
        )  # fmt: skip
    return Outcome(
        OutcomeKind.FAILED, claimed.id, claimed.partition_id, claimed.version, Status.FAILED,
        claimed.gate, claimed.attempts, error=error,
    )  # fmt: skip


def requeue_outcome(claimed: Claimed) -> Outcome:
    """Give an unstarted item back at once, without counting the attempt its claim counted."""
    return Outcome(
        OutcomeKind.REQUEUE, claimed.id, claimed.partition_id, claimed.version, Status.AVAILABLE,
        claimed.gate, max(0, claimed.attempts - 1),
    )  # fmt: skip


def process_one(
    processor: Processor,
    claimed: Claimed,
    item: Item,
    policy: RetryPolicy,
    rand: Callable[[], float] = random.random,
) -> Outcome:
    """Call the processor on one item and decide the outcome. Never raises for processor faults."""
    if claimed.attempts > policy.max_attempts:
        # Earlier attempts were claimed but never reported: the worker holding them died or lost
        # the item's lease mid-way. Do not let a poison item crash workers forever.
        return failure_outcome(
            claimed,
            f"gave up after {claimed.attempts - 1} attempts; the last ones never reported back "
            "(the worker crashed or overran the item lease)",
            policy,
            retryable=False,
        )
    try:
        result = ProcessorResult.coerce(processor(item))
        return success_outcome(claimed, result)
    except ProcessorError as exc:
        return failure_outcome(claimed, describe_error(exc), policy, retryable=exc.retryable, rand=rand)
    except Exception as exc:  # any fault in user code is the item's failure, not the worker's
        return failure_outcome(claimed, describe_error(exc), policy, rand=rand)


@dataclass(frozen=True, slots=True)
class GateSummary:
    """One partition at one instant (one statement, so one snapshot).

    ``open``: some item at the current gate is still available (waiting, in flight or backing
    off); ``failed``: some item failed; ``next_gate``: the lowest gate above the current one with
    available items (``None`` when there is none).
    """

    partition_id: int
    version: int
    gate: int
    open: bool
    failed: bool
    next_gate: int | None


class Decision(enum.Enum):
    WAIT = "wait"  # work remains at the gate (or manual mode waits for the caller)
    ADVANCE = "advance"  # fan-in: every item at the gate is done; move to next_gate
    COMPLETE = "complete"  # nothing left anywhere: the partition is done
    FAIL = "fail"  # the gate is blocked by failed items until retry/resolve


def decide(summary: GateSummary, *, manual: bool) -> Decision:
    """The fan-in rule. Applied with an OCC update on the summary's version, so a concurrent
    ``add_items``/``retry`` (both bump the version) makes the decision void instead of wrong."""
    if summary.open:
        return Decision.WAIT
    if summary.failed:
        return Decision.FAIL
    if manual:
        return Decision.WAIT
    return Decision.COMPLETE if summary.next_gate is None else Decision.ADVANCE
