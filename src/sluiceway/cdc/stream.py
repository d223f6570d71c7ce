"""Reading a logical slot over the streaming replication protocol (psycopg2), on a thread of its own.

Why this shape:

* **One decode per change.** The walsender decodes each change once and pushes it; the old
  path decoded it twice (a *peek*, then ``pg_replication_slot_advance``). psycopg 3 has no
  client for the replication protocol (psycopg/psycopg#71), so this edge module alone uses
  psycopg2's ``LogicalReplicationConnection``.
* **Receiving beside parsing.** The receiver thread only reads messages and hands them over in
  lists (one queue operation per few hundred messages, not per message); the capture parses
  and appends them on its own thread. psycopg2 releases the GIL while it waits on the socket.
* **Back-pressure without losing the connection.** The hand-over queue is bounded: when the
  target is slow the receiver stops reading (the server's send buffer fills and the walsender
  waits), yet it keeps answering the server's keepalives so the connection survives.
* **The flush position is only ever what the target holds.** :meth:`confirm` is called by the
  capture after a durable append; the receiver reports exactly that in its standby status
  updates — never the position it has received.
* **The Unix socket, if asked** (``CaptureOptions.unix_socket``) when the server is on this
  host: a receive-only client is faster over it, but the capture — busy parsing and appending
  while messages arrive — is faster over loopback TCP, which coalesces the walsender's
  one-message writes (bench/cdc.py measures both).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sluiceway.cdc.errors import CdcError

log = logging.getLogger("sluiceway.cdc")

#: One received message: (its WAL position, 0, the pgoutput bytes) — the row shape the pure
#: assembly takes (the 0 stands for the xid, which pgoutput gives in Begin, not per message).
Message = tuple[int, int, bytes]

#: A hand-over of messages; ``None`` in place of a list says the stream ended (see ``error``).
Handover = list[Message] | None


@dataclass
class StreamOptions:
    dsn: str
    slot: str
    publication: str
    #: Messages per hand-over at most (the receiver also hands over whenever the socket is empty).
    handover: int = 2048
    #: Hand-overs the queue holds before the receiver stops reading (back-pressure).
    depth: int = 64
    #: Seconds between standby status updates when nothing else prompts one.
    status_interval: float = 1.0
    connect_timeout: float = 10.0
    #: Prefer the server's Unix socket when it is on this host (see :func:`local_socket_dsn`).
    unix_socket: str | None = None


@dataclass
class ReplicationStream:
    """The slot's messages from the slot's confirmed position on, in commit order."""

    options: StreamOptions
    _queue: queue.Queue[Handover] = field(init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _confirmed: int = field(default=0, init=False)
    _confirm_now: threading.Event = field(default_factory=threading.Event, init=False)
    #: Why the stream ended, if it failed.
    error: BaseException | None = field(default=None, init=False)
    #: The server's WAL end as of the last message or keepalive.
    wal_end: int = field(default=0, init=False)
    _conn: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._queue = queue.Queue(maxsize=self.options.depth)

    # -- the capture's side ----------------------------------------------------------------------
    def start(self, confirmed: int) -> None:
        """Connect and start streaming from the slot (the server resumes at its confirmed position)."""
        self._confirmed = confirmed
        self._conn = self._connect()
        cursor = self._conn.cursor()
        try:
            cursor.start_replication(
                slot_name=self.options.slot,
                decode=False,
                options={
                    "proto_version": "1",
                    "publication_names": self.options.publication,
                    "messages": "true",
                },
            )
        except Exception as exc:
            self._conn.close()
            raise _mapped(exc, f"cannot stream slot {self.options.slot!r}") from exc
        self._thread = threading.Thread(
            target=self._receive, args=(cursor,), name=f"sluice-cdc-receive-{self.options.slot}", daemon=True
        )
        self._thread.start()

    def take(self, timeout: float) -> Handover | list[Message]:
        """The next hand-over (``[]`` when none came within ``timeout``; ``None``: the stream ended)."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return []

    def take_nowait(self) -> Handover | list[Message]:
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return []

    def confirm(self, position: int) -> None:
        """The target holds everything up to ``position`` durably: the server may release it."""
        if position > self._confirmed:
            self._confirmed = position
            self._confirm_now.set()

    @property
    def confirmed(self) -> int:
        return self._confirmed

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            # Let a receiver blocked on a full queue see the stop.
            while thread.is_alive():
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    thread.join(0.05)
        if self._conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to release
                self._conn.close()
            self._conn = None

    # -- the receiving thread --------------------------------------------------------------------
    def _connect(self) -> Any:
        import psycopg2
        import psycopg2.extras

        dsn = self.options.unix_socket or _libpq_dsn(self.options.dsn)
        try:
            return psycopg2.connect(
                dsn,
                connection_factory=psycopg2.extras.LogicalReplicationConnection,
                connect_timeout=max(1, int(self.options.connect_timeout)),
                application_name=f"sluice-capture:{self.options.slot}",
            )
        except psycopg2.Error as exc:
            if self.options.unix_socket:
                log.warning("cdc: the Unix socket did not take the connection (%s); using TCP", _first(exc))
                self.options.unix_socket = None
                return self._connect()
            raise _mapped(exc, "cannot open a replication connection") from exc

    def _receive(self, cursor: Any) -> None:
        handover: list[Message] = []
        limit = self.options.handover
        interval = self.options.status_interval
        last_status = 0.0
        fileno = cursor.fileno()
        try:
            while not self._stop.is_set():
                message = cursor.read_message()
                if message is not None:
                    handover.append((message.data_start, 0, message.payload))
                    if len(handover) < limit:
                        continue
                now = time.monotonic()
                self.wal_end = cursor.wal_end
                if handover:
                    self._hand_over(handover, cursor)
                    handover = []
                if self._confirm_now.is_set() or now - last_status >= interval:
                    self._confirm_now.clear()
                    self._status(cursor)
                    last_status = now
                if message is None:
                    # The socket is empty: wait for data, a confirmation, or the next status update.
                    select.select([fileno], [], [], 0.02 if self._confirm_now.is_set() else 0.1)
            # Stopping: tell the server what the target holds before the connection goes.
            self._status(cursor)
        except BaseException as exc:
            if not self._stop.is_set():
                self.error = exc
        finally:
            self._put(None)

    def _hand_over(self, handover: list[Message], cursor: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(handover, timeout=self.options.status_interval)
                return
            except queue.Full:
                # The target is behind: stop reading, but keep the connection alive.
                self._status(cursor)

    def _status(self, cursor: Any) -> None:
        confirmed = self._confirmed
        # write = flush = what the target holds; apply likewise (nothing to apply here).
        # force: psycopg2 would otherwise hold it back until its own status interval (10 s) passed.
        cursor.send_feedback(write_lsn=confirmed, flush_lsn=confirmed, apply_lsn=confirmed, force=True)

    def _put(self, item: Handover) -> None:
        while True:
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                if self._stop.is_set():
                    return


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _mapped(exc: BaseException, what: str) -> CdcError:
    return CdcError(f"{what}: {_first(exc)}")


def _libpq_dsn(dsn: str) -> str:
    """A libpq DSN for psycopg2 from ours (a URL or ``key=value`` pairs)."""
    from sluiceway.db.dsn import parse_dsn

    return str(parse_dsn(dsn).target)


def local_socket_dsn(dsn: str, socket_dirs: str, port: int) -> str | None:
    """``dsn`` over the server's Unix socket, when the socket is on this host; else ``None``.

    ``socket_dirs`` is the server's ``unix_socket_directories``; the socket file is
    ``<dir>/.s.PGSQL.<port>``. Only a loopback ``host`` is switched: the same host and port.
    """
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(_libpq_dsn(dsn))
    host = str(params.get("host") or "")
    if host not in ("127.0.0.1", "localhost", "::1"):
        return None
    for directory in (d.strip() for d in socket_dirs.split(",")):
        if directory and os.path.exists(os.path.join(directory, f".s.PGSQL.{port}")):
            params["host"] = directory
            params.pop("hostaddr", None)
            return make_conninfo(**params)  # type: ignore[arg-type]
    return None
