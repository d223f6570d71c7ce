"""Run the fuzz targets: one for a while, or every one in turn (``make fuzz``).

    python -m fuzz.run pgoutput -max_total_time=60       # one target; libFuzzer's flags after it
    python -m fuzz.run --all --seconds 60                 # each target in its own process, then a table
    python -m fuzz.run --write-seeds                      # (re)write fuzz/corpus/<target>/seed-*

A run that names no corpus directory keeps what it learns out of git: new inputs go to
``fuzz/.work/<target>/corpus`` (read together with the committed seeds in
``fuzz/corpus/<target>``), findings to ``fuzz/.work/<target>/`` as ``crash-…``/``timeout-…``/
``oom-…`` files. (libFuzzer adds new inputs to the first directory it is given: never name the
committed corpus first.) Reproduce one with
``python -m fuzz.run TARGET fuzz/.work/TARGET/crash-…`` (a file argument runs just that input).

Why a runner rather than ``python fuzz/<target>.py``: a target module must be imported inside
``atheris.instrument_imports`` for its code under test to report coverage, and libFuzzer exits
the process when it is done, so a campaign over several targets needs one process each.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

#: Every target, by module name under ``fuzz/``, with the modules whose coverage guides it
#: (and their submodules): the code under test, and for the config loaders the YAML parser.
_CONFIG = ("sluiceway.config", "yaml")
SCOPES: dict[str, tuple[str, ...]] = {
    "journal_segment": ("sluiceway.journal",),
    "pgoutput": ("sluiceway.cdc.pgoutput",),
    "harvest_config": (*_CONFIG, "sluiceway.harvest.config"),
    "pipeline_spec": (*_CONFIG, "sluiceway.pipeline.spec"),
    "workspace_spec": (*_CONFIG, "sluiceway.overview.workspace"),
    "feed_http_reply": ("sluiceway.feed.processors", "sluiceway.feed.model"),
    "kafka_record": ("sluiceway.pipeline.sources.kafka", "sluiceway.pipeline.record"),
    "nats_record": (
        "sluiceway.brokers.nats",
        "sluiceway.pipeline.sources.common",
        "sluiceway.pipeline.record",
    ),
    "redis_record": ("sluiceway.brokers.redis", "sluiceway.pipeline.sources", "sluiceway.pipeline.record"),
}
TARGETS = tuple(SCOPES)

ROOT = Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"
WORK = ROOT / ".work"

#: Per-input time limit (s): a hang is a finding. Inputs are small, so seconds are generous.
INPUT_TIMEOUT = 10
#: Memory limit (MB) for the whole process: past it libFuzzer reports an out-of-memory finding.
RSS_LIMIT_MB = 1024


def _package_modules(package: str) -> list[str]:
    """Every module of ``package``, found on disk (importing would import them all)."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    names = []
    for location in spec.submodule_search_locations:
        for path in Path(location).rglob("*.py"):
            parts = path.relative_to(location).with_suffix("").parts
            names.append(".".join((package, *parts[:-1]) if parts[-1] == "__init__" else (package, *parts)))
    return names


def load(target: str) -> ModuleType:
    """Import ``fuzz.<target>`` with coverage instrumentation of the code it exercises.

    Only the modules :data:`SCOPES` names for it (and their submodules) are instrumented: importing any
    part of sluiceway imports most of it (the package's facade), and instrumenting a hundred
    modules costs seconds at every start and blurs the coverage signal with unrelated edges.
    """
    import atheris

    if target not in TARGETS:
        raise SystemExit(f"unknown fuzz target {target!r}; targets: {', '.join(TARGETS)}")
    scope = SCOPES[target]
    included = sorted({name.split(".")[0] for name in scope})
    excluded = [
        name
        for package in included
        for name in _package_modules(package)
        if not any(name == s or name.startswith(s + ".") for s in scope)
        and not any(s.startswith(name + ".") for s in scope)  # a package on the way to the scope
    ]
    with atheris.instrument_imports(include=[*included, "fuzz"], exclude=excluded):
        return importlib.import_module(f"fuzz.{target}")


