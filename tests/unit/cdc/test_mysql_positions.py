"""Binlog positions as text, both ways (``inspect`` prints them, ``skip --lsn`` reads them), and
the bytes of binlog a capture has yet to publish."""

from __future__ import annotations

import pytest

from sluiceway.cdc.mysql.assemble import position
from sluiceway.cdc.mysql.capture import describe_position, parse_position
from sluiceway.cdc.mysql.progress import behind_bytes


@pytest.mark.parametrize(
    ("value", "files"),
    [
        (position(3, 1234), {3: "binlog.000003"}),
        (position(42, 4), None),
        (position(2, 530, 1), {2: "mysql-bin.000002"}),
        (position(7, 0xFFFFFFFF, 3), {7: "b.000007"}),
    ],
)
def test_a_position_reads_back_as_itself(value: int, files: dict[int, str] | None) -> None:
    assert parse_position(describe_position(value, files)) == value


def test_the_forms_taken_and_refused() -> None:
    assert parse_position("  binlog.000003:1234 ") == position(3, 1234)
    assert parse_position("#3:1234") == parse_position("3:1234") == position(3, 1234)
    assert parse_position("binlog.000003:1234(epoch 2)") == position(3, 1234, 2)
    for bad in ("", "0/1A2B3C8", "binlog.000003", "binlog.000003:", "binlog:12", "3:-1", "3:12 (epoch x)"):
        with pytest.raises(ValueError):
            parse_position(bad)


def test_behind_counts_the_rest_of_the_file_and_every_later_one() -> None:
    logs = {4: ("b.000004", 1000), 5: ("b.000005", 300)}
    assert behind_bytes(position(5, 300), logs) == 0
    assert behind_bytes(position(4, 900), logs) == 100 + 300
    assert behind_bytes(position(4, 1200), logs) == 300  # a position past a file's size: none of it
    assert behind_bytes(position(3, 10), logs) is None  # its file purged: unknown, not zero
