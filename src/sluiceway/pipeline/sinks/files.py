"""File sinks (parquet, json lines, csv): one file per write, named by its token.

A write goes to a temporary name and is renamed into place, so readers never see half a file,
and a replayed write produces the same name and replaces it: idempotent per batch. Written with
pyarrow where the batch runs (the driver or the Spark Connect server), so the path is local to
it. JSON/CSV: ``value`` is text when it is UTF-8 (else base64 in ``value_base64``), headers are
a JSON object list, timestamps ISO-8601.
"""

from __future__ import annotations

import base64
import json
import os
from datetime import datetime
from typing import Any

import pyarrow as pa


def _text_row(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, bytes):
            try:
                out[k] = v.decode("utf-8")
            except UnicodeDecodeError:
                out[k] = None
                out[f"{k}_base64"] = base64.b64encode(v).decode("ascii")
        elif isinstance(v, datetime):
            out[k] = v.isoformat()
        else:
            out[k] = v
    return out


class FileSink:
    def __init__(self, path: str, fmt: str) -> None:
        self.path = path
        self.fmt = fmt

    def write(self, table: pa.Table, token: str) -> None:
        os.makedirs(self.path, exist_ok=True)
        ext = {"parquet": "parquet", "json": "jsonl", "csv": "csv"}[self.fmt]
        final = os.path.join(self.path, f"part-{token}.{ext}")
        tmp = os.path.join(self.path, f".part-{token}.{ext}.tmp")
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, tmp)
        else:
            rows = [_text_row(r) for r in table.to_pylist()]
            with open(tmp, "w", encoding="utf-8", newline="") as fh:
                if self.fmt == "json":
                    for r in rows:
                        fh.write(json.dumps(r, ensure_ascii=False) + "\n")
                else:
                    import csv

                    names = list(dict.fromkeys(k for r in rows for k in r)) or table.column_names
                    writer = csv.DictWriter(fh, fieldnames=names)
                    writer.writeheader()
                    for r in rows:
                        writer.writerow(
                            {k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in r.items()}
                        )
        os.replace(tmp, final)

    def close(self) -> None:
        pass
