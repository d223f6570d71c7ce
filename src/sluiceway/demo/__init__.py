"""The end-to-end demo behind ``sluice demo`` / ``make demo``."""

from sluiceway.demo.run import DemoReport, run_demo

__all__ = ["DemoReport", "run_demo"]
