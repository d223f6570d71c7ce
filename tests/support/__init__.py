"""Helpers shared by test modules: load generators, checks, process drivers, sample files.

Test modules import from here and never from each other; fixtures stay in ``conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

#: The repository root (the working directory of the subprocesses tests start).
ROOT = Path(__file__).resolve().parents[2]
