"""Spark fixtures for the pipeline tests: the session's SparkSession with our sources registered."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def sluice_spark(spark: Any) -> Any:
    from sluiceway.pipeline import register_sources

    register_sources(spark)
    return spark
