"""A workspace file's relative paths are read from its own directory, whatever directory ``sluice
status`` runs in — and so are the relative paths of the pipeline specs it lists.

``sluice status -c shop/sluice.yaml`` run elsewhere used to read ``./journal`` from the current
directory: another journal there was reported, "ok"; a SQLite feed was "unavailable". Each test
runs ``sluice status`` from a directory holding a decoy journal of another size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluiceway.feed import Feed
from sluiceway.journal import Journal
from tests.support.cli import sluice

pytestmark = pytest.mark.timeout(120)


def _journal(path: Path, records: int) -> None:
    with Journal.open(path, fsync=False) as journal, journal.append() as tx:
        for i in range(records):
            tx.write(f"k{i}", b"v", namespace="orders")


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    """shop/: a journal of 2 records, a pipeline spec reading it, a SQLite feed, and sluice.yaml
    naming them by relative paths; elsewhere/: a journal of 5 records at the same relative path."""
    shop = tmp_path / "shop"
    _journal(shop / "journal", 2)
    pipeline = {
        "name": "orders",
        "source": {"type": "journal", "path": "./journal"},
        "sinks": [{"name": "lake", "type": "parquet", "path": "./lake"}],
        "checkpoint": "./checkpoints",
    }
    (shop / "orders.yaml").write_text(yaml.safe_dump({"pipeline": pipeline}))
    with Feed(f"sqlite:///{shop / 'work.db'}") as feed:
        feed.add("folder-1", [b"a.pdf"])
    workspace = {
        "journals": [{"name": "bus", "path": "./journal"}, {"name": "gone", "path": "./no-journal"}],
        "pipelines": ["orders.yaml"],
        "feeds": [{"name": "work", "dsn": "sqlite:///work.db"}],
    }
    (shop / "sluice.yaml").write_text(yaml.safe_dump(workspace))
    _journal(tmp_path / "elsewhere" / "journal", 5)
    return shop


def _status(shop: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = sluice(
        "status",
        "--config",
        str(shop / "sluice.yaml"),
        "--format",
        "json",
        *args,
        cwd=shop.parent / "elsewhere",
    )
    assert "Traceback" not in result.stderr
    return result.returncode, json.loads(result.stdout)


def test_paths_are_read_from_the_workspace_files_directory(shop: Path) -> None:
    _, report = _status(shop)
    bus = report["journals"][0]
    assert (bus["name"], bus["health"], bus["path"], bus["head"]) == ("bus", "ok", str(shop / "journal"), 2)
    (feed,) = report["feeds"]
    assert feed["health"] == "ok" and feed["partitions"] == [{"status": "available", "gate": 0, "count": 1}]
    (pipeline,) = report["pipelines"]
    assert (pipeline["name"], pipeline["spec"]) == ("orders", str(shop / "orders.yaml"))
    # The spec's ./journal is shop's too: the sink is 2 records behind, not the decoy's 5.
    assert [(s["name"], s["lag"]) for s in pipeline["sinks"]] == [("lake", 2)]


def test_a_journal_that_is_not_there_is_a_problem_not_ok(shop: Path) -> None:
    code, report = _status(shop, "--check")
    gone = report["journals"][1]
    assert (gone["name"], gone["health"], gone["head"]) == ("gone", "unavailable", None)
    assert gone["problems"] == [f"cannot be read: no journal at {shop / 'no-journal'}"]
    assert code == 1, "--check counts it"


def test_root_names_the_directory_the_pipelines_run_in(shop: Path) -> None:
    # ops/sluice.yaml watches what runs in shop/: root: ../shop, and its paths are from there.
    ops = shop.parent / "ops"
    ops.mkdir()
    workspace = yaml.safe_load((shop / "sluice.yaml").read_text())
    (ops / "sluice.yaml").write_text(yaml.safe_dump({**workspace, "root": "../shop"}))
    _, report = _status(ops)
    assert [(j["name"], j["head"]) for j in report["journals"]] == [("bus", 2), ("gone", None)]
    assert [s["lag"] for s in report["pipelines"][0]["sinks"]] == [2]
