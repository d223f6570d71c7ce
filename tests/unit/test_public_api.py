"""The public API as a user meets it: every package's ``__all__`` is exactly what it exports (as
httpx tests its own), the lazy names are real types to a type checker, and one version.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sluiceway


def packages() -> list[str]:
    found = [info.name for info in pkgutil.walk_packages(sluiceway.__path__, "sluiceway.") if info.ispkg]
    return ["sluiceway", *sorted(found)]


def bound_names(package: str) -> set[str]:
    """The public names a package's ``__init__`` defines or imports from sluiceway's own modules
    (``if TYPE_CHECKING:`` imports included: they name the lazy exports)."""
    path = Path(importlib.import_module(package).__file__ or "")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.If):
            body.extend(node.body)
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("sluiceway")):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {n for n in names if not n.startswith("_") or n == "__version__"}


@pytest.mark.parametrize("package", packages())
def test_all_is_exactly_what_the_package_exports(package: str) -> None:
    module = importlib.import_module(package)
    exported = list(getattr(module, "__all__", []))
    assert len(set(exported)) == len(exported), f"{package}.__all__ names something twice"
    assert set(exported) == bound_names(package)
    for name in exported:
        assert getattr(module, name) is not None, f"{package}.{name} does not resolve"


@pytest.mark.parametrize("package", ["sluiceway", "sluiceway.pipeline"])
def test_the_lazy_exports_are_the_real_objects(package: str) -> None:
    top = importlib.import_module(package)
    assert set(top._LAZY) <= set(top.__all__)
    for name, module in top._LAZY.items():
        assert getattr(top, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'Nonexistent'"):
        top.Nonexistent  # noqa: B018


def test_a_spark_worker_reading_a_journal_loads_neither_the_runner_nor_the_spec_models() -> None:
    """What a Spark Python worker imports to unpickle the journal source: the lazy package keeps
    the runner, the spec models (pydantic) and the operator tools out of it."""
    import subprocess
    import sys

    code = (
        "import sys, sluiceway.pipeline.sources.journal; "
        "print(sorted(m for m in ('sluiceway.pipeline.runner', 'sluiceway.pipeline.spec', "
        "'sluiceway.pipeline.operator') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_one_version() -> None:
    assert sluiceway.__version__ == importlib.metadata.version("sluiceway")


def test_the_package_ships_its_type_marker() -> None:
    assert (Path(sluiceway.__file__).parent / "py.typed").is_file()


USER_SCRIPT = """\
from sluiceway import Harvest, HarvestConfig, Journal, OutboxRecord, Stasher


def harvester(config: HarvestConfig) -> Harvest:
    harvest = Harvest(config)
    leading: bool = harvest.is_leader
    reveal_type(harvest)
    return harvest


def journal(path: str) -> Journal:
    opened = Journal.open(path)
    reveal_type(opened)
    return opened


def stasher() -> Stasher:
    stasher = Stasher()
    reveal_type(stasher)
    reveal_type(OutboxRecord("orders", "key-1", "value"))
    return stasher
"""


def test_a_user_script_type_checks_strictly_with_precise_types(tmp_path: Path) -> None:
    # --disallow-any-expr fails on any expression typed Any: a lazy export that type checkers
    # could not see (or a missing py.typed) would make Harvest and Journal Any.
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--disallow-any-expr", "--no-incremental", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    revealed = [
        line.split("Revealed type is ", 1)[1] for line in result.stdout.splitlines() if "Revealed" in line
    ]
    assert revealed == [
        '"sluiceway.harvest.harvest.Harvest"',
        '"sluiceway.journal.journal.Journal"',
        '"sluiceway.outbox.stasher.Stasher"',
        '"sluiceway.outbox.record.OutboxRecord"',
    ], textwrap.indent(result.stdout, "  ")
