"""The pure MP/R bookkeeping: barrier, pending FIFOs, forceRemark, invariants."""

from __future__ import annotations

import pytest

from sluiceway.errors import InvariantViolation
from sluiceway.harvest.dispatch import Dispatcher
from sluiceway.outbox.record import MarkedRecord


def rec(rid: int, key: str) -> MarkedRecord:
    return MarkedRecord(rid, None, "t", key, b"v", (), "L")


def test_one_record_in_flight_per_key_and_fifo_behind_it() -> None:
    d = Dispatcher(100)
    sends, abandoned = d.admit([rec(3, "b"), rec(1, "a"), rec(2, "a"), rec(4, "a")])
    assert [r.id for r in sends] == [1, 3] and not abandoned  # sorted by id; a's successors wait
    assert (d.in_flight, d.pending) == (2, 2)
    assert [r.id for r in d.settle([rec(1, "a")])] == [2]
    assert [r.id for r in d.settle([rec(2, "a")])] == [4]
    assert d.settle([rec(4, "a")]) == []
    assert d.busy_keys() == {"b"}


def test_force_remark_abandons_the_batch_and_refresh_drops_pending() -> None:
    d = Dispatcher(100)
    d.admit([rec(1, "a"), rec(2, "a"), rec(3, "b")])
    d.fail(rec(1, "a"))
    assert d.force_remark
    sends, abandoned = d.admit([rec(5, "c")])
    assert abandoned and sends == []
    # While forceRemark is up, settling does not dispatch pending records (they are re-marked).
    assert d.settle([rec(3, "b")]) == []
    assert d.refresh() == 1  # record 2 dropped: it is re-marked under the new leader id
    assert not d.force_remark and d.pending == 0


def test_re_marked_copies_of_in_flight_records_are_skipped() -> None:
    d = Dispatcher(100)
    d.admit([rec(1, "a"), rec(2, "a")])
    d.refresh()
    sends, _ = d.admit([rec(1, "a"), rec(2, "a")])  # record 1 is still in flight
    assert sends == [] and d.pending == 1
    assert [r.id for r in d.settle([rec(1, "a")])] == [2]


def test_reordering_is_an_invariant_violation() -> None:
    d = Dispatcher(100)
    d.admit([rec(5, "a")])
    d.settle([rec(5, "a")])
    with pytest.raises(InvariantViolation, match="discontinuity for key 'a'"):
        d.admit([rec(4, "a")])


def test_resend_of_the_same_id_is_allowed() -> None:
    d = Dispatcher(100)
    d.admit([rec(5, "a")])
    d.fail(rec(5, "a"))
    d.refresh()
    sends, _ = d.admit([rec(5, "a")])
    assert [r.id for r in sends] == [5]


def test_settling_what_is_not_in_flight_is_a_violation() -> None:
    d = Dispatcher(100)
    with pytest.raises(InvariantViolation):
        d.settle([rec(1, "a")])


def test_throttle_is_strict_and_ready_records_keep_their_key() -> None:
    d = Dispatcher(2)
    sends, _ = d.admit([rec(1, "a"), rec(2, "b"), rec(3, "c"), rec(4, "c"), rec(5, "d")])
    assert [r.id for r in sends] == [1, 2]  # never more than two unacknowledged
    assert (d.in_flight, d.pending) == (2, 3)
    assert not d.wait_for_room(0.01)
    # A freed slot goes to the oldest ready record; record 4 stays behind 3 (same key).
    assert [r.id for r in d.settle([rec(1, "a")])] == [3]
    assert [r.id for r in d.settle([rec(3, "c")])] == [5]
    assert [r.id for r in d.settle([rec(5, "d")])] == [4]
    assert d.settle([rec(2, "b"), rec(4, "c")]) == []
    assert d.wait_for_room(0.01) and d.busy_keys() == frozenset()


def test_abandoned_records_force_a_fresh_leader_id_before_anything_overtakes_them() -> None:
    d = Dispatcher(100)
    sends, _ = d.admit([rec(1, "a"), rec(2, "a")])
    assert [r.id for r in sends] == [1]
    d.abandon(sends)  # record 1 never went out; its row stays marked with the current id
    assert d.force_remark
    later, abandoned = d.admit([rec(3, "a")])
    assert abandoned and later == []  # nothing of key a may pass record 1
    d.refresh()  # the marker takes a new id: records 1, 2, 3 are marked again, in order
    sends, _ = d.admit([rec(1, "a"), rec(2, "a"), rec(3, "a")])
    assert [r.id for r in sends] == [1]
