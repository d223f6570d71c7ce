"""``sluice journal read`` says why it printed nothing, and refuses a range that ends before it starts.

It used to print nothing and exit 0 for ``--from 3 --to 1`` and for ``--from`` past the end. Now
``--to`` before ``--from`` is bad usage (one line, exit 2); an empty read exits 0 with one line on
stderr saying why, and stdout stays the records alone (a script reading JSON lines reads none).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sluiceway.journal import Journal
from tests.support.cli import sluice

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    """Three records, offsets 0 to 2."""
    path = tmp_path / "j"
    with Journal.open(path, fsync=False) as j, j.append() as tx:
        for i in range(3):
            tx.write(f"k{i}", b"v", namespace="orders")
    return path


def _stderr_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_to_before_from_is_bad_usage(journal: Path) -> None:
    result = sluice("journal", "read", str(journal), "--from", "3", "--to", "1", cwd=journal.parent)
    assert result.returncode == 2
    assert _stderr_line(result) == "error: --to 1 is before --from 3"
    assert result.stdout == ""


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_from_past_the_end_says_so_on_stderr_and_exits_0(journal: Path, fmt: str) -> None:
    result = sluice("journal", "read", str(journal), "--from", "120", "--format", fmt, cwd=journal.parent)
    assert result.returncode == 0
    assert _stderr_line(result) == "no records: --from 120 is past the journal's end (next offset 3)"
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (
            ["--from", "3"],
            "no records: --from 3 is the journal's end (next offset 3; --follow waits for more)",
        ),
        (["--from", "1", "--to", "1"], "no records: --to 1 is --from 1 (--to is the first offset not read)"),
    ],
)
def test_every_empty_read_says_why(journal: Path, args: list[str], why: str) -> None:
    result = sluice("journal", "read", str(journal), *args, cwd=journal.parent)
    assert (result.returncode, result.stdout) == (0, "")
    assert _stderr_line(result) == why


def test_an_empty_journal_says_it_is_empty(tmp_path: Path) -> None:
    Journal.open(tmp_path / "j", fsync=False).close()
    result = sluice("journal", "read", "./j", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, "")
    assert _stderr_line(result) == "no records: the journal is empty"


def test_a_read_that_finds_records_adds_nothing_on_stderr(journal: Path) -> None:
    result = sluice("journal", "read", str(journal), "--from", "1", "--to", "2", cwd=journal.parent)
    assert result.returncode == 0 and result.stderr == ""
    assert [line.count('"offset": 1') for line in result.stdout.splitlines()] == [1]
