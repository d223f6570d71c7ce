"""File sinks (parquet, json lines, csv): one file per write, named by its token.

A write goes to a temporary name and is renamed into place, so readers never see half a file,
and a replayed write produces the same name and replaces it: idempotent per batch. Written with
pyarrow by the Spark tasks into ``<path>/.staging``, then put in place by the driver in batch
order; on a cluster ``path`` must be on a file system every node sees. JSON/CSV: ``value`` is
text when it is UTF-8 (else base64 in ``value_base64``), headers are a JSON object list,
timestamps ISO-8601. A full disk or a directory it may not write to stops the sink as an
unreachable destination (no record is blamed).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from datetime import datetime
from typing import Any

import pyarrow as pa

from sluiceway.pipeline.errors import file_system_fault


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
    def __init__(self, path: str, fmt: str, *, staged: bool = False) -> None:
        self.path = path
        self.fmt = fmt
        #: Staged: files go to ``<path>/.staging`` and are listed here, for the driver to put in
        #: place in order (a task on an executor); otherwise straight into ``path``.
        self.staged: list[str] | None = [] if staged else None

    def write(self, table: pa.Table, token: str) -> None:
        where = self.path if self.staged is None else os.path.join(self.path, ".staging")
        ext = {"parquet": "parquet", "json": "jsonl", "csv": "csv"}[self.fmt]
        name = f"part-{token}.{ext}"
        tmp = os.path.join(where, f".{name}.tmp")
        try:
            os.makedirs(where, exist_ok=True)
            self._write_file(table, tmp)
            os.replace(tmp, os.path.join(where, name))
        except OSError as exc:
            # A full disk or a directory we may not write to is the destination's fault, not a
            # record's: no replay one record at a time (see ``file_system_fault``).
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            fault = file_system_fault(exc, where)
            if fault is None:
                raise
            raise fault from exc
        if self.staged is not None:
            self.staged.append(name)

    def _write_file(self, table: pa.Table, tmp: str) -> None:
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

    def close(self) -> None:
        pass
