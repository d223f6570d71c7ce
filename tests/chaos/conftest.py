"""Fixtures of the chaos tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluiceway.testing import PrivatePostgres


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    """A PostgreSQL server of the module's own, which its tests may restart or stop (restarting
    the shared one would cut every other test's connections)."""
    pg = PrivatePostgres({"fsync": "off"}).start()
    try:
        yield pg
    finally:
        pg.stop()
