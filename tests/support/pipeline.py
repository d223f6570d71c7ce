"""Running ``sluice pipeline run`` in a process of its own, the way an operator does, and
killing it the way a crash does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.support import ROOT


def start_pipeline(spec: Path, *args: str, log: Path) -> subprocess.Popen[bytes]:
    """``sluice pipeline run SPEC --master local[2] ARGS`` in its own process group (driver, JVM
    and Python workers), its output appended to ``log``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sluiceway.cli.main",
                "pipeline",
                "run",
                str(spec),
                "--master",
                "local[2]",
                *args,
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
            start_new_session=True,  # its own process group: the JVM dies with it
        )


def kill9(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the whole process group: the driver, its JVM and the JVM's Python workers."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def write_spec(path: Path, pipeline: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"pipeline": pipeline}))
    return path
