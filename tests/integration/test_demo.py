"""The demo (what `make demo` runs) at a small size: it must pass its own checks."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from sluiceway.demo import run_demo

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def test_demo_small(tmp_path: Path, spark) -> None:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    report = run_demo(2000, data_dir=tmp_path / "demo", console=Console(file=out, width=120))
    text = out.getvalue()
    assert report.ok, text
    assert "per-key order verified" in text
    names = [s.name for s in report.stages]
    assert names[0].startswith("orders service") and report.stages[0].records == 2000
    assert all(s.records > 0 for s in report.stages), report.stages
    assert "sluice journal read" in text
    assert f"sluice ui --config {report.workspace}" in " ".join(text.split())
