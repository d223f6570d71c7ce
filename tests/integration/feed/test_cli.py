"""``sluice feed`` end to end through typer's CliRunner, on SQLite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluiceway.cli.feed import app
from sluiceway.feed import Feed, Item, Status

runner = CliRunner()


def flaky(item: Item) -> dict[str, object]:
    """Processor for the CLI worker: items whose data says 'bad' fail."""
    if item.data == b"bad":
        raise ValueError("bad item")
    return {"done": True}


def sluice(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())  # rich wraps at the terminal width


def test_add_work_fail_retry_resolve_and_status(sqlite_dsn: str, tmp_path: Path) -> None:
    lines = tmp_path / "items.txt"
    lines.write_text("good-1\nbad\n\ngood-2\n")
    code, out = sluice("add", "--dsn", sqlite_dsn, "-p", "folder", "--file", str(lines), "--attributes", "{}")
    assert code == 0 and "3 item(s) at gate 0" in out
    code, out = sluice("add", "--dsn", sqlite_dsn, "-p", "folder", "-i", "later", "--gate", "1")
    assert code == 0 and "1 item(s) added" in out

    args = ["worker", "--dsn", sqlite_dsn, "--processor", "tests.integration.feed.test_cli:flaky"]
    args += ["--until-idle", "--max-attempts", "1", "--poll-interval", "0.02", "--log-level", "WARNING"]
    code, out = sluice(*args)
    assert code == 0 and "2 completed, 1 failed" in out

    code, out = sluice("status", "--dsn", sqlite_dsn)
    assert code == 0 and "failed" in out and "workers" in out
    status = json.loads(runner.invoke(app, ["status", "--dsn", sqlite_dsn, "--json"]).output)
    assert status["items"] == {"available": 1, "complete": 2, "failed": 1}
    assert status["partitions"] == [{"status": "failed", "gate": 0, "count": 1}]

    code, out = sluice("partitions", "--dsn", sqlite_dsn, "--status", "failed")
    assert code == 0 and "folder" in out

    code, out = sluice("retry", "--dsn", sqlite_dsn, "-p", "folder")
    assert code == 0 and "1 failed item(s) of partition 'folder' made available again" in out
    code, out = sluice(*args)  # fails again
    assert code == 0 and "1 failed" in out
    with Feed(sqlite_dsn) as feed:
        bad = next(i for i in feed.items("folder").rows if i.data == b"bad")
    code, out = sluice("resolve", "--dsn", sqlite_dsn, "--item", str(bad.id))
    assert code == 0 and "1 failed item(s) (item" in out
    code, out = sluice(*args)
    assert code == 0 and "1 completed" in out and "1 partition(s) completed" in out
    with Feed(sqlite_dsn) as feed:
        assert feed.partition("folder").status is Status.COMPLETE  # type: ignore[union-attr]


def test_manual_checkpoint_from_the_cli(sqlite_dsn: str) -> None:
    assert sluice("add", "--dsn", sqlite_dsn, "-p", "p", "-i", "x")[0] == 0
    assert sluice("add", "--dsn", sqlite_dsn, "-p", "p", "-i", "y", "--gate", "2")[0] == 0
    args = ["worker", "--dsn", sqlite_dsn, "--processor", "tests.integration.feed.test_cli:flaky"]
    args += ["--until-idle", "--manual-checkpoint", "--poll-interval", "0.02", "--log-level", "WARNING"]
    assert sluice(*args)[0] == 0
    code, out = sluice("checkpoint", "--dsn", sqlite_dsn, "-p", "p")
    assert code == 0 and "now at gate 2" in out
    code, out = sluice("checkpoint", "--dsn", sqlite_dsn, "-p", "p")
    assert code == 1 and "error:" in out and "still has items" in out
    assert sluice(*args)[0] == 0
    code, out = sluice("checkpoint", "--dsn", sqlite_dsn, "-p", "p")
    assert code == 0 and "is complete" in out


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["status", "--dsn", "oracle://x/y"], "unsupported data source"),
        (["retry", "--dsn", "{dsn}", "-p", "nope"], "feed partition 'nope' does not exist"),
        (["add", "--dsn", "{dsn}", "-p", "p", "-i", "x", "--gate", "-1"], "gate must be an integer >= 0"),
        (["add", "--dsn", "{dsn}", "-p", "p", "--attributes", "[1]"], "must be a JSON object"),
        (["partitions", "--dsn", "{dsn}", "--status", "done"], "--status must be"),
        (["worker", "--dsn", "{dsn}", "--processor", "no_such_mod:f"], "cannot import processor module"),
        (["add", "--dsn", "{dsn}", "-p", "p", "-i", "x", "--prefix", "x;y"], "not a valid feed table prefix"),
    ],
)
def test_errors_are_one_clear_line(sqlite_dsn: str, args: list[str], fragment: str) -> None:
    sluice("init", "--dsn", sqlite_dsn)
    code, out = sluice(*(a.format(dsn=sqlite_dsn) for a in args))
    assert code == 1, out
    assert fragment in out and "Traceback" not in out
    assert out.startswith("error:")


def test_help_has_examples() -> None:
    code, out = sluice("--help")
    assert code == 0 and "sluice feed worker" in out
    for command in ("worker", "status", "retry", "resolve", "add", "checkpoint", "partitions", "init"):
        code, out = sluice(command, "--help")
        assert code == 0 and "Example" in out, command
