"""Scraping a process's ``/metrics`` the way Prometheus does, for the metrics tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support import ROOT


def scrape(port: int) -> dict[str, float]:
    """Every sample as ``name{label="value",…}`` (labels sorted) → value; empty while not up."""
    try:
        body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return {}
    samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = float(sample.value)
    return samples


@contextlib.contextmanager
def sluice_process(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``sluice ARGS`` in a process of its own (``env``: variables besides), output in ``log``;
    killed if the test leaves it running."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluiceway.cli.main", *args],
            cwd=ROOT,
            # This tree's code first, whatever the virtualenv was installed from (a git worktree).
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
                "PYSPARK_PYTHON": sys.executable,
                **(env or {}),
            },
            stdout=out,
            stderr=out,
            start_new_session=True,  # its own process group: a JVM it starts goes with it
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(30)
