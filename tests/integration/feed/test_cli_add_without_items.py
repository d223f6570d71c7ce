"""``sluice feed add`` without items refuses, unless ``--empty`` asks for a partition without them.

It used to add an empty partition without a word, which the first worker to lease it completes at
once, so the items meant for it are refused afterwards.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sluiceway.feed import Feed
from tests.support.cli import sluice

pytestmark = pytest.mark.timeout(120)

HOW = (
    "give --item DATA (repeatable) or --file PATH (one item per line), "
    "or --empty for a partition without items"
)


def _usage_error(result: subprocess.CompletedProcess[str]) -> str:
    """Bad usage: exit 2, one line on stderr, no traceback; that line."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_no_items_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    line = _usage_error(sluice("feed", "add", "--dsn", "sqlite:///work.db", "-p", "x", cwd=tmp_path))
    assert line == f"error: no items for partition 'x': {HOW}"
    assert not (tmp_path / "work.db").exists()


def test_a_file_without_items_is_named(tmp_path: Path) -> None:
    (tmp_path / "items.txt").write_text("\n  \n")
    result = sluice(
        "feed", "add", "--dsn", "sqlite:///work.db", "-p", "x", "--file", "items.txt", cwd=tmp_path
    )
    assert _usage_error(result) == (
        f"error: no items for partition 'x' (items.txt holds none: blank lines are skipped): {HOW}"
    )


def test_empty_adds_a_partition_without_items_and_only_when_asked(tmp_path: Path) -> None:
    dsn = "sqlite:///work.db"
    both = sluice("feed", "add", "--dsn", dsn, "-p", "x", "--empty", "-i", "a", cwd=tmp_path)
    assert _usage_error(both) == "error: --empty, yet 1 item(s) given: leave out --empty, or the items"
    added = sluice("feed", "add", "--dsn", dsn, "-p", "x", "--empty", cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == "partition x added with 0 item(s) at gate 0"
    again = sluice("feed", "add", "--dsn", dsn, "-p", "x", "--empty", cwd=tmp_path)
    assert _usage_error(again) == "error: partition 'x' exists; --empty only applies when creating it"
    more = sluice("feed", "add", "--dsn", dsn, "-p", "x", "-i", "a", cwd=tmp_path)
    assert more.returncode == 0 and "1 item(s) added to partition x" in more.stdout
    with Feed(f"sqlite:///{tmp_path / 'work.db'}") as feed:
        assert [item.data for item in feed.items("x").rows] == [b"a"]
