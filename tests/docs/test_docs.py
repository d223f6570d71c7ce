"""Every command and code sample in README.md and docs/*.md runs as written.

Conventions in the Markdown (an HTML comment on the line before a fenced block):

* ```console — each line starting with ``$ `` is run with bash (other lines are sample output);
* ```python — executed; the blocks of one page share a namespace;
* ```sql — executed on a scratch PostgreSQL database that has an outbox (``sluice outbox init``);
* ``<!-- file: NAME -->`` before a block writes it to NAME in the page's working directory;
* ``<!-- validate: harvest|pipeline -->`` before a YAML block validates it as that configuration;
* ``<!-- not-run: why; covered by tests/… -->`` skips a block that needs something a page cannot
  start (a broker, a long-running server); the named test must exist;
* blocks in any other language (or none: diagrams, output) are not code and are not run.

Each page runs top to bottom in its own temporary directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*([a-z-]+):\s*(.*?)\s*-->\s*$")


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


def run_console(block: Block, workdir: Path, env: dict[str, str]) -> None:
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


def run_python(block: Block, workdir: Path, namespace: dict[str, object]) -> None:
    old = Path.cwd()
    os.chdir(workdir)
    try:
        exec(compile(block.body, f"{block.page.name}:{block.line}", "exec"), namespace)
    finally:
        os.chdir(old)


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
    else:
        raise AssertionError(f"{block.page.name}:{block.line}: unknown validate kind {kind!r}")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_samples_run(page: Path, tmp_path: Path, postgres_dsn: str) -> None:
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
            run_console(block, tmp_path, env)
        elif block.lang == "python":
            run_python(block, tmp_path, namespace)
        elif block.lang == "sql":
            run_sql(block, postgres_dsn)
        else:
            continue
        ran += 1
    print(f"{page.name}: {ran} blocks run")
