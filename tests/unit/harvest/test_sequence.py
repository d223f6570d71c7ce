"""The consumer's de-duplicator: per key, only records above the last passed ``sluice-id`` pass."""

from __future__ import annotations

import pytest

from sluiceway import Deduplicator
from sluiceway.harvest.sequence import sequence_id


def h(sid: int | str) -> list[tuple[str, bytes]]:
    return [("app", b"x"), ("sluice-id", str(sid).encode()), ("sluice-leader", b"L")]


def test_a_re_sent_suffix_is_dropped_and_the_rest_passes_in_order() -> None:
    dedup = Deduplicator()
    sent = [1, 2, 3, 2, 3, 4, 4, 5, 3, 4, 5, 6]  # lost acks and failovers re-send suffixes
    assert [s for s in sent if dedup.admit(b"k", h(s))] == [1, 2, 3, 4, 5, 6]
    assert (dedup.passed, dedup.dropped) == (6, 6)


def test_keys_and_namespaces_are_independent() -> None:
    dedup = Deduplicator()
    assert dedup.admit("a", h(5)) and dedup.admit("b", h(1)) and dedup.admit("a", h(5), namespace="t2")
    assert not dedup.admit("a", h(5)) and dedup.last("a") == 5 and dedup.last("b") == 1


def test_records_without_a_sequence_header_always_pass() -> None:
    dedup = Deduplicator()
    assert dedup.admit("a", None) and dedup.admit("a", [("other", b"1")]) and dedup.admit("a", [])
    assert len(dedup) == 0


def test_state_is_bounded_least_recently_seen_key_first() -> None:
    dedup = Deduplicator(max_keys=2)
    dedup.admit("a", h(1))
    dedup.admit("b", h(1))
    dedup.admit("a", h(2))  # a is now the most recently seen
    dedup.admit("c", h(1))  # evicts b
    assert len(dedup) == 2 and dedup.last("b") is None and dedup.evicted == 1
    assert dedup.last("a") == 2 and not dedup.admit("a", h(2))


@pytest.mark.parametrize(
    "headers",
    [
        [("sluice-id", b"42")],
        [("sluice-id", "42")],
        [{"key": "sluice-id", "value": "42"}],  # the pipeline's record rows
        [("sluice-id", b"7"), ("sluice-id", b"42")],  # ours is appended last
    ],
)
def test_sequence_id_reads_every_header_shape(headers: list[object]) -> None:
    assert sequence_id(headers) == 42  # type: ignore[arg-type]
