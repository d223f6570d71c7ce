"""``sluice capture`` publishing from a process of its own (``publishProcess``, the default): the
child never outlives its term, a child that dies costs nothing but a new term, leadership gone
stops it at once, and the in-process way (``publishProcess: false``) still works."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluiceway.capture import Capture
from sluiceway.capture.config import CaptureConfig
from sluiceway.capture.offload import ProcessTarget
from sluiceway.capture.target import DeliveryFailed
from sluiceway.cdc.errors import CdcError
from sluiceway.testing import wait_until
from tests.support.brokers import Place, make_place
from tests.support.capture import Change, ItemsWriter, check_changes, config, parse, seed_items, source_rows
from tests.support.cdc import slot_confirmed, wal_now

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def items(cdc_dsn: str) -> str:
    return seed_items(cdc_dsn, 150)


@pytest.fixture
def place() -> Iterator[Place]:
    """A Redis stream prefix of the test's own, removed after."""
    made = make_place("redis")
    yield made
    made.cleanup()


def redis_capture(dsn: str, slot: str, place: Place, state: Path, **more: object) -> dict[str, Any]:
    cfg = config(dsn, slot, state, target=place.target())
    cfg["capture"].update(topic=f"{place.prefix}.{{table}}", **more)
    return cfg


def publishers_of(pid: int) -> list[int]:
    """The capture's publishing processes: children of ``pid`` started by multiprocessing's spawn."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and b"multiprocessing.spawn" in command:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def caught_up(dsn: str, slot: str, writer: ItemsWriter) -> None:
    """Stop the writer, then wait until the slot has confirmed all it wrote."""
    writer.finish()
    end = wal_now(dsn)
    wait_until(lambda: slot_confirmed(dsn, slot) >= end, timeout=60, message=f"slot {slot} to catch up")


def everything(place: Place, writer: ItemsWriter) -> list[Change]:
    """The changes the destination holds: the seeded rows' copies and every write."""
    expected = 150 + sum(len(v) for v in writer.committed.values())
    return [parse(k, v, h) for k, v, h in place.read(expected=expected)]


