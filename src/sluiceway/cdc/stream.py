"""Reading a logical slot over the streaming replication protocol, on a thread of its own.

Why this shape:

* **One decode per change.** The walsender decodes each change once and pushes it; the old
  path decoded it twice (a *peek*, then ``pg_replication_slot_advance``).
* **Our own ten lines of the protocol, on psycopg 3's libpq.** psycopg 3 has no replication
  client (psycopg/psycopg#71), but its ``pq`` layer gives libpq's COPY BOTH calls, and the
  protocol is two message kinds (``w`` data, ``k`` keepalive) and one reply (``r`` status).
  psycopg2's client was used before and is not: on a keepalive it moves the flush position it
  reports to the server's WAL end by itself once the last message it saw is confirmed, so the
  slot could pass what the capture's log holds (a 56-byte gap seen in a test). Here the flush
  position reported is only ever what :meth:`ReplicationStream.confirm` was given.
* **Receiving beside parsing.** The receiver thread only reads messages and hands them over in
  lists (one queue operation per few hundred messages, not per message); the capture parses
  and appends them on its own thread. libpq is called without the GIL while it waits.
* **Back-pressure without losing the connection.** The hand-over queue is bounded: when the
  target is slow the receiver stops reading (the server's send buffer fills and the walsender
  waits), yet it keeps sending status updates so the connection survives.
* **Quiet positions.** When the socket runs dry after a keepalive, every change the server
  decoded before the keepalive's WAL end has been handed over; the receiver hands that position
  over too, so the capture can record it and confirm it — the slot then follows the server's
  WAL through writes to tables outside the publication, as every replication client does, but
  only after the log holds the position.
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
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from psycopg import pq

from sluiceway.cdc.errors import CdcError, StreamInterrupted

log = logging.getLogger("sluiceway.cdc")

#: One received message: (0, 0, the pgoutput bytes) — the row shape the pure assembly takes
#: (position and xid are read from the messages themselves: Begin, Commit, Message carry them).
Message = tuple[int, int, bytes]

#: A hand-over: a list of messages; an ``int``, a quiet position (every change before it has
#: been handed over); ``None``, the stream ended (see ``error``).
Handover = list[Message] | int | None

_Q = struct.Struct("!Q").unpack_from
_STATUS = struct.Struct("!cQQQqB").pack
_EPOCH_2000_US = 946_684_800_000_000  # PostgreSQL's timestamps count from 2000-01-01


@dataclass
class StreamOptions:
    dsn: str
    slot: str
    publication: str
    #: Messages per hand-over at most (the receiver also hands over whenever the socket is empty).
    handover: int = 2048
    #: Hand-overs the queue holds before the receiver stops reading (back-pressure).
    depth: int = 64
    #: Seconds between standby status updates (and quiet positions) when nothing else prompts one.
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
    #: Why the stream ended, if it failed (a :class:`StreamInterrupted` when the connection went).
    error: CdcError | None = field(default=None, init=False)
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
        pgconn = self._conn.pgconn
        opts = self.options
        command = (
            f'START_REPLICATION SLOT "{opts.slot}" LOGICAL 0/0 '
            f"(proto_version '1', publication_names '{opts.publication}', messages 'true')"
        )
        pgconn.send_query(command.encode())
        result = pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            error = _failed(pgconn, result, f"cannot stream slot {opts.slot!r}")
            self._close()
            raise error
        self._thread = threading.Thread(
            target=self._receive, args=(pgconn,), name=f"sluice-cdc-receive-{opts.slot}", daemon=True
        )
        self._thread.start()

    def take(self, timeout: float) -> Handover:
        """The next hand-over (``[]`` when none came within ``timeout``; ``None``: the stream ended)."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return []

    def take_nowait(self) -> Handover:
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return []

    def confirm(self, position: int) -> None:
        """The target holds everything up to ``position`` durably: the server may release it."""
        if position > self._confirmed:
            self._confirmed = position
            self._confirm_now.set()

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
        self._close()

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to release
                self._conn.close()
            self._conn = None

    # -- the receiving thread --------------------------------------------------------------------
    def _connect(self) -> Any:
        import psycopg

        from sluiceway.db.connection import connect_error

        opts = self.options
        dsn = opts.unix_socket or _libpq_dsn(opts.dsn)
        try:
            return psycopg.connect(
                dsn,
                autocommit=True,
                replication="database",
                connect_timeout=max(1, int(opts.connect_timeout)),
                application_name=f"sluice-capture:{opts.slot}",
            )
        except psycopg.Error as exc:
            if opts.unix_socket:
                log.warning("cdc: the Unix socket did not take the connection (%s); using TCP", _first(exc))
                opts.unix_socket = None
                return self._connect()
            raise connect_error(exc, "cannot open a replication connection") from exc

    def _receive(self, pgconn: Any) -> None:
        limit = self.options.handover
        interval = self.options.status_interval
        last_status = last_quiet = 0.0
        quiet = 0  # the last quiet position handed over
        keepalive_end = 0  # the WAL end of the last keepalive read (0: a message came after it)
        fileno = pgconn.socket
        read = pgconn.get_copy_data
        try:
            while not self._stop.is_set():
                handover: list[Message] = []
                append = handover.append
                size, last = 0, None
                # The hot loop: one message costs a read, a kind test and a copy of its bytes.
                # (The position in a row is left 0: the capture reads positions from the messages.)
                for _ in range(limit):
                    size, data = read(1)
                    if size <= 0:
                        break
                    if data[0] == 0x77:  # 'w': XLogData (start, WAL end, send time, the message)
                        append((0, 0, data[25:].tobytes()))
                        last = data
                    elif data[0] == 0x6B:  # 'k': keepalive (WAL end, send time, reply requested)
                        keepalive_end = self.wal_end = max(self.wal_end, _Q(data, 1)[0])
                        last = None
                        if data[17]:
                            self._status(pgconn)
                            last_status = time.monotonic()
                    # nothing else is sent on a logical stream; what is not ours is ignored
                if size < 0:  # the server ended the stream (psycopg raises on an error)
                    raise _ended(pgconn, self.options.slot)
                now = time.monotonic()
                if handover:
                    if last is not None:  # a message came after the last keepalive
                        keepalive_end = 0
                        self.wal_end = max(self.wal_end, _Q(last, 9)[0])
                    self._hand_over(handover, pgconn)
                if size == 0 and keepalive_end > quiet and now - last_quiet >= interval:
                    # Dry after a keepalive: everything before its WAL end has been handed over.
                    with contextlib.suppress(queue.Full):  # the capture is behind: next time
                        self._queue.put_nowait(keepalive_end)
                        quiet, last_quiet = keepalive_end, now
                if self._confirm_now.is_set() or now - last_status >= interval:
                    self._confirm_now.clear()
                    self._status(pgconn)
                    last_status = now
                if size == 0:
                    # The socket is empty: wait for data, a confirmation, or the next status update.
                    select.select([fileno], [], [], 0.02 if self._confirm_now.is_set() else 0.1)
                    pgconn.consume_input()
            # Stopping: tell the server what the target holds before the connection goes.
            self._status(pgconn)
        except CdcError as exc:
            if not self._stop.is_set():
                self.error = exc
        except BaseException as exc:  # psycopg's (a connection broken mid-call): transient
            if not self._stop.is_set():
                self.error = StreamInterrupted(
                    f"the replication stream from slot {self.options.slot!r} ended: {_first(exc)}"
                )
        finally:
            self._put(None)

    def _hand_over(self, handover: list[Message], pgconn: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(handover, timeout=self.options.status_interval)
                return
            except queue.Full:
                # The target is behind: stop reading, but keep the connection alive.
                self._status(pgconn)

    def _status(self, pgconn: Any) -> None:
        """A standby status update: written = flushed = applied = what the target holds."""
        confirmed = self._confirmed
        now = int(time.time() * 1_000_000) - _EPOCH_2000_US
        pgconn.put_copy_data(_STATUS(b"r", confirmed, confirmed, confirmed, now, 0))
        pgconn.flush()

    def _put(self, item: Handover) -> None:
        while True:
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                if self._stop.is_set():
                    return


def _first(exc: BaseException | str) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _sqlstate(result: Any) -> str:
    code = None if result is None else result.error_field(pq.DiagnosticField.SQLSTATE)
    return code.decode() if code else ""


def _failed(pgconn: Any, result: Any, what: str) -> CdcError:
    """The error a failed command or stream reports: a lost connection (libpq's own errors carry
    no SQLSTATE; the server's shutdown and connection ones are classes 57 and 08) is
    :class:`StreamInterrupted`, to be waited out; anything else (a slot dropped while we read it,
    a publication missing) is the operator's, named in one line."""
    message = (result.error_message if result is not None else b"") or pgconn.error_message
    text = _first(message.decode(errors="replace")).removeprefix("ERROR:").strip() or "no reason given"
    code = _sqlstate(result)
    lost = pgconn.status == pq.ConnStatus.BAD or not code or code[:2] in ("57", "08")
    return (StreamInterrupted if lost else CdcError)(f"{what}: {text}")


def _ended(pgconn: Any, slot: str) -> CdcError:
    """Why the server ended the stream."""
    result = pgconn.get_result()
    return _failed(pgconn, result, f"the replication stream from slot {slot!r} ended")


def _libpq_dsn(dsn: str) -> str:
    """A libpq DSN from ours (a URL or ``key=value`` pairs)."""
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
