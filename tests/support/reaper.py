"""Harvester processes for chaos tests: their configuration, and who leads according to their events."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from sluiceway.testing import wait_until
from tests.support import ROOT
from tests.support.faulty_reaper import ACK_LOST


def write_config(path: Path, harvest: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"harvest": harvest, "logging": {"level": "Warn"}}))
    return path


class Reaper:
    """One harvester process (:mod:`tests.support.faulty_reaper`); its events go to a log file we parse."""

    def __init__(self, config: Path, log: Path, faults: float = 0.0, seed: int = 0) -> None:
        self.log = log
        with open(log, "ab") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.faulty_reaper", str(config), str(faults), str(seed)],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=sink,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )

    def events(self) -> list[str]:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return re.findall(r"^EVENT (\w+)", text, re.MULTILINE)

    def acquisitions(self) -> int:
        """How many times this process became the leader."""
        return self.events().count("LeaderAcquired")

    def acks_lost(self) -> int:
        """How many acknowledgements its faulty publisher pretended to lose (each one is re-sent)."""
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return 0
        return text.count(ACK_LOST)  # not per line: another thread's log line may share its line

    def leading(self) -> bool:
        if self.proc.poll() is not None:
            return False
        state = False
        for name in self.events():
            if name == "LeaderAcquired":
                state = True
            elif name in ("LeaderRevoked", "LeaderFenced", "Stopped"):
                state = False
        return state

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        return self.proc.returncode


def the_leader(reapers: Iterable[Reaper], timeout: float = 60) -> Reaper:
    def find() -> Reaper | None:
        leaders = [r for r in reapers if r.leading()]
        return leaders[0] if len(leaders) == 1 else None

    return wait_until(find, timeout=timeout, message="exactly one leader")
