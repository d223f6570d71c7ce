"""The copy's state on disk, beside the capture's journal.

``<state dir>/`` (the pipeline passes ``<checkpoint>/_cdc/state``):

* ``state.json`` — the copy's progress per table (where the next chunk starts, rows copied,
  whether it completed and where its ``T`` marker is), the chunk being taken, the position of
  the last watermark (the copy's *frontier*), and where each chunk's window closed;
* ``chunks/<id>.arrow`` — a copied chunk's rows (key, JSON value) and its snapshot, written and
  fsynced before its ``H`` watermark, removed once the capture's journal holds its close.

The copier holds ``lock`` (``flock``) while it runs, so finding a chunk ``open`` while holding
the lock means its taker died.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from sluiceway.cdc.model import Chunk, Snapshot
from sluiceway.files import exclusive, fsync, write_json


@dataclass
class TableCopy:
    #: Where the next chunk starts: the last copied key's column texts (``[page]`` without a key).
    last: list[str] | None = None
    rows: int = 0
    chunks: int = 0
    done: bool = False
    #: Position of the table's ``T`` marker (its copy complete).
    completed_at: int | None = None


@dataclass
class CopyState:
    next_chunk: int = 1
    tables: dict[str, TableCopy] = field(default_factory=dict)
    #: The chunk being taken: its ``L`` may be in the WAL, its ``H`` not yet.
    open: int | None = None
    #: Position of the last watermark written (readers at or past it may take the next chunk).
    frontier: int = 0
    #: Where each chunk's window closed (``H`` or ``A``), until the slot passes it.
    closes: dict[str, int] = field(default_factory=dict)
    #: Position when the last table's copy completed.
    done_at: int | None = None

    def all_copied(self, namespaces: Iterable[str]) -> bool:
        """Every table of ``namespaces`` has been copied whole."""
        return all(self.tables.get(n, TableCopy()).done for n in namespaces)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CopyState:
        tables = {k: TableCopy(**v) for k, v in data.get("tables", {}).items()}
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "tables"}
        return cls(tables=tables, **known)


class SourceState:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)

    def locked(self) -> contextlib.AbstractContextManager[bool]:
        return exclusive(self.dir / "lock")

    # -- the copy ----------------------------------------------------------------------------------
    def load(self) -> CopyState:
        try:
            return CopyState.from_json(json.loads((self.dir / "state.json").read_text()))
        except FileNotFoundError:
            return CopyState()

    def save(self, state: CopyState) -> None:
        write_json(self.dir / "state.json", asdict(state), durable=True)

    # -- chunks ------------------------------------------------------------------------------------
    def chunk_path(self, chunk: int) -> Path:
        return self.dir / "chunks" / f"{chunk}.arrow"

    def write_chunk(
        self,
        chunk: int,
        namespace: str,
        snapshot: Snapshot,
        read_time: int,
        keys: pa.Array,
        values: pa.Array,
    ) -> None:
        """Save a chunk durably (before its ``H`` watermark makes it part of the stream)."""
        path = self.chunk_path(chunk)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            b"namespace": namespace.encode(),
            b"snapshot": str(snapshot).encode(),
            b"read_time": str(read_time).encode(),
        }
        columns = {"key": keys.cast(pa.string()), "value": values.cast(pa.binary())}
        table = pa.table(columns).replace_schema_metadata(meta)
        tmp = path.with_suffix(".tmp")
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        fsync(tmp)
        os.replace(tmp, path)
        fsync(path.parent)

    def load_chunk(self, chunk: int) -> Chunk | None:
        try:
            with pa.memory_map(str(self.chunk_path(chunk))) as source:
                table = pa.ipc.open_file(source).read_all()
        except FileNotFoundError:
            return None
        meta = table.schema.metadata or {}
        return Chunk(
            chunk,
            meta[b"namespace"].decode(),
            Snapshot.parse(meta[b"snapshot"].decode()),
            int(meta[b"read_time"]),
            table.column("key").combine_chunks(),
            table.column("value").combine_chunks(),
        )
