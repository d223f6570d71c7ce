"""Following the tail: block until new records arrive, across threads and processes, without spinning."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sluiceway.journal import Journal, Record
from sluiceway.journal.notify import InotifyWatcher, PollingWatcher, make_watcher
from sluiceway.testing import wait_until
from tests.support.journal import append, spawn


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "journal")


def collect(it: object, into: list[Record]) -> threading.Thread:
    def run() -> None:
        into.extend(it)  # type: ignore[call-overload]

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("read_only", [False, True], ids=["writer-view", "read-only-view"])
def test_follow_gets_records_appended_later(path: str, read_only: bool) -> None:
    with Journal.open(path, segment_bytes=4096) as j:
        append(j, ("old", b""))
        reader = Journal.open(path, read_only=True) if read_only else j
        got: list[Record] = []
        t = collect(reader.read(follow=True, to_offset=60), got)
        wait_until(lambda: len(got) == 1, timeout=10)
        for i in range(59):  # enough to roll segments while the follower waits
            append(j, (f"new{i}", b"x" * 100))
        t.join(10)
        assert not t.is_alive()
        assert [r.offset for r in got] == list(range(60))
        if read_only:
            reader.close()


def test_follow_timeout_is_an_idle_timeout(path: str) -> None:
    with Journal.open(path) as j:
        append(j, ("a", b""))
        start = time.monotonic()
        assert [r.key for r in j.read(follow=True, timeout=0.2)] == ["a"]
        assert 0.15 <= time.monotonic() - start < 5


@pytest.mark.parametrize("use_inotify", [True, False], ids=["inotify", "polling"])
def test_waiting_follower_does_not_spin(path: str, use_inotify: bool) -> None:
    with Journal.open(path) as j:
        append(j, ("a", b""))
        reader = Journal.open(path, read_only=True, use_inotify=use_inotify)
        cpu: list[float] = []

        def follow() -> None:
            t0 = time.thread_time()
            list(reader.read(follow=True, timeout=1.0))
            cpu.append(time.thread_time() - t0)

        t = threading.Thread(target=follow)
        t.start()
        t.join(10)
        reader.close()
    assert cpu and cpu[0] < 0.1, f"follower used {cpu} s of CPU while idle for 1 s"


def test_close_wakes_followers(path: str) -> None:
    j = Journal.open(path)
    reader = Journal.open(path, read_only=True)
    got_w: list[Record] = []
    got_r: list[Record] = []
    tw = collect(j.read(follow=True), got_w)
    tr = collect(reader.read(follow=True), got_r)
    append(j, ("a", b""))
    wait_until(lambda: len(got_w) == 1 and len(got_r) == 1, timeout=10)
    j.close()
    reader.close()
    tw.join(10)
    tr.join(10)
    assert not tw.is_alive() and not tr.is_alive()


@pytest.mark.parametrize("use_inotify", ["1", "0"], ids=["inotify", "polling"])
def test_follower_in_another_process(path: str, use_inotify: str) -> None:
    with Journal.open(path) as j:
        append(j, ("before", b""))
        with spawn(
            """
            import sys
            from sluiceway.journal import Journal
            with Journal.open(sys.argv[1], read_only=True, use_inotify=sys.argv[2] == "1") as r:
                for rec in r.read(follow=True, timeout=20):
                    print(rec.offset, rec.key, flush=True)
                    if rec.key == "last":
                        break
            """,
            path,
            use_inotify,
        ) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().split() == ["0", "before"]
            # The reader is now blocked waiting; everything below arrives after it started.
            for i in range(5):
                append(j, (f"k{i}", b"v"))
            append(j, ("last", b""))
            out, err = proc.communicate(timeout=30)
    assert [line.split() for line in out.splitlines()] == [
        ["1", "k0"],
        ["2", "k1"],
        ["3", "k2"],
        ["4", "k3"],
        ["5", "k4"],
        ["6", "last"],
    ], err
    assert proc.returncode == 0


def test_watchers(tmp_path: Path) -> None:
    import os

    target = tmp_path / "HEAD"
    target.write_bytes(b"0")
    r, w = os.pipe()
    try:
        watcher = make_watcher(str(target), r)
        assert isinstance(watcher, InotifyWatcher)
        start = time.monotonic()
        watcher.wait(0.05)  # nothing happens: times out
        assert time.monotonic() - start >= 0.04
        target.write_bytes(b"1")
        start = time.monotonic()
        watcher.wait(5)  # the queued modification wakes it at once
        assert time.monotonic() - start < 1
        watcher.close()
        polling = make_watcher(str(target), r, use_inotify=False)
        assert isinstance(polling, PollingWatcher)
        delays = []
        for _ in range(12):
            delays.append(polling.delay)
            polling.wait(0)
        assert delays[0] == polling.min_delay and max(delays) == polling.max_delay
        polling.progressed()
        assert polling.delay == polling.min_delay
        os.write(w, b"x")  # the owner closing wakes a long wait at once
        start = time.monotonic()
        PollingWatcher(r, min_delay=5, max_delay=5).wait(None)
        assert time.monotonic() - start < 1
    finally:
        os.close(r)
        os.close(w)
