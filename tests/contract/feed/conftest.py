from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from sluiceway.feed import Feed


@pytest.fixture
def prefix() -> str:
    """Tables of their own for each test (the database is shared by a test module)."""
    return f"t{uuid.uuid4().hex[:8]}_"


@pytest.fixture
def feed(any_dsn: str, prefix: str) -> Iterator[Feed]:
    with Feed(any_dsn, prefix=prefix) as f:
        yield f
