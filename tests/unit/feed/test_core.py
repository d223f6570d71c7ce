"""Pure rules: outcomes of processor answers, retries with backoff, the fan-in decision."""

from __future__ import annotations

import pytest

from sluiceway.feed import Item, ProcessorError, ProcessorResult, Status
from sluiceway.feed.core import (
    Claimed,
    Decision,
    GateSummary,
    OutcomeKind,
    RetryPolicy,
    decide,
    describe_error,
    process_one,
    requeue_outcome,
)

POLICY = RetryPolicy(max_attempts=3, backoff=1.0, max_backoff=10.0)


def claimed(attempts: int = 1, gate: int = 2) -> Claimed:
    return Claimed(id=7, partition_id=3, gate=gate, data=b"in", attempts=attempts, version=5)


def item_of(c: Claimed) -> Item:
    return Item(
        id=c.id, partition="p", gate=c.gate, data=c.data, attempt=c.attempts, partition_id=c.partition_id
    )


def run(fn, c: Claimed | None = None):  # type: ignore[no-untyped-def]
    c = c or claimed()
    return process_one(fn, c, item_of(c), POLICY, rand=lambda: 0.0)


def test_done_completes_with_new_data_and_keeps_the_claim_version() -> None:
    out = run(lambda item: {"done": True, "data": {"text": "ok"}})
    assert out.kind is OutcomeKind.DONE and out.status is Status.COMPLETE
    assert out.data == b'{"text":"ok"}' and out.version == 5 and out.gate == 2 and out.result == "done"


def test_moving_to_a_later_gate_starts_a_fresh_step() -> None:
    out = run(lambda item: ProcessorResult(gate=4, done=False), claimed(attempts=2))
    assert out.kind is OutcomeKind.MOVED and out.status is Status.AVAILABLE
    assert (out.gate, out.attempts, out.data) == (4, 0, None)


def test_same_gate_again_is_allowed() -> None:
    assert run(lambda item: {"gate": 2, "done": False}).kind is OutcomeKind.MOVED


def test_moving_below_the_gate_is_a_failure() -> None:
    out = run(lambda item: {"gate": 1, "done": False})
    assert out.kind is OutcomeKind.RETRY and "below its gate 2" in (out.error or "")


def test_exceptions_retry_with_exponential_backoff_then_fail() -> None:
    def boom(item: Item) -> object:
        raise ValueError("downstream said no")

    first = run(boom, claimed(attempts=1))
    second = run(boom, claimed(attempts=2))
    last = run(boom, claimed(attempts=3))
    assert first.kind is OutcomeKind.RETRY and first.status is Status.AVAILABLE
    assert first.error == "ValueError: downstream said no"
    assert (first.delay, second.delay) == (0.5, 1.0)  # equal jitter with rand() = 0: half the window
    assert last.kind is OutcomeKind.FAILED and last.status is Status.FAILED and last.attempts == 3


def test_backoff_is_capped_and_jittered() -> None:
    policy = RetryPolicy(max_attempts=99, backoff=1.0, max_backoff=8.0)
    assert policy.delay(10, lambda: 1.0) == 8.0
    assert policy.delay(10, lambda: 0.0) == 4.0
    assert policy.delay(2, lambda: 0.5) == 1.5


def test_non_retryable_errors_fail_at_once() -> None:
    def permanent(item: Item) -> object:
        raise ProcessorError("bad input", retryable=False)

    out = run(permanent)
    assert out.kind is OutcomeKind.FAILED and out.error == "bad input"


@pytest.mark.parametrize(
    ("answer", "fragment"),
    [
        (None, "returned NoneType"),
        ({"gate": "1", "done": False}, "'gate' must be an integer"),
        ({"done": "yes"}, "'done' must be true or false"),
        ({"done": False}, "must give 'gate'"),
        ({"gate": 1, "done": True, "extra": 1}, "unknown field"),
        ({"done": True, "data": 3.5}, "item data must be"),
        ({"retry_in": "soon"}, "'retry_in': expected a duration"),
        ({"retry_in": -1}, "'retry_in': must not be negative"),
        ({"retry_in": "5s", "gate": 3}, "cannot come with 'gate' or 'done'"),
        ({"retry_in": "5s", "done": True}, "cannot come with 'gate' or 'done'"),
    ],
)
def test_malformed_answers_are_item_failures(answer: object, fragment: str) -> None:
    out = run(lambda item: answer)
    assert out.kind is OutcomeKind.RETRY
    assert fragment in (out.error or ""), out.error


def test_claims_that_never_reported_back_give_up() -> None:
    calls: list[Item] = []
    out = run(lambda item: calls.append(item), claimed(attempts=4))
    assert calls == [] and out.kind is OutcomeKind.FAILED and "never reported back" in (out.error or "")


def test_requeue_gives_back_the_attempt() -> None:
    out = requeue_outcome(claimed(attempts=2))
    assert (out.kind, out.status, out.attempts, out.delay) == (OutcomeKind.REQUEUE, Status.AVAILABLE, 1, 0.0)


@pytest.mark.parametrize(
    ("answer", "seconds"),
    [({"retry_in": "30s"}, 30.0), ({"retry_in": 2.5}, 2.5), (ProcessorResult(retry_in=0.5), 0.5)],
)
def test_retry_in_defers_without_counting_an_attempt(answer: object, seconds: float) -> None:
    # The claim counted attempt 3; the item goes back as it was before that claim (2), at its
    # gate, after the delay — not a failure, however many times it is asked for.
    out = run(lambda item: answer, claimed(attempts=3))
    assert (out.kind, out.status, out.gate, out.attempts, out.delay, out.error) == (
        OutcomeKind.DEFERRED, Status.AVAILABLE, 2, 2, seconds, None,
    )  # fmt: skip


def test_retry_in_may_carry_new_data() -> None:
    out = run(lambda item: {"retry_in": "1m", "data": {"polls": 1}})
    assert (out.kind, out.delay, out.data) == (OutcomeKind.DEFERRED, 60.0, b'{"polls":1}')


def test_long_errors_are_cut() -> None:
    assert len(describe_error(RuntimeError("x" * 10_000))) == 2000


def summary(open: bool = False, failed: bool = False, next_gate: int | None = None) -> GateSummary:
    return GateSummary(partition_id=1, version=3, gate=0, open=open, failed=failed, next_gate=next_gate)


@pytest.mark.parametrize(
    ("s", "manual", "decision"),
    [
        (summary(open=True, next_gate=1), False, Decision.WAIT),
        (summary(open=True, failed=True), False, Decision.WAIT),  # the rest of the gate still runs
        (summary(failed=True, next_gate=1), False, Decision.FAIL),
        (summary(next_gate=1), False, Decision.ADVANCE),
        (summary(), False, Decision.COMPLETE),
        (summary(next_gate=1), True, Decision.WAIT),
        (summary(), True, Decision.WAIT),
        (summary(failed=True), True, Decision.FAIL),
    ],
)
def test_fan_in_rule(s: GateSummary, manual: bool, decision: Decision) -> None:
    assert decide(s, manual=manual) is decision


def test_retry_policy_is_validated() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
