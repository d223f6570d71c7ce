"""One run per checkpoint: the lock names its holder, and a run refused at start leaves nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluiceway.pipeline.checkpoint import CheckpointInUse, CheckpointLock


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    cp = tmp_path / "cp"
    code = (
        "from sluiceway.pipeline.checkpoint import CheckpointLock as L; "
        f"L({str(cp)!r}).acquire(); print('held', flush=True); input()"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            assert CheckpointLock(cp).holder() is not None
            with pytest.raises(CheckpointInUse, match=f"process {holder.pid} on "):
                CheckpointLock(cp).acquire()
        finally:
            holder.kill()
    assert CheckpointLock(cp).holder() is None  # the kernel dropped it with the process
    lock = CheckpointLock(cp)
    lock.acquire()
    lock.release()


def test_a_run_that_made_nothing_but_its_lock_leaves_no_directory(tmp_path: Path) -> None:
    lock = CheckpointLock(tmp_path / "a" / "cp")
    lock.acquire()
    lock.release()
    assert os.listdir(tmp_path) == []


def test_a_checkpoint_with_content_keeps_its_directory(tmp_path: Path) -> None:
    lock = CheckpointLock(tmp_path / "cp")
    lock.acquire()
    (tmp_path / "cp" / "out").mkdir()  # a sink's checkpoint, written by the run
    lock.release()
    assert sorted(p.name for p in (tmp_path / "cp").iterdir()) == [".sluice-run.lock", "out"]
