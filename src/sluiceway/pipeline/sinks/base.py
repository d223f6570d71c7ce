"""The sink port: every writer takes an Arrow table of records (in order) and a token.

``token`` identifies exactly this slice of exactly this batch of this checkpoint's life; a
writer that can store it atomically with the data (journal register, Postgres progress row,
file name) uses it to make a replayed write a no-op. Writers are created where a part of the batch is
written (a Spark task on an executor; the driver for ``step``) and never pickled; each kind's is
built by its row in :data:`~sluiceway.pipeline.sinks.kinds.SINK_KINDS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, Protocol, TypeVar

import pyarrow as pa

Client = TypeVar("Client")


class SinkWriter(Protocol):
    def write(self, table: pa.Table, token: str) -> None: ...

    def close(self) -> None: ...


class ClientSink(ABC, Generic[Client]):
    """A writer that holds one client (a connection, a producer, an open journal) across writes:
    opened by the first write, where the batch runs, and dropped after any failed write, so the
    retry starts from a fresh one — a failed append, a lost connection or a producer's stale queue
    may leave the old one unusable. A subclass says how to open, write, release and discard it,
    and which failures are the destination's rather than a record's (:meth:`_failure`).
    """

    _client: Client | None = None

    @abstractmethod
    def _open(self) -> Client:
        """Open the client (a failure here goes through :meth:`_failure` too)."""

    @abstractmethod
    def _write(self, client: Client, table: pa.Table, token: str) -> None: ...

    @abstractmethod
    def _release(self, client: Client) -> None:
        """Close the client after the last write (let it finish what it holds)."""

    def _discard(self, client: Client) -> None:
        """Drop the client after a failed write (the write is retried whole)."""
        self._release(client)

    def _failure(self, exc: Exception) -> Exception | None:
        """What a failed write raises instead of ``exc`` (None: ``exc`` itself). Called before
        the client is dropped, so it can still ask the client (a broken connection?)."""
        return None

    def write(self, table: pa.Table, token: str) -> None:
        try:
            if self._client is None:
                self._client = self._open()
            self._write(self._client, table, token)
        except Exception as exc:
            raised = self._failure(exc)
            self._drop()
            if raised is None or raised is exc:
                raise
            raise raised from exc
        except BaseException:
            self._drop()
            raise

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            self._discard(client)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            self._release(client)
