"""``sluice journal`` against real journal directories, through typer's CliRunner."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluiceway.cli.journal import app
from sluiceway.journal import Journal
from tests.support.journal import append

runner = CliRunner()


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "journal")


def run(*args: str, input: bytes | None = None) -> tuple[int, str]:
    result = runner.invoke(app, list(args), input=input)
    return result.exit_code, result.output


def test_append_prints_offsets_and_read_prints_json_lines(path: str, tmp_path: Path) -> None:
    assert run(
        "append", path, "--key", "k1", "--value", "héllo", "--namespace", "users", "-H", "a=b", "-H", "c="
    ) == (0, f"appended 1 record at offset 0 of {path}\n")
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\xff\x00binary")
    assert run("append", path, "--key", "k2", "--value-file", str(blob)) == (
        0,
        f"appended 1 record at offset 1 of {path}\n",
    )
    assert run("append", path, "--key", "k3", "--tombstone") == (
        0,
        f"appended 1 tombstone at offset 2 of {path}\n",
    )
    assert run("append", path, "--key", "k4", "--value-file", "-", input=b"from stdin") == (
        0,
        f"appended 1 record at offset 3 of {path}\n",
    )
    code, out = run("read", path)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["offset"] for line in lines] == [0, 1, 2, 3]
    first = lines[0]
    assert first["namespace"] == "users" and first["key"] == "k1" and first["value"] == "héllo"
    assert first["headers"] == [["a", "b"], ["c", ""]]
    assert first["timestamp"].endswith("+00:00") and "value_encoding" not in first
    assert lines[1]["value_encoding"] == "base64"
    assert base64.b64decode(lines[1]["value"]) == b"\xff\x00binary"
    assert lines[2]["value"] is None
    assert lines[3]["value"] == "from stdin"
    code, out = run("read", path, "--from", "1", "--to", "3")
    assert [json.loads(line)["offset"] for line in out.splitlines()] == [1, 2]


def test_read_table_and_follow(path: str) -> None:
    with Journal.open(path) as j:
        append(j, ("alpha", b"one"), ("beta", None))
    code, out = run("read", path, "--format", "table")
    assert code == 0 and "alpha" in out and "beta" in out and "offset" in out
    code, out = run("read", path, "--follow", "--timeout", "0.1")
    assert code == 0 and len(out.splitlines()) == 2
    code, out = run("read", path, "--follow", "--timeout", "0.1", "--format", "table")
    assert code == 0 and out.splitlines()[0].split("\t")[0] == "offset"


def test_info_shows_head_segments_registers_and_consumers(path: str) -> None:
    with Journal.open(path, segment_bytes=4096) as j:
        for i in range(30):
            append(j, (f"k{i}", b"x" * 200), set_registers={"epoch": "7"})
        j.commit_offset("spark", 25)
    code, out = run("info", path, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["head"] == 30 and data["registers"] == {"epoch": "7"} and data["consumers"] == {"spark": 25}
    assert len(data["segments"]) > 1 and data["bytes"] == sum(s["bytes"] for s in data["segments"])
    code, out = run("info", path)
    assert code == 0 and "head 30" in out and "spark" in out and "epoch" in out


def test_compact(path: str) -> None:
    with Journal.open(path, segment_bytes=4096) as j:
        for i in range(60):
            append(j, ("same", str(i).encode()))
    code, out = run("compact", path)
    assert code == 0 and "nothing is below the compaction horizon" in out
    with Journal.open(path) as j:
        j.commit_offset("c", 30)
    code, out = run("compact", path)
    assert code == 0 and "horizon 30" in out and "removed 0 record(s)" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["read", "{missing}"], "no journal at"),
        (["info", "{missing}"], "no journal at"),
        (["append", "{path}", "--key", "k"], "exactly one of"),
        (["append", "{path}", "--key", "k", "--value", "v", "-H", "novalue"], "key=value"),
        (["append", "{path}", "--key", "k", "--value-file", "{missing}"], "cannot read"),
        (["read", "{path}", "--format", "xml"], "--format"),
    ],
)
def test_errors_are_one_clear_line(path: str, tmp_path: Path, args: list[str], message: str) -> None:
    with Journal.open(path) as j:
        append(j, ("k", b""))
    filled = [a.format(path=path, missing=str(tmp_path / "nope")) for a in args]
    code, out = run(*filled)
    assert code != 0
    assert message in out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1


def test_second_writer_is_refused_with_a_clear_message(path: str) -> None:
    with Journal.open(path):
        code, out = run("append", path, "--key", "k", "--value", "v")
    assert code == 1 and "locked by another writer" in out and "Traceback" not in out
