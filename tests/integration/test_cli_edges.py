"""The edges a new user hits in ``sluice``, run as a user runs them (a subprocess): user text shown
as written (never read as markup), read-only commands that write nothing, and output that says
what it means."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluiceway.db import Database
from sluiceway.feed import Feed
from sluiceway.harvest.events import Stats
from sluiceway.outbox import init_outbox
from tests.support import ROOT
from tests.support.cli import sluice

pytestmark = pytest.mark.timeout(120)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The run failed with exactly one line on stderr, no traceback; that line."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def digest(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` with a hash of its content: what "nothing written" compares."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        # SQLite's shared-memory index and write-ahead log of a WAL database: a reader needs them
        # (they hold no change of ours), and a read-only reader cannot remove them afterwards.
        if p.is_file() and not p.name.endswith(("-shm", "-wal"))
    }


# -- user text is never markup ------------------------------------------------------------------


def test_square_brackets_in_a_partition_name_are_printed_and_listed_as_written(tmp_path: Path) -> None:
    dsn = "sqlite:///work.db"
    added = sluice("feed", "add", "--dsn", dsn, "--partition", "[bold]p1", "--item", "[red]a", cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    assert "partition [bold]p1 added with 1 item(s)" in added.stdout
    listed = sluice("feed", "partitions", "--dsn", dsn, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "[bold]p1" in listed.stdout
    with Feed(f"sqlite:///{tmp_path / 'work.db'}") as feed:
        assert [p.name for p in feed.partitions().rows] == ["[bold]p1"]
    again = sluice(
        "feed", "add", "--dsn", dsn, "-p", "[bold]p1", "-i", "b", "--attributes", "{}", cwd=tmp_path
    )
    assert "partition '[bold]p1' exists" in one_error_line(again)


def test_a_yaml_syntax_error_keeps_its_brackets_and_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "reaper.yaml").write_text("harvest:\n  dataSource: [oops\n")
    for command in (["reap", "-f", "reaper.yaml"], ["outbox", "stats", "-f", "reaper.yaml"]):
        line = one_error_line(sluice(*command, cwd=tmp_path))
        assert line.startswith("error: reaper.yaml: not valid YAML: line 3, column 1: "), line
        assert "expected ',' or ']'" in line and "dataSource: [oops" in line and "line 2, column 15" in line
        assert "<unicode string>" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reaper.yaml"]


def test_an_outbox_table_name_with_brackets_is_shown_in_the_error(tmp_path: Path) -> None:
    init = sluice("outbox", "init", "--dsn", "sqlite:///app.db", cwd=tmp_path)
    assert init.returncode == 0 and "outbox table outbox and outbox_dead ready" in init.stdout
    line = one_error_line(
        sluice("outbox", "stats", "--dsn", "sqlite:///app.db", "--table", "[x]", cwd=tmp_path)
    )
    assert line.startswith("error: --table: '[x]' is not a valid table name"), line


# -- read-only commands never write -------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["outbox", "stats", "--dsn", "sqlite:///nosuch.db"],
        ["outbox", "dead", "list", "--dsn", "sqlite:///nosuch.db"],
        ["feed", "status", "--dsn", "sqlite:///nosuch.db"],
        ["feed", "partitions", "--dsn", "sqlite:///nosuch.db"],
    ],
    ids=["outbox-stats", "outbox-dead-list", "feed-status", "feed-partitions"],
)
def test_a_missing_sqlite_file_is_named_and_not_created(command: list[str], tmp_path: Path) -> None:
    line = one_error_line(sluice(*command, cwd=tmp_path))
    assert line == "error: --dsn sqlite:///nosuch.db: database file nosuch.db does not exist"
    assert list(tmp_path.iterdir()) == []


def test_journal_read_and_info_of_a_missing_journal_create_nothing(tmp_path: Path) -> None:
    for command in (["journal", "read", "./nojournal"], ["journal", "info", "./nojournal"]):
        assert "no journal at nojournal" in one_error_line(sluice(*command, cwd=tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_journal_read_and_info_leave_a_journal_as_it_was(tmp_path: Path) -> None:
    appended = sluice("journal", "append", "./j", "--key", "k", "--value", "[v]", cwd=tmp_path)
    assert appended.returncode == 0, appended.stderr
    before = digest(tmp_path)
    for command in (
        ["journal", "info", "./j"],
        ["journal", "read", "./j"],
        ["journal", "read", "./j", "--format", "table"],
    ):
        result = sluice(*command, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "[v]" in result.stdout or command[1] == "info"
    assert digest(tmp_path) == before


def test_outbox_stats_without_the_table_names_the_flag_and_the_database(tmp_path: Path) -> None:
    with Database(f"sqlite:///{tmp_path / 'app.db'}") as db:
        db.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
    before = digest(tmp_path)
    line = one_error_line(sluice("outbox", "stats", "--dsn", "sqlite:///app.db", cwd=tmp_path))
    assert line.startswith("error: --table: outbox table 'outbox' does not exist in sqlite database "), line
    assert str(tmp_path / "app.db") in line and "outboxTable" not in line
    assert digest(tmp_path) == before


def test_outbox_stats_from_a_config_file_names_its_keys(tmp_path: Path) -> None:
    (tmp_path / "reaper.yaml").write_text(
        "harvest:\n  dataSource: sqlite:///nosuch.db\n  journal: {path: ./j}\n"
    )
    line = one_error_line(sluice("outbox", "stats", "-f", "reaper.yaml", cwd=tmp_path))
    assert (
        line == "error: reaper.yaml: dataSource sqlite:///nosuch.db: database file nosuch.db does not exist"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reaper.yaml"]


def test_read_only_commands_leave_an_existing_database_as_it_was(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'app.db'}"
    with Database(dsn) as db:
        init_outbox(db)
    with Feed(dsn) as feed:
        feed.add("folder-1", [b"a"])
    before = digest(tmp_path)
    for command in (
        ["outbox", "stats", "--dsn", "sqlite:///app.db"],
        ["outbox", "dead", "list", "--dsn", "sqlite:///app.db"],
        ["feed", "status", "--dsn", "sqlite:///app.db"],
        ["feed", "partitions", "--dsn", "sqlite:///app.db"],
    ):
        result = sluice(*command, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    assert digest(tmp_path) == before
    stats = sluice("outbox", "stats", "--dsn", "sqlite:///app.db", cwd=tmp_path).stdout
    assert "outbox table outbox" in stats and "outbox outbox" not in stats
    assert str(tmp_path / "app.db") in stats


def test_status_reads_a_sqlite_feed_without_writing(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'work.db'}"
    with Feed(dsn) as feed:
        feed.add("folder-1", [b"a"])
    (tmp_path / "sluice.yaml").write_text(
        "feeds: [{name: work, dsn: 'sqlite:///work.db'}, {name: gone, dsn: 'sqlite:///gone.db'}]\n"
    )
    before = digest(tmp_path)
    result = sluice("status", "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert '"name": "work", "health": "ok"' in result.stdout
    assert "gone.db does not exist" in result.stdout
    assert digest(tmp_path) == before


# -- output that says what it means -------------------------------------------------------------


def test_journal_append_says_what_it_did(tmp_path: Path) -> None:
    first = sluice("journal", "append", "./j", "--key", "k", "--value", "v", cwd=tmp_path)
    assert first.returncode == 0 and first.stdout == "appended 1 record at offset 0 of j\n"
    second = sluice("journal", "append", "./j", "--key", "k", "--tombstone", cwd=tmp_path)
    assert second.stdout == "appended 1 tombstone at offset 1 of j\n"


def test_help_shows_no_type_for_plain_flags_and_flows_sentences(tmp_path: Path) -> None:
    result = sluice("journal", "append", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "<bool>" not in result.stdout
    tombstone = next(line for line in result.stdout.splitlines() if "--tombstone" in line)
    assert tombstone.split() == ["--tombstone", "Write", "a", "tombstone", "(no", "value)."]
    # A paragraph written over two lines in the docstring is re-flowed to the width (120 at most):
    # not broken where the source broke it ("expired" ends the docstring's line).
    status = sluice("status", "--help", cwd=tmp_path).stdout
    assert "pipeline lag, expired feed leases, WAL a" in status
    assert max(len(line) for line in status.splitlines()) <= 120


def test_the_meter_line_gives_latencies_in_milliseconds() -> None:
    from sluiceway.cli.reap import meter_line

    stats = Stats(5.0, 120.4, 3, 0, 600, 600, 598, 0, 0, {"p50": 1.234, "p90": 2.0, "p99": 3.45, "max": 9.8})
    assert meter_line(stats) == (
        "meter: 120 rec/s, in flight 3, pending 0, marked 600, purged 598, reset 0, dead 0, "
        "latency p50 1.2 ms p99 3.5 ms max 9.8 ms"
    )
    assert meter_line(Stats(5.0, 0.0, 0, 0, 0, 0, 0, 0, 0)).endswith(", latency -")


def test_reap_says_which_id_is_which_and_gives_latency_in_ms(tmp_path: Path) -> None:
    from sluiceway import OutboxRecord, Stasher
    from sluiceway.testing import wait_until

    dsn = f"sqlite:///{tmp_path / 'app.db'}"
    with Database(dsn) as db:
        init_outbox(db)
    with Database(dsn) as db:
        Stasher().stash(db.raw, OutboxRecord("orders.created", "k1", "v"))
    (tmp_path / "reaper.yaml").write_text(
        "harvest:\n  dataSource: sqlite:///app.db\n  name: edges\n  journal: {path: ./journal}\n"
        "  limits: {minMetricsInterval: 200ms}\n"
    )
    log = tmp_path / "reap.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluiceway.cli.main", "reap", "-f", "reaper.yaml"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: " ms" in log.read_text(), timeout=30, message="a meter line with a latency")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = log.read_text()
    assert "lease 'edges' acquired: this process leads (holder " in text
    assert "leading: marking outbox rows with leader id " in text
    assert "LeaderAcquired(" not in text and "latency {" not in text
    meter = next(line for line in text.splitlines() if "meter:" in line and " ms" in line)
    assert "latency p50 " in meter and meter.endswith(" ms")
