"""Offset arithmetic of the sources: admission control, AvailableNow targets, task splits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluiceway.pipeline.errors import SourceOptionError
from sluiceway.pipeline.offsets import (
    cap_to_target,
    distribute_limit,
    next_end,
    parse_max_records,
    split_range,
    take_one,
)


def test_next_end_respects_limit_target_and_never_goes_back() -> None:
    assert next_end(0, 100, None) == 100
    assert next_end(0, 100, 30) == 30
    assert next_end(90, 100, 30) == 100
    assert next_end(10, 100, 30, target=20) == 20
    assert next_end(50, 100, None, target=20) == 50  # past the target: nothing more
    assert next_end(50, 10, None) == 50  # head below start (truncated by hand): no new data
    assert next_end(5, 6, 1) == 6  # step: one record


def test_split_range() -> None:
    assert split_range(0, 0, 4) == []
    assert split_range(0, 10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_range(100, 110, 4, min_size=5) == [(100, 105), (105, 110)]
    assert split_range(0, 3, 8, min_size=4096) == [(0, 3)]


@given(st.integers(0, 10**6), st.integers(0, 10**5), st.integers(1, 64), st.integers(1, 5000))
def test_split_range_covers_exactly(lo: int, size: int, parts: int, min_size: int) -> None:
    ranges = split_range(lo, lo + size, parts, min_size)
    if size == 0:
        assert ranges == []
        return
    assert ranges[0][0] == lo and ranges[-1][1] == lo + size
    assert all(a < b for a, b in ranges)
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))
    assert len(ranges) <= parts


def test_distribute_limit_shares_by_backlog() -> None:
    start = {"t/0": 0, "t/1": 0, "t/2": 0}
    latest = {"t/0": 900, "t/1": 100, "t/2": 0}
    assert distribute_limit(start, latest, None) == latest
    assert distribute_limit(start, latest, 100) == {"t/0": 90, "t/1": 10, "t/2": 0}
    # a new partition starts at 0; a vanished one keeps its position
    assert distribute_limit({"t/0": 5, "gone/0": 7}, {"t/0": 5, "t/9": 3}, 10) == {
        "t/0": 5,
        "t/9": 3,
        "gone/0": 7,
    }


@given(
    st.dictionaries(
        st.sampled_from([f"t/{i}" for i in range(6)]), st.tuples(st.integers(0, 500), st.integers(0, 500))
    ),
    st.integers(1, 700),
)
def test_distribute_limit_never_exceeds_the_budget(parts: dict[str, tuple[int, int]], limit: int) -> None:
    start = {p: a for p, (a, _) in parts.items()}
    latest = {p: a + b for p, (a, b) in parts.items()}
    ends = distribute_limit(start, latest, limit)
    total = sum(ends[p] - start[p] for p in parts)
    assert total == min(limit, sum(b for _, b in parts.values()))
    assert all(start[p] <= ends[p] <= latest[p] for p in parts)


def test_cap_to_target_and_take_one() -> None:
    assert cap_to_target({"a": 10, "b": 5}, None) == {"a": 10, "b": 5}
    assert cap_to_target({"a": 10, "b": 5}, {"a": 7}) == {"a": 7, "b": 5}
    assert take_one({"a": 3, "b": 0}, {"a": 3, "b": 2}) == {"a": 3, "b": 1}
    assert take_one({"a": 3}, {"a": 3}) == {"a": 3}


def test_parse_max_records() -> None:
    assert parse_max_records(None) == 100_000
    assert parse_max_records("5") == 5
    for bad in ("0", "-1", "x"):
        with pytest.raises(SourceOptionError, match="maxRecordsPerBatch"):
            parse_max_records(bad)


def test_source_option_errors_name_the_option_and_survive_pickling() -> None:
    import pickle

    from sluiceway.errors import SluicewayError
    from sluiceway.pipeline.sources.common import int_option, required

    with pytest.raises(SourceOptionError) as info:
        int_option({"chunkSize": "many"}, "chunkSize", 1)
    assert info.value.option == "chunkSize" and isinstance(info.value, SluicewayError)
    with pytest.raises(SourceOptionError, match="option 'path' is required") as missing:
        required({}, "path", "sluice-journal")
    back = pickle.loads(pickle.dumps(missing.value))
    assert (back.option, str(back)) == ("path", "sluice-journal: option 'path' is required")
