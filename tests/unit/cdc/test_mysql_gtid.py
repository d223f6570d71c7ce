"""GTID states, epochs in positions, and where a binlog capture resumes after a server switch."""

from __future__ import annotations

import pytest

from sluiceway.cdc.errors import CdcError
from sluiceway.cdc.mysql.assemble import position, split_position
from sluiceway.cdc.mysql.gtid import (
    Checkpoint,
    Resume,
    advance,
    epoch_of,
    format_state,
    missing,
    parse_state,
    plan_resume,
)


def test_a_state_keeps_the_last_gtid_per_domain_and_ignores_other_forms() -> None:
    state = parse_state("0-1-100, 1-2-7")
    advance(state, "0-3-101")
    advance(state, "3E11FA47-71CA-11E1-9E33-C80AA9429562:23")  # MySQL's form: not a domain's
    advance(state, "")
    assert state == {"0": "0-3-101", "1": "1-2-7"}
    advance(state, "10-1-5")
    assert format_state(state) == "0-3-101,1-2-7,10-1-5"  # domains in number order
    assert parse_state("") == {}


def test_positions_grow_across_epochs_and_split_without_theirs() -> None:
    late_in_old = position(999_999, 0xFFFF_FFFF)
    early_in_new = position(1, 4, epoch=1)
    assert early_in_new > late_in_old
    assert epoch_of(early_in_new) == 1 and epoch_of(late_in_old) == 0
    assert split_position(early_in_new) == (1, 4)
    assert split_position(late_in_old) == (999_999, 0xFFFF_FFFF)


HELD = position(3, 900)


def test_the_same_server_resumes_by_file_and_offset() -> None:
    assert plan_resume(HELD, 1, None, gtids=True) == Resume(0)  # a log from before checkpoints
    assert plan_resume(HELD, 1, Checkpoint(1, 0, HELD, "0-1-9"), gtids=True) == Resume(0)
    moved = position(2, 100, epoch=1)
    assert plan_resume(moved, 2, Checkpoint(2, 1, moved, "0-1-9"), gtids=False) == Resume(1)


def test_another_server_resumes_from_the_gtid_state_under_a_new_epoch() -> None:
    exact = plan_resume(HELD, 2, Checkpoint(1, 0, HELD, "0-1-9"), gtids=True)
    assert exact == Resume(1, "0-1-9", behind=False)
    older = plan_resume(HELD, 2, Checkpoint(1, 0, position(3, 400), "0-1-7"), gtids=True)
    assert older == Resume(1, "0-1-7", behind=True)


def test_a_move_that_read_nothing_yet_keeps_its_epoch_and_a_second_move_takes_the_next() -> None:
    written = Checkpoint(2, 1, HELD, "0-1-9")  # saved when the capture moved to server 2
    assert plan_resume(HELD, 2, written, gtids=True) == Resume(1, "0-1-9")
    assert plan_resume(HELD, 3, written, gtids=True) == Resume(2, "0-1-9")


def test_a_switch_that_cannot_be_followed_is_refused_in_one_line() -> None:
    with pytest.raises(CdcError, match=r"server changed \(server id 1 → 2\).*MariaDB only") as mysql:
        plan_resume(HELD, 2, Checkpoint(1, 0, HELD, ""), gtids=False)
    with pytest.raises(CdcError, match="past what its log holds") as ahead:
        plan_resume(HELD, 2, Checkpoint(1, 0, HELD + 1, "0-1-9"), gtids=True)
    with pytest.raises(CdcError, match="no GTID state") as empty:
        plan_resume(HELD, 2, Checkpoint(1, 0, HELD, ""), gtids=True)
    for raised in (mysql, ahead, empty):
        assert "\n" not in str(raised.value)


def test_missing_names_the_transactions_a_server_has_not_written() -> None:
    wanted = "0-1-100,2-2-7"
    assert missing(wanted, "0-1-100,0-2-3,2-2-9") == []  # it has them (and more)
    assert missing(wanted, "0-1-98,2-2-7") == ["0-1-100"]  # a replica behind
    assert missing(wanted, "0-3-500") == ["0-1-100", "2-2-7"]  # another topology
    assert missing("", "") == []


def test_the_server_refusing_the_start_is_lost_changes_in_one_line() -> None:
    import pymysql

    from sluiceway.cdc.errors import LostChangesError, StreamInterrupted
    from sluiceway.cdc.mysql.reader import _stream_error

    refused = _stream_error(
        pymysql.err.OperationalError(1236, "Could not find GTID state requested by slave")
    )
    assert isinstance(refused, LostChangesError) and "\n" not in str(refused)
    assert "Could not find GTID state" in str(refused) and "start a fresh log" in str(refused)
    cut = _stream_error(pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query"))
    assert isinstance(cut, StreamInterrupted)
