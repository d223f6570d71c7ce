"""Feed processors that worker processes load by name (``--processor tests.support.processors:done``)."""

from __future__ import annotations

from sluiceway.feed import Item


def done(item: Item) -> dict[str, object]:
    """Every item is finished in one step."""
    return {"done": True}
