"""The port every table format implements for the table sinks (``delta``, ``iceberg``).

A *commit marker* makes each write exactly once per micro-batch: ``app`` names one sink of one
pipeline in one checkpoint's life, ``batch`` is Spark's batch id, and the table stores the pair in
the same atomic commit as the data (Delta: the log's ``txn`` application transaction; Iceberg:
snapshot summary properties). :meth:`LakeTable.committed` reads it back: a batch at or below it
is a replay of a commit that already happened, and commits nothing.
"""

from __future__ import annotations

import os
from typing import Protocol

import pyarrow as pa


class LakeTable(Protocol):
    def check(self) -> None:
        """Reach the table or where it will be made (at start, before any batch); raise
        :class:`~sluiceway.pipeline.errors.DestinationUnreachable` saying why not."""

    def schema(self) -> pa.Schema | None:
        """The table's schema as Arrow (``None``: no table yet)."""

    def committed(self, app: str) -> int | None:
        """The last batch ``app`` committed (``None``: none)."""

    def append(self, rows: pa.Table, app: str, batch: int) -> None:
        """Add ``rows`` in one commit (creating the table, adding new columns) with the marker."""

    def mirror(self, changes: pa.Table, truncated: list[str], keys: list[str], app: str, batch: int) -> None:
        """Apply the last change of every key (``op`` ``delete``: remove the row; else upsert) and
        empty the ``truncated`` namespaces, in one commit with the marker."""

    def staging_dir(self) -> str | None:
        """A local directory, on the table's file system, where Spark may write a batch's Parquet
        files for :meth:`add_files` (``None``: the table is not on a local file system)."""

    def add_files(self, staged: str, files: list[str], schema: pa.Schema, app: str, batch: int) -> None:
        """Move Parquet files from ``staged`` (paths relative to it, kept) into the table's data
        files and add them in one commit with the marker, creating the table or adding columns as
        ``schema`` needs. A file already moved by an attempt that died is replaced."""

    def optimize(self) -> None:
        """Compact small files (a commit that changes no data)."""


def move_into(staged: str, files: list[str], root: str) -> None:
    """Move ``files`` (relative paths) from ``staged`` to the same paths under ``root``."""
    for name in files:
        target = os.path.join(root, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(os.path.join(staged, name), target)
