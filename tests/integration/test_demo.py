"""The demo (what `make demo` runs) at a small size: it must pass its own checks."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from sluiceway.demo import run_demo

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


@pytest.fixture
def cpu_burner() -> Iterator[None]:
    """A process that keeps one of the machine's cores busy, as another job would."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def test_demo_small(tmp_path: Path, spark, cpu_burner, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="sluiceway")
    out = io.StringIO()
    report = run_demo(2000, data_dir=tmp_path / "demo", console=Console(file=out, width=120))
    text = out.getvalue()
    assert report.ok, text
    # A normal run says nothing that reads like a failure, on a busy machine too.
    alarming = [
        f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING
    ]
    assert not alarming, alarming
    assert not any(word in text.lower() for word in ("locked", "lost", "failed", "error")), text
    assert "per-key order verified" in text
    names = [s.name for s in report.stages]
    assert names[0].startswith("orders service") and report.stages[0].records == 2000
    assert all(s.records > 0 for s in report.stages), report.stages
    assert "sluice journal read" in text
    assert f"sluice ui --config {report.workspace}" in " ".join(text.split())
