"""Running ``sluice`` as a user does: a child process, output piped (not a terminal)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def sluice(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``sluice …`` in a child process of this interpreter, run from ``cwd``; 200 columns."""
    return subprocess.run(
        [sys.executable, "-m", "sluiceway.cli.main", *args],
        cwd=cwd,
        # This tree's code first, whatever the virtualenv was installed from (a git worktree).
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
