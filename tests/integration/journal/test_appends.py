"""Appends: all-or-nothing, durable before success, group commit, offsets, expectations, registers."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sluiceway.journal import (
    AppendAborted,
    ExpectationFailed,
    InvalidJournalRecord,
    Journal,
    JournalClosedError,
    JournalError,
)
from sluiceway.journal import segment as segment_mod
from sluiceway.testing import wait_until
from tests.support.journal import append, keys, spawn


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "journal")


@pytest.fixture
def journal(path: str) -> Iterator[Journal]:
    with Journal.open(path) as j:
        yield j


def sizes(path: str) -> dict[str, int]:
    return {
        name: os.path.getsize(os.path.join(path, name)) for name in os.listdir(path) if name.endswith(".seg")
    }


# --- all-or-nothing -------------------------------------------------------------------------
def test_commit_assigns_contiguous_offsets_and_records_read_back(journal: Journal) -> None:
    ts = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    with journal.append() as tx:
        tx.write("a", b"1", headers=[("h", "1"), ("h", "2")], namespace="orders", timestamp=ts)
        tx.write("b", None)
        tx.write("c", bytearray(b"3"), timestamp=1_000_000)
    assert tx.offsets == range(0, 3)
    assert append(journal, ("d", b"4")) == range(3, 4)
    records = list(journal.read())
    assert [(r.offset, r.namespace, r.key, r.value) for r in records] == [
        (0, "orders", "a", b"1"),
        (1, "", "b", None),
        (2, "", "c", b"3"),
        (3, "", "d", b"4"),
    ]
    assert records[0].headers == [("h", "1"), ("h", "2")]
    assert records[0].timestamp == ts
    assert records[2].timestamp == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert journal.head == 4


def test_write_takes_str_values_as_utf8_like_a_kafka_producer(journal: Journal) -> None:
    with journal.append() as tx:
        tx.write("a", "prix: 12 €", namespace="orders")
        tx.write("b", "")
        tx.write("c", memoryview(b"raw"))
        with pytest.raises(InvalidJournalRecord, match="value"):
            tx.write("d", "\ud800")  # a lone surrogate has no UTF-8 form
        with pytest.raises(InvalidJournalRecord, match="key"):
            tx.write(b"e", "v")  # type: ignore[arg-type]  # keys stay str, as before
    assert tx.offsets == range(0, 3)
    assert [(r.key, r.value) for r in journal.read()] == [
        ("a", "prix: 12 €".encode()),
        ("b", b""),
        ("c", b"raw"),
    ]


def test_abort_and_exception_leave_nothing(journal: Journal, path: str) -> None:
    append(journal, ("keep", b"1"))
    before = sizes(path)
    with journal.append() as tx:
        tx.write("x", b"never")
        tx.abort()
    with pytest.raises(AppendAborted):
        tx.write("y", b"")
    with pytest.raises(AppendAborted):
        _ = tx.offsets
    with pytest.raises(RuntimeError, match="boom"), journal.append() as tx2:
        tx2.write("z", b"never")
        raise RuntimeError("boom")
    assert sizes(path) == before
    assert keys(list(journal.read())) == ["keep"]
    # Aborted appends consumed no offsets.
    assert append(journal, ("next", b"")) == range(1, 2)


def test_sigkill_mid_append_leaves_nothing_visible(path: str) -> None:
    with Journal.open(path) as j:
        append(j, ("before", b"1"))
    with spawn(
        """
        import sys
        from sluiceway.journal import Journal
        j = Journal.open(sys.argv[1])
        tx = j.append(set_registers={"applied": "yes"})
        for i in range(1000):
            tx.write(f"k{i}", b"x" * 100)
        print("writing", flush=True)
        sys.stdin.read()  # hold the append open until killed
        """,
        path,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    with Journal.open(path) as j:
        assert keys(list(j.read())) == ["before"]
        assert j.registers() == {}
        assert append(j, ("after", b"")) == range(1, 2)


def test_invalid_records_are_rejected_before_anything_is_written(journal: Journal) -> None:
    with journal.append() as tx:
        with pytest.raises(InvalidJournalRecord, match="key"):
            tx.write(1, b"")  # type: ignore[arg-type]
        with pytest.raises(InvalidJournalRecord, match="value"):
            tx.write("k", 1)  # type: ignore[arg-type]
        with pytest.raises(InvalidJournalRecord, match="headers"):
            tx.write("k", b"", headers=[("a", 1)])  # type: ignore[list-item]
        with pytest.raises(InvalidJournalRecord, match="timestamp"):
            tx.write("k", b"", timestamp=datetime(2026, 1, 1))  # naive
        with pytest.raises(InvalidJournalRecord, match="timestamp"):
            tx.write("k", b"", timestamp=1 << 63)
        with pytest.raises(InvalidJournalRecord, match="namespace"):
            tx.write("k", b"", namespace="n" * 70000)
        tx.write("ok", b"")
    assert tx.offsets == range(0, 1)


# --- durability -----------------------------------------------------------------------------
def test_segments_are_written_synchronously(path: str) -> None:
    with Journal.open(path) as j:
        assert fcntl.fcntl(j._writer.seg_fd, fcntl.F_GETFL) & os.O_DSYNC
    with Journal.open(path, fsync=False) as j:
        assert not fcntl.fcntl(j._writer.seg_fd, fcntl.F_GETFL) & os.O_DSYNC


def test_success_and_visibility_only_once_the_write_is_durable(
    journal: Journal, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    append(journal, ("first", b""))
    entered, release = threading.Event(), threading.Event()
    real = os.pwritev

    def slow_durable_write(fd: int, buffers: list[bytes], pos: int) -> int:
        entered.set()
        release.wait(10)  # the disk is slow to acknowledge
        return real(fd, buffers, pos)

    monkeypatch.setattr(os, "pwritev", slow_durable_write)
    done: list[range] = []
    t = threading.Thread(target=lambda: done.append(append(journal, ("second", b""))))
    t.start()
    assert entered.wait(10)
    # The append is committing but not yet durable: no success, and no reader may see it.
    assert not done
    assert journal.head == 1
    assert keys(list(journal.read())) == ["first"]
    assert Journal.head_offset(path) == 1
    with Journal.open(path, read_only=True) as reader:
        assert keys(list(reader.read())) == ["first"]
    release.set()
    t.join(10)
    assert done == [range(1, 2)]
    assert Journal.head_offset(path) == 2
    assert keys(list(journal.read())) == ["first", "second"]


def test_new_segment_is_synced_with_its_directory(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    synced_dirs: list[str] = []
    real = segment_mod.fsync_dir
    monkeypatch.setattr(segment_mod, "fsync_dir", lambda d: (synced_dirs.append(d), real(d))[1])
    with Journal.open(path, segment_bytes=4096) as j:
        synced_dirs.clear()
        for i in range(40):
            append(j, (f"k{i}", b"x" * 200))
        n_segments = len(j.segments())
    assert n_segments > 3
    assert synced_dirs.count(path) == n_segments - 1


def test_group_commit_shares_one_durable_write_between_threads(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = 0  # each pwritev on an O_DSYNC segment is one sync
    real = os.pwritev
    gate = threading.Event()

    def counting_write(fd: int, buffers: list[bytes], pos: int) -> int:
        nonlocal syncs
        syncs += 1
        if syncs == 1:
            gate.wait(10)  # hold the first write until every thread has queued an append behind it
        return real(fd, buffers, pos)

    monkeypatch.setattr(os, "pwritev", counting_write)
    threads, per_thread, results = 16, 5, []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for i in range(per_thread):
            r = append(journal, (f"t{n}-{i}", b"v"))
            with lock:
                results.append(r.start)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    wait_until(lambda: len(journal._writer._queue) >= threads - 1, timeout=10, message="appenders to queue")
    gate.set()
    for t in pool:
        t.join(20)
    total = threads * per_thread
    assert sorted(results) == list(range(total))  # every offset exactly once
    assert syncs <= total // 3, f"{syncs} durable writes for {total} appends"
    assert len(list(journal.read())) == total


def test_failed_durable_write_stops_appends_until_reopen(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    j = Journal.open(path)
    append(j, ("ok", b""))
    real = os.pwritev

    def failing(fd: int, buffers: list[bytes], pos: int) -> int:
        real(fd, buffers, pos)  # the bytes may have reached the disk, the sync failed
        raise OSError(errno.EIO, "simulated I/O error")

    monkeypatch.setattr(os, "pwritev", failing)
    with pytest.raises(JournalError, match="I/O error"):
        append(j, ("maybe", b""))
    monkeypatch.undo()
    with pytest.raises(JournalError, match="reopened"):
        append(j, ("refused", b""))
    j.close()
    with Journal.open(path) as j2:
        # The unsynced append may or may not have survived; either way offsets continue from it.
        got = keys(list(j2.read()))
        assert got in (["ok"], ["ok", "maybe"])
        assert append(j2, ("next", b"")).start == len(got)


def test_failed_write_is_rolled_back_and_journal_stays_usable(
    journal: Journal, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    append(journal, ("ok", b""))
    before = sizes(path)

    def full(fd: int, buffers: object, pos: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full)
    with pytest.raises(JournalError, match="No space"):
        append(journal, ("lost", b"x" * 100))
    monkeypatch.undo()
    assert sizes(path) == before
    assert append(journal, ("next", b"")) == range(1, 2)
    assert keys(list(journal.read())) == ["ok", "next"]


# --- expectations and registers --------------------------------------------------------------
def test_wrong_expect_offset_fails_and_changes_nothing(journal: Journal, path: str) -> None:
    append(journal, ("a", b""))
    before = sizes(path)
    with (
        pytest.raises(ExpectationFailed) as exc,
        journal.append(expect_offset=0, set_registers={"r": "x"}) as tx,
    ):
        tx.write("b", b"")
    assert (exc.value.what, exc.value.expected, exc.value.actual) == ("offset", 0, 1)
    assert sizes(path) == before and journal.registers() == {} and journal.head == 1
    assert append(journal, ("b", b""), expect_offset=1) == range(1, 2)


def test_register_expectations_fence_writers(journal: Journal, path: str) -> None:
    append(journal, ("a", b""), set_registers={"leader": "n1", "epoch": "1"})
    before = sizes(path)
    with pytest.raises(ExpectationFailed) as exc:
        append(journal, ("b", b""), expect_registers={"epoch": "0"}, set_registers={"epoch": "2"})
    assert (exc.value.what, exc.value.expected, exc.value.actual) == ("register:epoch", "0", "1")
    with pytest.raises(ExpectationFailed):
        append(journal, ("b", b""), expect_registers={"leader": None})
    assert sizes(path) == before and journal.registers() == {"leader": "n1", "epoch": "1"}
    append(journal, ("b", b""), expect_registers={"epoch": "1", "other": None}, set_registers={"epoch": "2"})
    assert journal.registers() == {"leader": "n1", "epoch": "2"}


def test_concurrent_compare_and_set_on_a_register(journal: Journal) -> None:
    append(journal, set_registers={"n": "0"})
    won: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(20):
            n = int(journal.registers()["n"])
            try:
                append(
                    journal,
                    ("inc", str(n).encode()),
                    expect_registers={"n": str(n)},
                    set_registers={"n": str(n + 1)},
                )
            except ExpectationFailed:
                continue
            with lock:
                won.append(n)

    pool = [threading.Thread(target=worker) for _ in range(8)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(30)
    assert sorted(won) == list(range(len(won)))  # each value won exactly once
    assert journal.registers()["n"] == str(len(won))
    assert [r.value for r in journal.read()] == [str(i).encode() for i in range(len(won))]


def test_registers_survive_restart_and_segment_rolls(path: str) -> None:
    with Journal.open(path, segment_bytes=4096) as j:
        append(j, set_registers={"only": "registers"})  # a register-only append
        for i in range(30):
            append(j, (f"k{i}", b"x" * 300), set_registers={"last": str(i)})
        assert len(j.segments()) > 2
    with Journal.open(path, read_only=True) as r:
        assert r.registers() == {"only": "registers", "last": "29"}
    with Journal.open(path) as j:
        assert j.registers() == {"only": "registers", "last": "29"}
        assert j.head == 30


def test_offsets_continue_across_restarts(path: str) -> None:
    for round_ in range(3):
        with Journal.open(path) as j:
            assert append(j, ("a", b""), ("b", b"")) == range(2 * round_, 2 * round_ + 2)
    with Journal.open(path) as j:
        assert [r.offset for r in j.read()] == list(range(6))


def test_closed_journal_refuses_work(path: str) -> None:
    j = Journal.open(path)
    tx = j.append()
    tx.write("k", b"")
    j.close()
    with pytest.raises(JournalClosedError):
        tx.commit()
    with pytest.raises(JournalClosedError):
        j.append()
    with pytest.raises(JournalClosedError):
        list(j.read())
    j.close()  # idempotent
