"""Console sink: a readable line per record (for trying pipelines out)."""

from __future__ import annotations

import sys
from typing import Any

import pyarrow as pa


def render(row: dict[str, object]) -> str:
    value = row.get("value")
    if isinstance(value, bytes):
        text = value[:80].decode("utf-8", "replace") + ("…" if len(value) > 80 else "")
    else:
        text = "∅" if value is None else str(value)
    headers: Any = row.get("headers") or []
    hs = " ".join(f"{h['key']}={h['value']}" for h in headers)
    extra = " ".join(
        f"{k}={v}"
        for k, v in row.items()
        if k not in ("offset", "namespace", "op", "key", "value", "headers", "timestamp")
    )
    parts = [str(row.get("offset")), str(row.get("namespace")), str(row.get("op")), str(row.get("key")), text]
    return "  ".join(p for p in (*parts, hs, extra) if p)


class ConsoleSink:
    def __init__(self, name: str, limit: int = 20) -> None:
        self.name = name
        self.limit = limit

    def write(self, table: pa.Table, token: str) -> None:
        self.show(table, table.num_rows)

    def show(self, head: pa.Table, total: int) -> None:
        """Print the first rows of a batch of ``total`` records (the rest are counted)."""
        rows = head.slice(0, self.limit).to_pylist()
        out = [f"--- {self.name}: {total} record(s)"]
        out.extend(render(r) for r in rows)
        if total > len(rows):
            out.append(f"… {total - len(rows)} more")
        sys.stdout.write("\n".join(out) + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        pass
