"""The pure MP/R bookkeeping: per-key windows, pending FIFOs, in-order purges, forceRemark, invariants."""

from __future__ import annotations

import pytest

from sluiceway.errors import InvariantViolation
from sluiceway.harvest.dispatch import Dispatcher, Failure
from sluiceway.outbox.record import MarkedRecord


def rec(rid: int, key: str, topic: str = "t", leader: str = "L") -> MarkedRecord:
    return MarkedRecord(rid, None, topic, key, b"v", (), leader)


def ids(records: list[MarkedRecord]) -> list[int]:
    return [r.id for r in records]


def fail(d: Dispatcher, record: MarkedRecord) -> None:
    """A delivery failed and the engine reset the row (the window holds only this record)."""
    plan = d.acknowledge([], [record])
    assert [f.record.id for f in plan.failures] == [record.id]
    d.close_failure(plan.failures[0], settled=False)


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
    fail(d, rec(1, "a"))
    assert d.force_remark and d.pending == 0  # record 2 dropped: re-marked under the new leader id
    d.admit([rec(4, "b")])  # waits behind 3 (abandoned: forceRemark is up)
    sends, abandoned = d.admit([rec(5, "c")])
    assert abandoned and sends == []
    # While forceRemark is up, settling does not dispatch pending records (they are re-marked).
    assert d.settle([rec(3, "b")]) == []
    assert d.refresh() == 0
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
    fail(d, rec(5, "a"))
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


# -- per-key windows (perKeyInFlight > 1) ------------------------------------------------------
def test_a_window_holds_up_to_n_records_of_a_key_in_id_order() -> None:
    d = Dispatcher(100, per_key=3)
    sends, _ = d.admit([rec(i, "a") for i in (5, 1, 4, 2, 3)] + [rec(6, "b")])
    assert ids(sends) == [1, 2, 3, 6] and d.pending == 2
    # Acks out of order: nothing is purged until the window's head is acknowledged.
    assert d.acknowledge([rec(2, "a"), rec(3, "a")], []).purge == []
    plan = d.acknowledge([rec(1, "a")], [])
    assert ids(plan.purge) == [1, 2, 3]  # the acknowledged prefix, in one statement
    assert ids(d.settle(plan.purge)) == [4, 5]


def test_a_window_holds_one_destination_a_record_bound_elsewhere_waits_for_it_to_empty() -> None:
    d = Dispatcher(100, per_key=4)
    sends, _ = d.admit([rec(1, "a"), rec(2, "a", topic="u"), rec(3, "a", topic="u")])
    assert ids(sends) == [1]  # another topic is another partition: no order between them
    assert ids(d.settle(d.acknowledge([rec(1, "a")], []).purge)) == [2, 3]


def test_a_window_holds_one_leader_id_a_record_marked_under_a_later_one_waits_for_it_to_empty() -> None:
    d = Dispatcher(100, per_key=4)
    assert ids(d.admit([rec(1, "a", leader="L1"), rec(2, "b", leader="L1")])[0]) == [1, 2]
    d.refresh()  # another key failed (or a mark did): a fresh leader id while 1 is in flight
    sends, _ = d.admit([rec(3, "a", leader="L2"), rec(4, "a", leader="L2")], d.generation)
    # Not sent behind 1: a gapless publisher that drops 1 could still land them (another leader id).
    assert sends == [] and d.pending == 2
    assert ids(d.settle(d.acknowledge([rec(1, "a", leader="L1")], []).purge)) == [3, 4]


def test_a_failure_fences_the_key_and_nothing_behind_it_is_purged() -> None:
    d = Dispatcher(100, per_key=4)
    d.admit([rec(i, "a") for i in (1, 2, 3, 4)] + [rec(9, "b")])
    plan = d.acknowledge([rec(1, "a"), rec(4, "a")], [rec(2, "a")])
    # Record 1 precedes the failure, but the window has not drained (3 is in flight): wait.
    assert plan.purge == [] and plan.failures == [] and d.fenced_keys == {"a"}
    sends, _ = d.admit([rec(5, "a")])
    assert sends == []  # a fenced key sends nothing more
    plan = d.acknowledge([rec(3, "a")], [])
    assert ids(plan.purge) == [1]  # only what precedes the failure
    (failure,) = plan.failures
    assert failure == Failure("a", rec(2, "a"), (rec(3, "a"), rec(4, "a")))
    d.settle(plan.purge)
    assert not d.force_remark  # other keys flowed all along
    d.close_failure(failure, settled=False)
    assert d.force_remark and d.fenced_keys == set() and d.busy_keys() == {"b"}
    d.refresh()
    sends, _ = d.admit([rec(i, "a") for i in (2, 3, 4, 5)])
    assert ids(sends) == [2, 3, 4, 5]  # the suffix again, from the failed record, in order


def test_a_re_send_may_not_start_below_what_the_window_gave_up() -> None:
    d = Dispatcher(100, per_key=2)
    d.admit([rec(3, "a"), rec(4, "a")])
    d.acknowledge([rec(4, "a")], [rec(3, "a")])
    d.close_failure(Failure("a", rec(3, "a"), (rec(4, "a"),)), settled=False)
    d.refresh()
    with pytest.raises(InvariantViolation, match="discontinuity for key 'a'"):
        d.admit([rec(2, "a")])


def test_ready_records_of_a_fenced_key_go_back_to_be_re_marked() -> None:
    d = Dispatcher(1, per_key=3)
    sends, _ = d.admit([rec(1, "a"), rec(2, "a")])
    assert ids(sends) == [1] and d.pending == 1  # 2 waits for the throttle
    plan = d.acknowledge([], [rec(1, "a")])
    assert plan.failures == [Failure("a", rec(1, "a"))] and d.pending == 0
    d.close_failure(plan.failures[0], settled=False)
    assert d.in_flight == 0 and d.force_remark


def test_a_buried_record_with_nothing_behind_lets_its_key_go_on() -> None:
    d = Dispatcher(100, per_key=1)
    d.admit([rec(1, "a"), rec(2, "a")])
    plan = d.acknowledge([], [rec(1, "a")])
    sends = d.close_failure(plan.failures[0], settled=True)
    assert ids(sends) == [2] and not d.force_remark


def test_parking_forgets_the_key_so_a_retried_record_may_come_back_at_its_head() -> None:
    d = Dispatcher(100, per_key=2)
    d.admit([rec(5, "a"), rec(6, "a"), rec(7, "a")])
    plan = d.acknowledge([rec(6, "a")], [rec(5, "a")])
    d.close_failure(plan.failures[0], settled=True, park=True)
    assert d.force_remark and d.pending == 0  # 7 waited behind: it stays in the outbox
    d.refresh()
    # A mark made before the burial may return a stale copy of 5: it is not sent again.
    assert d.admit([rec(5, "a")], tick=d.tick - 1) == ([], False)
    # The operator retried it: a later mark returns it at the head of its key.
    sends, _ = d.admit([rec(5, "a"), rec(6, "a"), rec(7, "a")], tick=d.tick)
    assert ids(sends) == [5, 6]


def test_a_stale_copy_of_a_purged_record_is_not_sent_again() -> None:
    d = Dispatcher(100, per_key=2)
    tick = d.tick  # a mark starts; it returns rows 1 and 2 again (still there)
    d.admit([rec(1, "a"), rec(2, "a")])
    d.settle(d.acknowledge([rec(1, "a"), rec(2, "a")], []).purge)  # purged meanwhile
    sends, _ = d.admit([rec(1, "a"), rec(2, "a"), rec(3, "a")], tick=tick)
    assert ids(sends) == [3]
