"""A destination that cannot be reached is no record's fault: waited out, then reported as such."""

from __future__ import annotations

import pyarrow as pa

from sluiceway.pipeline.errors import DestinationUnreachable
from sluiceway.pipeline.failures import RetryPolicy, deliver
from sluiceway.pipeline.sinks.part import write_part

POLICY = RetryPolicy(attempts=3, backoff=0.5, max_backoff=4.0, record_attempts=2, outage=30.0)


class Clock:
    """A fake clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


class Destination:
    """Down for ``down_for`` seconds of the fake clock (or for good), ``permanent`` or not."""

    def __init__(self, clock: Clock, down_for: float, *, permanent: bool = False) -> None:
        self.clock, self.down_for, self.permanent = clock, down_for, permanent
        self.calls: list[tuple[int, int]] = []
        self.written: list[int] = []

    def write(self, lo: int, hi: int) -> None:
        self.calls.append((lo, hi))
        if self.clock.now < self.down_for:
            raise DestinationUnreachable("cannot connect to host=db port=5432", permanent=self.permanent)
        self.written.extend(range(lo, hi))


def test_a_short_outage_is_waited_out_with_backoff() -> None:
    clock = Clock()
    dest = Destination(clock, down_for=5.0)
    out = deliver(4, dest.write, POLICY, sleep=clock.sleep, clock=clock)
    assert out.ok and out.written == 4 and not out.replayed
    assert dest.written == [0, 1, 2, 3]
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0]  # doubling, capped at max_backoff


def test_a_long_outage_stops_without_blaming_a_record_or_replaying() -> None:
    clock = Clock()
    dest = Destination(clock, down_for=float("inf"))
    out = deliver(4, dest.write, POLICY, sleep=clock.sleep, clock=clock)
    assert not out.ok
    assert out.failed_at is None and out.written == 0 and not out.replayed
    assert out.unreachable == "destination unreachable: cannot connect to host=db port=5432"
    assert set(dest.calls) == {(0, 4)}  # the whole batch each time: never one record at a time
    assert 30.0 <= clock.now <= 30.0 + POLICY.max_backoff


def test_a_permanent_error_stops_at_once() -> None:
    clock = Clock()
    dest = Destination(clock, down_for=float("inf"), permanent=True)
    out = deliver(4, dest.write, POLICY, sleep=clock.sleep, clock=clock)
    assert out.unreachable is not None and out.failed_at is None
    assert dest.calls == [(0, 4)] and clock.sleeps == []


def test_a_part_cut_off_names_no_offset() -> None:
    clock = Clock()

    class Writer:
        def write(self, table: pa.Table, token: str) -> None:
            raise DestinationUnreachable("lost the connection", permanent=True)

        def close(self) -> None:
            pass

    table = pa.table({"offset": [10, 11, 12], "key": ["a", "b", "c"]})
    result = write_part(
        table,
        part=0,
        sink="db",
        writer=Writer(),
        dead_writer=None,
        policy=POLICY,
        run="r",
        batch=0,
        sleep=clock.sleep,
    )
    assert not result.ok
    assert result.failed_offset is None and result.written == 0
    assert (result.last, result.rank) == (None, 0)  # resumes from the first record
    assert result.error == "destination unreachable: lost the connection"
