"""Every command and code sample in README.md and docs/*.md runs as written.

Conventions in the Markdown (an HTML comment on the line before a fenced block):

* ```console — each line starting with ``$ `` is run with bash (other lines are sample output);
* ```python — executed; the blocks of one page share a namespace;
* ```sql — executed on a scratch PostgreSQL database that has an outbox (``sluice outbox init``);
* ``<!-- file: NAME -->`` before a block writes it to NAME in the page's working directory;
* ``<!-- validate: harvest|pipeline|capture -->`` before a YAML block validates it as that configuration;
* ``<!-- prints: TEXT -->`` before a console or python block runs it and checks that what it
  printed holds TEXT (an example that promises output must show it);
* ``<!-- not-run: why; covered by tests/… -->`` skips a block that needs something a page cannot
  start (a broker, a long-running server); the named test must exist;
* blocks in any other language (or none: diagrams, output) are not code and are not run.

The pages run in the order a reader meets them — README.md, then the pages of docs/ in the order
README.md first links them (any it does not link, last) — each top to bottom, all in one working
directory, as a reader following along in one shell would: a page must not trip over what an
earlier one left there (the same file, the same row, the same partition). A page can still be
run on its own (``-k feed.md``): it then starts in an empty directory.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*([a-z-]+):\s*(.*?)\s*-->\s*$")
_DOCS_LINK = re.compile(r"\]\((docs/[\w.-]+\.md)(?:#[^)]*)?\)")


def reading_order(root: Path = ROOT) -> list[Path]:
    """README.md, then docs/*.md in the order README.md first links them, then the rest sorted."""
    readme = root / "README.md"
    linked = [root / name for name in dict.fromkeys(_DOCS_LINK.findall(readme.read_text(encoding="utf-8")))]
    rest = sorted(set((root / "docs").glob("*.md")) - set(linked))
    return [readme, *[page for page in linked if page.exists()], *rest]


PAGES = reading_order()


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    body: str
    directive: tuple[str, str] | None


def blocks(page: Path) -> list[Block]:
    out: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match:
            start, lang = i, match.group(1)
            directive = None
            if i > 0 and (d := _DIRECTIVE.match(lines[i - 1])):
                directive = (d.group(1), d.group(2))
            i += 1
            body: list[str] = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            out.append(Block(page, start + 1, lang, "\n".join(body) + "\n", directive))
        i += 1
    return out


def _env(workdir: Path, extra: dict[str, str]) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT), **extra}


def run_console(block: Block, workdir: Path, env: dict[str, str]) -> str:
    """Run the block's ``$`` lines; what they printed on stdout."""
    printed = []
    for raw in block.body.splitlines():
        if not raw.startswith("$ "):
            continue
        command = raw[2:]
        result = subprocess.run(
            ["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, (
            f"{block.page.name}:{block.line}: `{command}` exited {result.returncode}\n"
            f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
        )
        printed.append(result.stdout)
    return "".join(printed)


def run_python(block: Block, workdir: Path, namespace: dict[str, object]) -> str:
    """Execute the block in the page's namespace; what it printed (its threads too)."""
    old = Path.cwd()
    os.chdir(workdir)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(block.body, f"{block.page.name}:{block.line}", "exec"), namespace)
    finally:
        os.chdir(old)
        sys.stdout.write(printed.getvalue())
    return printed.getvalue()


def run_sql(block: Block, dsn: str) -> None:
    import psycopg

    from sluiceway.db import Database
    from sluiceway.outbox import init_outbox

    with Database(dsn) as db:
        init_outbox(db)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(block.body)  # type: ignore[call-overload]


def validate(block: Block, kind: str) -> None:
    import yaml

    data = yaml.safe_load(block.body)
    if kind == "harvest":
        from sluiceway.harvest import HarvestConfig

        HarvestConfig.from_dict(data)
    elif kind == "pipeline":
        from sluiceway.pipeline import PipelineSpec

        # The samples name ${KAFKA} and ${PG}: give them values, as a user's environment would.
        PipelineSpec.from_dict(
            data, env={"KAFKA": "127.0.0.1:9092", "PG": "postgresql://postgres@127.0.0.1/app"}
        )
    elif kind == "capture":
        from sluiceway.capture import CaptureConfig

        CaptureConfig.from_dict(data)
    else:
        raise AssertionError(f"{block.page.name}:{block.line}: unknown validate kind {kind!r}")


@pytest.fixture(scope="module")
def reader_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one working directory every page of this run shares, as a reader's shell would."""
    return tmp_path_factory.mktemp("reader")


def test_pages_run_in_reading_order() -> None:
    names = [page.name for page in PAGES]
    assert names[0] == "README.md" and len(names) == len(set(names))
    assert set(names[1:]) == {page.name for page in (ROOT / "docs").glob("*.md")}, "every page runs"
    assert names.index("harvester.md") < names.index("journal.md") < names.index("feed.md")


def markdown_tables(page: Path) -> list[tuple[int, list[str]]]:
    """The tables of a page outside code blocks: (first line number, rows), a blank line ends one."""
    tables: list[tuple[int, list[str]]] = []
    in_code = False
    rows: list[str] = []
    for number, line in enumerate([*page.read_text(encoding="utf-8").splitlines(), ""], start=1):
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith("|"):
            rows.append(line)
            continue
        if rows:
            tables.append((number - len(rows), rows))
            rows = []
    return tables


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_tables_are_whole(page: Path) -> None:
    """Every table starts with a header and its |---| line: a blank line inside a table splits it, and
    the rows after the blank line are shown as text."""
    separator = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+\s*$")
    for line, rows in markdown_tables(page):
        assert len(rows) >= 2 and separator.match(rows[1]), (
            f"{page.name}:{line}: a table without its header line "
            "(split from the table above by a blank line?)"
        )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_samples_run(page: Path, reader_dir: Path, postgres_dsn: str) -> None:
    tmp_path = reader_dir
    env = _env(tmp_path, {"SLUICE_DOCS_POSTGRES": postgres_dsn})
    namespace: dict[str, object] = {"__name__": "__docs__"}
    ran = 0
    for block in blocks(page):
        kind, arg = block.directive or ("", "")
        if kind == "not-run":
            covered = re.findall(r"tests/[\w/.-]+\.py", arg)
            assert covered, f"{page.name}:{block.line}: a not-run block must name the test that covers it"
            for path in covered:
                assert (ROOT / path).exists(), f"{page.name}:{block.line}: {path} does not exist"
            continue
        if kind == "file":
            (tmp_path / arg).write_text(block.body)
            ran += 1
            continue
        if kind == "validate":
            validate(block, arg)
            ran += 1
            continue
        if block.lang == "console":
            printed = run_console(block, tmp_path, env)
        elif block.lang == "python":
            printed = run_python(block, tmp_path, namespace)
        elif block.lang == "sql":
            run_sql(block, postgres_dsn)
            printed = ""
        else:
            continue
        if kind == "prints":
            assert block.lang in ("console", "python"), (
                f"{page.name}:{block.line}: prints: needs console or python"
            )
            assert arg in printed, (
                f"{page.name}:{block.line}: expected the output to hold {arg!r}, got:\n{printed}"
            )
        ran += 1
    print(f"{page.name}: {ran} blocks run")