def fuzz(target: str, libfuzzer_args: list[str]) -> None:
    """Run one target under libFuzzer in this process (libFuzzer exits it when done)."""
    import atheris

    module = load(target)
    # Recovery's warnings ("truncating … torn tail") would be one line per input, millions.
    logging.disable(logging.CRITICAL)
    defaults = [
        f"-timeout={INPUT_TIMEOUT}",
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        f"-max_len={module.MAX_LEN}",
    ]
    given = {arg.split("=", 1)[0] for arg in libfuzzer_args if arg.startswith("-")}
    if not any(not arg.startswith("-") for arg in libfuzzer_args):
        # No corpus named: learn into fuzz/.work, seeded by the committed corpus (libFuzzer
        # adds new inputs to the first directory it is given, so never the committed one).
        work = WORK / target
        (work / "corpus").mkdir(parents=True, exist_ok=True)
        defaults += [f"-artifact_prefix={work}/", str(work / "corpus"), str(CORPUS / target)]
    args = [a for a in defaults if a.split("=", 1)[0] not in given] + libfuzzer_args
    atheris.Setup([sys.argv[0], *args], module.fuzz_one)
    atheris.Fuzz()


def write_seeds() -> None:
    """Write every target's ``seeds()`` to ``fuzz/corpus/<target>/seed-<name>``."""
    for target in TARGETS:
        module = importlib.import_module(f"fuzz.{target}")
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in module.seeds().items():
            (folder / f"seed-{name}").write_bytes(data)
        print(f"{target}: {len(module.seeds())} seeds in {folder.relative_to(ROOT.parent)}")


_EXECS = re.compile(r"stat::number_of_executed_units: (\d+)")
_COV = re.compile(r"\bcov: (\d+) ft: (\d+)")


def campaign(targets: list[str], seconds: int) -> int:
    """Each target for ``seconds`` in its own process; a table of executions and coverage."""
    rows = []
    failed = 0
    for target in targets:
        work = WORK / target
        (work / "corpus").mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "fuzz.run", target, f"-max_total_time={seconds}", "-print_final_stats=1"]
        print(f"== {target} ({seconds} s)", flush=True)
        started = time.monotonic()
        # The target's own timeout and memory limit end it; the margin here only catches a
        # libFuzzer that cannot even stop (it would otherwise hold `make fuzz` forever).
        proc = subprocess.run(
            cmd, cwd=ROOT.parent, capture_output=True, text=True, timeout=seconds * 2 + 120, check=False
        )
        elapsed = time.monotonic() - started
        output = proc.stdout + proc.stderr
        execs = _EXECS.findall(output)
        cov = _COV.findall(output)
        ok = proc.returncode == 0
        failed += not ok
        rows.append(
            (
                target,
                execs[-1] if execs else "?",
                cov[-1][0] if cov else "?",
                cov[-1][1] if cov else "?",
                len(os.listdir(work / "corpus")),
                f"{elapsed:.0f}",
                "ok" if ok else f"FINDING (exit {proc.returncode})",
            )
        )
        if not ok:
            print("\n".join(output.splitlines()[-40:]))
            print(f"artifacts: {work}/")
    header = ("target", "executions", "cov", "features", "corpus", "seconds", "result")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print()
    for row in [header, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if argv and not argv[0].startswith("-"):
        fuzz(argv[0], argv[1:])
        return 0  # not reached: libFuzzer exits
    parser = argparse.ArgumentParser(prog="python -m fuzz.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="run every target in turn")
    parser.add_argument("--seconds", type=int, default=60, help="per target (default 60)")
    parser.add_argument("--targets", default="", help="comma-separated subset of the targets")
    parser.add_argument("--write-seeds", action="store_true", help="rewrite fuzz/corpus/*/seed-*")
    args = parser.parse_args(argv)
    if args.write_seeds:
        write_seeds()
        return 0
    if args.all or args.targets:
        chosen = [t for t in args.targets.split(",") if t] or list(TARGETS)
        unknown = sorted(set(chosen) - set(TARGETS))
        if unknown:
            parser.error(f"unknown targets {unknown}; targets: {', '.join(TARGETS)}")
        return campaign(chosen, args.seconds)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
