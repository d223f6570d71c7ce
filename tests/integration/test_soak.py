"""The soak (bench/soak.py) for one minute: the harvester, a continuous pipeline and two feed
workers, as the CLI runs them, side by side under a steady load; every record accounted for.

The 30-minute run and its memory slopes are in docs/benchmarks.md; here only the accounting is
checked (timings and memory figures are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def test_one_minute_of_all_four_parts_accounts_for_every_record() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "1", "--sample", "5", "--rate", "100",
         "--drain-timeout", "120"],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["problems"] == []
    stashed = result["stashed"]
    assert stashed >= 1000, result  # a minute at 100 records a second, whatever the machine's pace
    assert result["journal_records"] - result["journal_repeats"] == stashed
    assert result["parquet_rows"] >= stashed
    assert result["feed_complete"] == result["feed_items"] > 0
    sampled = set(result["processes"])
    assert {"harvester", "pipeline driver", "pipeline JVM", "feed worker 1", "feed worker 2"} <= sampled
