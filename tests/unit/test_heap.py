"""The collector settings a long-running CLI process takes (sluiceway/heap.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_tune_collector_freezes_start_up_and_raises_the_young_threshold() -> None:
    # In a process of its own: the settings are process-wide and the test run's must not change.
    code = textwrap.dedent(
        """
        import gc
        from sluiceway.heap import YOUNG_THRESHOLD, tune_collector
        before = gc.get_threshold()
        tune_collector()
        raised = gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
        print(raised, before[0] < YOUNG_THRESHOLD, gc.get_freeze_count() > 1000)
        class Cycle:
            pass
        a = Cycle(); a.me = a; del a
        print(gc.collect())  # cycles made after the freeze are still collected
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    first, collected = out.stdout.splitlines()
    assert first == "True True True"
    assert int(collected) >= 1
