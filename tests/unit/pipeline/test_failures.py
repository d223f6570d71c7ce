"""Retry with backoff, then one record at a time: stop at the bad record or dead-letter it."""

from __future__ import annotations

import pytest

from sluiceway.pipeline.failures import RetryPolicy, backoff_delays, deliver, progress_at, resume_position


class FlakySink:
    """Fails any write that contains a poisoned position; can also fail the first ``flaky`` writes."""

    def __init__(self, poison: set[int] = frozenset(), flaky: int = 0) -> None:  # type: ignore[assignment]
        self.poison = poison
        self.flaky = flaky
        self.written: list[int] = []
        self.calls: list[tuple[int, int]] = []

    def write(self, lo: int, hi: int) -> None:
        self.calls.append((lo, hi))
        if self.flaky:
            self.flaky -= 1
            raise ConnectionError("blip")
        if self.poison & set(range(lo, hi)):
            raise ValueError(f"poison in {lo}..{hi}")
        self.written.extend(range(lo, hi))


POLICY = RetryPolicy(attempts=3, backoff=0.5, max_backoff=1.0, record_attempts=2)


def test_backoff_delays_double_and_cap() -> None:
    assert list(backoff_delays(5, 0.5, 1.5)) == [0.5, 1.0, 1.5, 1.5]
    assert list(backoff_delays(1, 0.5, 1.5)) == []


def test_a_good_batch_is_one_write() -> None:
    sink = FlakySink()
    out = deliver(10, sink.write, POLICY, sleep=lambda s: None)
    assert out.ok and out.written == 10 and not out.replayed
    assert sink.calls == [(0, 10)]


def test_a_transient_failure_is_retried_with_backoff() -> None:
    sink, slept = FlakySink(flaky=2), []
    out = deliver(10, sink.write, POLICY, sleep=slept.append)
    assert out.ok and out.written == 10 and not out.replayed
    assert slept == [0.5, 1.0]
    assert sink.written == list(range(10))


def test_a_poison_record_stops_the_sink_at_the_last_good_one() -> None:
    sink, slept, seen = FlakySink(poison={6}), [], []
    out = deliver(10, sink.write, POLICY, sleep=slept.append, progress=seen.append)
    assert not out.ok and out.replayed
    assert out.failed_at == 6 and out.written == 6
    assert "poison in 6..7" in (out.error or "")
    assert sink.written == [0, 1, 2, 3, 4, 5]  # in order, nothing after the bad record
    assert seen == [1, 2, 3, 4, 5, 6]
    assert sink.calls[:3] == [(0, 10)] * 3 and sink.calls[-2:] == [(6, 7), (6, 7)]


def test_dead_letter_takes_the_bad_record_and_the_batch_goes_on() -> None:
    sink, dead = FlakySink(poison={2, 7}), []
    out = deliver(10, sink.write, POLICY, sleep=lambda s: None, dead_letter=lambda i, e: dead.append(i))
    assert out.ok and out.written == 10
    assert dead == [2, 7] and [i for i, _ in out.dead] == [2, 7]
    assert sink.written == [0, 1, 3, 4, 5, 6, 8, 9]


def test_a_failing_dead_letter_sink_stops_the_replay() -> None:
    def broken(i: int, e: str) -> None:
        raise OSError("dlq down")

    out = deliver(5, FlakySink(poison={3}).write, POLICY, sleep=lambda s: None, dead_letter=broken)
    assert out.failed_at == 3 and "dlq down" in (out.error or "")


def test_empty_batch() -> None:
    assert deliver(0, FlakySink(poison={0}).write, POLICY).ok


@pytest.mark.parametrize(
    ("offsets", "last", "rank", "expected"),
    [
        ([1, 2, 3, 4], None, 0, 0),
        ([1, 2, 3, 4], 2, 1, 2),
        ([1, 2, 2, 2, 5], 2, 2, 3),  # fan-out: three records at offset 2, two written
        ([1, 2, 2, 2, 5], 2, 9, 4),
        ([1, 3, 5], 2, 1, 1),  # the record at 2 was skipped meanwhile: resume at 3
        ([1, 3, 5], 9, 1, 3),
    ],
)
def test_resume_position(offsets: list[int], last: int | None, rank: int, expected: int) -> None:
    assert resume_position(offsets, last, rank) == expected


def test_progress_round_trips() -> None:
    offsets = [1, 2, 2, 2, 5, 7]
    for pos in range(len(offsets) + 1):
        last, rank = progress_at(offsets, pos)
        assert resume_position(offsets, last, rank) == pos
