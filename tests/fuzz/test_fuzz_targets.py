"""Keep the fuzz targets alive: each replays its committed corpus, then fuzzes for a few seconds.

``make fuzz`` runs them for long (``FUZZ_SECONDS`` each); this is the short version that CI runs
with every test, so a target that no longer imports, a seed that now crashes, or a crash that
comes back within seconds fails here. A failure prints libFuzzer's report; the input that
crashed is in the test's temporary directory (``crash-…``), to reproduce with
``python -m fuzz.run TARGET <that file>``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz.run import CORPUS, ROOT, TARGETS

#: Seconds of fuzzing per target here: enough to catch a crash near the seeds, short enough
#: that the nine targets take well under a minute.
SECONDS = 2


def test_every_target_module_is_listed_and_has_seeds() -> None:
    modules = {p.stem for p in ROOT.glob("*.py") if not p.stem.startswith("_") and p.stem != "run"}
    assert modules == set(TARGETS)
    for target in TARGETS:
        assert sorted(p.name for p in (CORPUS / target).iterdir()), f"{target} has no seed corpus"


@pytest.mark.parametrize("target", TARGETS)
def test_the_committed_corpus_holds_the_contract(target: str) -> None:
    module = importlib.import_module(f"fuzz.{target}")
    seeds = sorted((CORPUS / target).iterdir())
    for seed in seeds:
        module.fuzz_one(seed.read_bytes())  # raises on a broken contract
    assert {p.name for p in seeds} >= {f"seed-{name}" for name in module.seeds()}, "run --write-seeds"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", TARGETS)
def test_a_short_fuzzing_run_finds_nothing(target: str, tmp_path: Path) -> None:
    found = tmp_path / "corpus"
    found.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fuzz.run",
            target,
            f"-max_total_time={SECONDS}",
            f"-artifact_prefix={tmp_path}/",
            str(found),  # new inputs go to the first directory: never the committed one
            str(CORPUS / target),
        ],
        cwd=ROOT.parent,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    report = "\n".join(
        line for line in proc.stderr.splitlines() if not line.startswith("INFO: Instrumenting")
    )
    assert proc.returncode == 0, f"{target} found something:\n{report[-6000:]}"
    assert "Done " in proc.stderr, report[-3000:]  # libFuzzer ran to its time limit
