"""The examples in sluiceway's docstrings (``>>>`` lines) hold: every module's doctests run here,
so an example a change makes wrong fails the suite. Examples that need a server or a session are
written as literal blocks (``For example::``), not as doctests."""

from __future__ import annotations

import doctest
import importlib
import io
import pkgutil

import pytest

import sluiceway

MODULES = sorted(m.name for m in pkgutil.walk_packages(sluiceway.__path__, "sluiceway."))


def test_every_module_is_looked_at_and_the_examples_are_run() -> None:
    assert len(MODULES) > 150 and "sluiceway.cdc.mysql.progress" in MODULES
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(importlib.import_module("sluiceway.cdc.mysql.gtid")):
        runner.run(test, out=lambda text: None)
    assert runner.tries >= 1 and runner.failures == 0  # covers() has one


@pytest.mark.parametrize("name", MODULES)
def test_the_modules_examples_hold(name: str) -> None:
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    for test in doctest.DocTestFinder().find(module, name):  # the module's own objects only
        runner.run(test, out=report.write)
    assert runner.failures == 0, report.getvalue()
