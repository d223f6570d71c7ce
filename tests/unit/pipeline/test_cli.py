"""``sluice pipeline`` without Spark: help, one-line errors, status/skip/inspect on a journal."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from sluiceway.cli.main import app
from sluiceway.journal import Journal
from sluiceway.pipeline.state import StateStore

runner = CliRunner()


def spec_file(tmp_path: Path, **overrides: object) -> Path:
    pipeline = {
        "name": "cli",
        "source": {"type": "journal", "path": str(tmp_path / "j")},
        "sinks": [{"name": "lake", "type": "parquet", "path": str(tmp_path / "lake")}],
        "checkpoint": str(tmp_path / "cp"),
        **overrides,
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"pipeline": pipeline}))
    return path


def test_help_has_examples() -> None:
    for args in (["pipeline", "--help"], ["pipeline", "run", "--help"], ["pipeline", "step", "--help"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0
        assert "sluice pipeline" in result.output and "Example" in result.output


def test_a_bad_spec_is_one_line_and_exit_1(tmp_path: Path) -> None:
    path = spec_file(tmp_path, sinks=[{"name": "lake", "type": "parquet"}])
    result = runner.invoke(app, ["pipeline", "status", str(path)])
    assert result.exit_code == 1
    assert "pipeline.sinks[0].path: required but missing" in result.output
    assert "Traceback" not in result.output


def test_status_skip_and_inspect(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j", fsync=False) as j, j.append() as tx:
        for i in range(5):
            tx.write(f"k{i}", b"v%d" % i, namespace="orders")
    path = spec_file(tmp_path)
    result = runner.invoke(app, ["pipeline", "status", str(path), "--json"])
    assert result.exit_code == 0, result.output
    status = json.loads(result.output)
    assert status["sink"] == "lake" and status["state"] == "new" and status["lag"] == 5

    result = runner.invoke(app, ["pipeline", "skip", str(path), "--sink", "lake", "--offset", "3"])
    assert result.exit_code == 0
    assert StateStore(tmp_path / "cp" / "lake").load().skip == [3]
    result = runner.invoke(app, ["pipeline", "skip", str(path), "--sink", "nope", "--offset", "3"])
    assert result.exit_code == 1 and "no sink named 'nope'" in result.output

    result = runner.invoke(app, ["pipeline", "inspect", str(path), "--from", "1", "--to", "3", "--json"])
    assert result.exit_code == 0
    rows = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [(r["offset"], r["key"], r["value"]) for r in rows] == [(1, "k1", "v1"), (2, "k2", "v2")]