def test_the_publishing_process_dies_with_a_capture_killed_by_sigkill(
    items: str, place: Place, tmp_path: Path
) -> None:
    spec = tmp_path / "capture.yaml"
    spec.write_text(
        yaml.safe_dump(redis_capture(items, "off_kill", place, tmp_path / "state", snapshot="never"))
    )
    capture = subprocess.Popen(
        [sys.executable, "-m", "sluiceway.cli.main", "capture", "-f", str(spec)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: slot_confirmed(items, "off_kill") > 0, timeout=60, message="the slot")
        children = publishers_of(capture.pid)
        assert len(children) == 1, children
        capture.kill()
        capture.wait(10)
        # The kernel's parent-death signal: at once, not once its client gives up.
        wait_until(lambda: not alive(children[0]), timeout=3, message="the publisher to die")
    finally:
        if capture.poll() is None:
            capture.kill()
            capture.wait(10)


def test_sigterm_to_the_whole_process_group_is_a_clean_stop(items: str, place: Place, tmp_path: Path) -> None:
    """A service manager (systemd's default) or ``kill -- -PGID`` signals the publishing process
    too: the capture still stops as it would alone, exit 0, no failed term logged, and what it
    confirmed is in the destination."""
    cfg = redis_capture(items, "off_term", place, tmp_path / "state")
    spec = tmp_path / "capture.yaml"
    spec.write_text(yaml.safe_dump(cfg))
    writer = ItemsWriter(items, pace=0.003)
    capture = subprocess.Popen(
        [sys.executable, "-m", "sluiceway.cli.main", "capture", "-f", str(spec)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_until(lambda: slot_confirmed(items, "off_term") > 0, timeout=60, message="the slot")
        writer.start()
        wait_until(lambda: writer.ops >= 150, timeout=60, message="150 writes")
        (child,) = publishers_of(capture.pid)
        os.killpg(capture.pid, signal.SIGTERM)
        _, err = capture.communicate(timeout=60)
        assert capture.returncode == 0, err
        assert "trying again" not in err and "killed by signal" not in err, err
        assert "capture stopped" in err, err
        assert not alive(child)
    finally:
        if capture.poll() is None:
            capture.kill()
            capture.wait(10)
    # The next run goes on from where the stop confirmed: nothing lost, nothing out of order.
    with Capture(cfg):
        caught_up(items, "off_term", writer)
    check_changes(everything(place, writer), writer, source_rows(items))


def test_a_publishing_process_that_dies_ends_the_term_and_the_next_sends_everything(
    items: str, place: Place, tmp_path: Path
) -> None:
    cfg = redis_capture(items, "off_child", place, tmp_path / "state", retryBackoff="0.2s")
    writer = ItemsWriter(items, pace=0.003)
    with Capture(cfg) as capture:
        wait_until(lambda: slot_confirmed(items, "off_child") > 0, timeout=60, message="the slot")
        writer.start()
        wait_until(lambda: writer.ops >= 150, timeout=60, message="150 writes")
        (child,) = publishers_of(os.getpid())
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: capture.terms >= 2, timeout=30, message="a second term")
        wait_until(lambda: writer.ops >= 400, timeout=60, message="400 writes")
        caught_up(items, "off_child", writer)
        assert capture.is_leader
    # Re-sends allowed, nothing lost or reordered.
    check_changes(everything(place, writer), writer, source_rows(items))


def test_leadership_gone_stops_the_publishing_process_at_once(
    items: str, place: Place, tmp_path: Path
) -> None:
    cfg = redis_capture(items, "off_lead", place, tmp_path / "state")
    leading = [True]
    target = ProcessTarget(CaptureConfig.from_dict(cfg), 1, may_continue=lambda: leading[0])
    try:
        (child,) = publishers_of(os.getpid())
        target.check()
        leading[0] = False
        # The flag the child asks before each attempt is cleared by the parent's reader within
        # its look, before any append or check of the capture's.
        wait_until(lambda: not target._leading.value, timeout=1, interval=0.005)
        with pytest.raises(DeliveryFailed, match="leadership ended"):
            target.check()
    finally:
        target.close()
    assert not alive(child)


def test_publishing_from_the_captures_own_process_still_works(
    items: str, place: Place, tmp_path: Path
) -> None:
    cfg = redis_capture(items, "off_none", place, tmp_path / "state", publishProcess=False)
    writer = ItemsWriter(items, pace=0.003)
    with Capture(cfg):
        wait_until(lambda: slot_confirmed(items, "off_none") > 0, timeout=60, message="the slot")
        assert publishers_of(os.getpid()) == []
        writer.start()
        wait_until(lambda: writer.ops >= 200, timeout=60, message="200 writes")
        caught_up(items, "off_none", writer)
    assert check_changes(everything(place, writer), writer, source_rows(items)) == 0


def test_a_destination_the_publishing_process_cannot_open_is_raised_by_the_capture(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")  # a journal inside a file can never be made
    cfg = config("postgresql://127.0.0.1:9/none", "off_open", tmp_path / "state",
                 journal={"path": str(blocker / "journal")})  # fmt: skip
    with pytest.raises(CdcError, match="journal") as caught:
        ProcessTarget(CaptureConfig.from_dict(cfg), 1, may_continue=lambda: True)
    assert str(blocker) in str(caught.value) and "Traceback" not in str(caught.value)
    assert publishers_of(os.getpid()) == []


def test_a_report_the_capture_cannot_take_ends_the_term_rather_than_hanging(tmp_path: Path) -> None:
    from tests.unit.capture.test_target import batch

    cfg = config("postgresql://127.0.0.1:9/none", "off_relay", tmp_path / "state",
                 journal={"path": str(tmp_path / "j"), "fsync": False})  # fmt: skip
    target = ProcessTarget(CaptureConfig.from_dict(cfg), 1, may_continue=lambda: True)

    def broken(position: int) -> None:
        raise RuntimeError("the stream is gone")

    target.on_durable = broken
    try:
        target.append(batch(1 << 32, [("insert", "k1", '{"id": 1}')]), 1 << 32)

        def failed() -> bool:
            try:
                target.check()
            except CdcError:
                return True
            return False

        wait_until(failed, timeout=20, message="the relay's failure to reach the term")
        with pytest.raises(CdcError, match="the stream is gone"):
            target.check()
    finally:
        target.close()
