"""How the views show stored values: a short, safe preview of a payload, and times as ISO text."""

from __future__ import annotations

from datetime import UTC, datetime

#: Characters of a payload shown in a listing.
PREVIEW = 120


def preview(value: object, limit: int = PREVIEW) -> str | None:
    """A payload as text for a listing: UTF-8 decoded (undecodable bytes replaced), cut at
    ``limit`` characters with an ellipsis; ``None`` stays ``None`` (a tombstone).

    >>> preview(b'{"total": 12}')
    '{"total": 12}'
    >>> preview("x" * 200, limit=5)
    'xxxx…'
    """
    if value is None:
        return None
    if isinstance(value, memoryview | bytearray):
        value = bytes(value)
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def iso(value: object) -> str | None:
    """A timestamp from any driver (datetime, or SQLite's ISO text) as ISO-8601 UTC text."""
    if value is None:
        return None
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return aware.astimezone(UTC).isoformat()
    return str(value)
