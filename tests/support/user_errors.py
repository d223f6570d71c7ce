"""A new user's pipeline run from the shell: a spec in a folder of its own, a small journal, and
``sluice`` in a child process with its output piped (not a terminal), as a user's script runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sluiceway.journal import Journal

#: Start-up checks run before Spark starts: generous, but far below a Spark run's retries.
FAST = 30


def sluice(*args: str, cwd: Path, timeout: float = FAST) -> subprocess.CompletedProcess[str]:
    """``sluice …`` in a child process, its output piped (not a terminal), as a user's script runs it."""
    return subprocess.run(
        [sys.executable, "-m", "sluiceway.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def write_spec(tmp: Path, body: str) -> Path:
    spec = tmp / "orders.yaml"
    spec.write_text(body)
    return spec


def journal_with(path: Path, records: int) -> None:
    with Journal.open(path, fsync=False) as j, j.append() as tx:
        for i in range(records):
            tx.write(f"k{i}", b"{}", namespace="orders")
