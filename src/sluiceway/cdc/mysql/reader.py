"""The binlog, read as a replica, cut into units (transactions and our watermarks).

:class:`BinlogReader` runs python-mysql-replication's ``BinLogStreamReader`` on a thread of its
own, from a position the capture's target holds, and hands over lists of
:class:`~sluiceway.cdc.mysql.assemble.Unit` — each change already keyed and encoded as JSON
(:mod:`~sluiceway.cdc.mysql.values`), so the capture's appender only assembles and appends.
Every transaction makes a unit, also one that touched none of the captured tables: its end is a
position the capture may confirm.

Column names come from the row events themselves (``binlog_row_metadata = FULL``), so a column
added under load is in the next event's rows with no lookup that could race the DDL; a column
whose type changes stops the reader with one line (a consumer's schema would silently change).

The library reconnects by itself after a lost connection, from its own idea of the position;
that is switched off here (see :func:`_no_silent_reconnect`): a lost connection ends the stream,
and the capture resumes from what its target holds — the one position that is known to be right.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluiceway.cdc.errors import CdcError, LostChangesError, StreamInterrupted
from sluiceway.cdc.mysql import tablemaps
from sluiceway.cdc.mysql.assemble import Change, Unit, position, split_position
from sluiceway.cdc.mysql.server import WATERMARKS, BinlogTable
from sluiceway.cdc.mysql.values import binlog_time, key_text, row_json
from sluiceway.cdc.watermark import Watermark

log = logging.getLogger("sluiceway.cdc")

_TRUNCATE = re.compile(r"^\s*TRUNCATE\s+(?:TABLE\s+)?(?:`?([^`.\s]+)`?\.)?`?([^`\s;]+)`?", re.IGNORECASE)
#: The binlog's column type of TIME with fractional seconds (MySQL 5.6+, MariaDB 10.1+).
_TIME2 = 19
#: MariaDB's GTID event flag for a statement with no COMMIT/XID after it (DDL).
_STANDALONE = 1
#: ER_MASTER_FATAL_ERROR_READING_BINLOG: the binlog asked for (a file, or a GTID) is not there.
_CANNOT_SEND = 1236


@dataclass(frozen=True)
class ReaderOptions:
    settings: Mapping[str, Any]
    server_id: int
    database: str
    tables: Mapping[str, BinlogTable]
    prefix: str
    #: The binlog file names by sequence number (the start position names one of them).
    files: Mapping[int, str]
    #: The epoch of the positions read (:mod:`~sluiceway.cdc.mysql.gtid`).
    epoch: int = 0


def _no_silent_reconnect() -> None:
    from pymysqlreplication import binlogstream

    binlogstream.MYSQL_EXPECTED_ERROR_CODES = []


class BinlogReader:
    """Reads from ``start``'s file and offset, or — ``gtid`` given, after a move to another server
    — from the place MariaDB finds for that GTID state (the first event names the file)."""

    def __init__(self, options: ReaderOptions, start: int, gtid: str | None = None) -> None:
        self.options = options
        self.start_at = start
        self.gtid = gtid
        self.error: BaseException | None = None
        self._queue: queue.SimpleQueue[list[Unit] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream: Any = None
        #: Column types per table as the binlog last showed them (a change of one stops the reader).
        self._types: dict[str, dict[str, int]] = {}

    def start(self) -> None:
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import (
            GtidEvent,
            HeartbeatLogEvent,
            MariadbGtidEvent,
            QueryEvent,
            RotateEvent,
            XidEvent,
        )
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        _no_silent_reconnect()
        tablemaps.install()
        opts = self.options
        name: str | None = None
        if self.gtid is None:
            number, pos = split_position(self.start_at)
            name = opts.files.get(number)
            if name is None:
                raise CdcError(f"binary log number {number} is not on the server")
            # File and offset: the library reads MariaDB's events either way, but in its MariaDB
            # mode it starts from a GTID state only.
            start: dict[str, Any] = {"log_file": name, "log_pos": pos, "is_mariadb": False}
        else:
            start = {"auto_position": self.gtid, "is_mariadb": True}
        schemas = {t.schema for t in opts.tables.values()} | {opts.database}
        names = {t.name for t in opts.tables.values()} | {WATERMARKS}
        self._stream = BinLogStreamReader(
            connection_settings=dict(opts.settings),
            server_id=opts.server_id,
            blocking=True,
            resume_stream=True,
            **start,
            only_schemas=sorted(schemas),
            only_tables=sorted(names),
            only_events=[
                RotateEvent, GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent, HeartbeatLogEvent,
                WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent,
            ],
            enable_logging=False,
        )  # fmt: skip
        # Table maps parsed once per distinct event, across rotates (see tablemaps; the library
        # replaces its map with a plain dict at a rotate, and the rotate below puts ours back).
        self._memo: dict[bytes, Any] = {}
        self._stream.table_map = tablemaps.TableMap(self._memo)
        self._kinds = (
            RotateEvent,
            MariadbGtidEvent,
            GtidEvent,
            QueryEvent,
            XidEvent,
            WriteRowsEvent,
            UpdateRowsEvent,
        )
        self._thread = threading.Thread(
            target=self._run, args=(name,), name="sluice-binlog-reader", daemon=True
        )
        self._thread.start()

    def take(self, timeout: float) -> list[Unit] | None:
        """The next units (``[]``: none within ``timeout``); ``None``: the stream ended (see
        :attr:`error`)."""
        try:
            got = self._queue.get(timeout=timeout)
        except queue.Empty:
            return []
        if got is None:
            self._queue.put(None)  # stays ended
            return None
        more = [got]
        while True:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._queue.put(None)
                break
            more.append(nxt)
        return [u for batch in more for u in batch]

    def stop(self) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            # A read blocked in the socket ends only when the socket is shut down under it.
            with contextlib.suppress(Exception):
                stream._stream_connection._sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(Exception):
                stream.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)

    # -- the thread --------------------------------------------------------------------------------
    def _run(self, file: str | None) -> None:
        rotate, mariadb_gtid, gtid_event, query_event, xid_event, write_event, update_event = self._kinds
        opts = self.options
        epoch = opts.epoch
        watermark_ns = f"{opts.database}.{WATERMARKS}"
        # From a GTID state the server's first event is a rotate naming the file (units come after).
        number = 0 if file is None else int(file.rpartition(".")[2])
        file = file or ""
        gtid, mark = "", None
        changes: list[Change] = []
        in_txn = False  # between a transaction's start and its XID/COMMIT
        pending: list[Unit] = []
        try:
            for event in self._stream:
                if self._stop.is_set():
                    break
                if isinstance(event, rotate):
                    file = event.next_binlog
                    number = int(file.rpartition(".")[2])
                    # Table ids are the server's in-memory numbers: after a restart the same id may
                    # name another table. The library forgets its map only on a rotate the old
                    # server wrote, which a clean shutdown does not (it ends the file with a stop
                    # event), so a table filtered out here would be decoded with a stale layout.
                    self._stream.table_map = tablemaps.TableMap(self._memo)
                    continue
                if isinstance(event, mariadb_gtid):
                    gtid, changes, mark = event.gtid, [], None
                    in_txn = not event.flags & _STANDALONE
                    continue
                if isinstance(event, gtid_event):
                    gtid, changes, mark, in_txn = event.gtid, [], None, False
                    continue
                if isinstance(event, query_event):
                    query = (
                        event.query if isinstance(event.query, str) else event.query.decode(errors="replace")
                    )
                    head = query.lstrip()[:8].upper()
                    if head.startswith("BEGIN"):
                        in_txn = True
                        continue
                    if not head.startswith("COMMIT"):
                        if in_txn:
                            continue  # SAVEPOINT and the like, inside a transaction
                        self._ddl(query, event, changes)  # a DDL statement: a transaction of its own
                elif not isinstance(event, xid_event):
                    if hasattr(event, "rows"):
                        namespace = f"{event.schema}.{event.table}"
                        if namespace == watermark_ns:
                            mark = self._watermark(event, write_event) or mark
                        elif namespace in opts.tables:
                            self._changes(event, namespace, write_event, update_event, changes)
                    continue  # a row event, or a heartbeat
                end = event.packet.log_pos
                pending.append(
                    Unit(
                        position(number, end, epoch),
                        file,
                        end,
                        int(event.timestamp) * 1_000_000,
                        gtid,
                        changes,
                        mark,
                    )
                )
                gtid, changes, mark, in_txn = "", [], None, False
                # Handed over at once: the next read may block for as long as the server is quiet
                # (take() joins what has queued up into one list).
                self._queue.put(pending)
                pending = []
        except BaseException as exc:
            if not self._stop.is_set():
                self.error = _stream_error(exc)
        finally:
            if pending:
                self._queue.put(pending)
            self._queue.put(None)

    def _watermark(self, event: Any, write_event: Any) -> Watermark | None:
        if not isinstance(event, write_event):
            return None  # the capture's own clean-up of old watermark rows
        for row in event.rows:
            values = row["values"]
            if values.get("capture") == self.options.prefix:
                return Watermark.parse(values["mark"])
        return None

    def _changes(
        self, event: Any, namespace: str, write_event: Any, update_event: Any, out: list[Change]
    ) -> None:
        table = self.options.tables[namespace]
        names = [c.name for c in event.columns]
        self._check_types(namespace, event)
        times = [c.name for c in event.columns if c.type == _TIME2]
        if times:
            _fix_times(event.rows, times)
        key = table.key
        if isinstance(event, write_event):
            for row in event.rows:
                values = row["values"]
                out.append(
                    Change(namespace, "insert", key_text([values[k] for k in key]), row_json(names, values))
                )
        elif isinstance(event, update_event):
            for row in event.rows:
                before, after = row["before_values"], row["after_values"]
                new_key = key_text([after[k] for k in key])
                old_key = key_text([before[k] for k in key])
                out.append(
                    Change(
                        namespace, "update", new_key, row_json(names, after), row_json(names, before),
                        old_key if old_key != new_key else None,
                    )
                )  # fmt: skip
        else:
            for row in event.rows:
                values = row["values"]
                out.append(
                    Change(
                        namespace, "delete", key_text([values[k] for k in key]), None, row_json(names, values)
                    )
                )

    def _check_types(self, namespace: str, event: Any) -> None:
        known = self._types.setdefault(namespace, {})
        for column in event.columns:
            was = known.get(column.name)
            if was is None:
                known[column.name] = column.type
            elif was != column.type:
                raise CdcError(
                    f"column {column.name} of {namespace} changed type (binlog type {was} → {column.type}) "
                    f"at {self._stream.log_file}:{event.packet.log_pos}: the capture stops rather than "
                    "change its records' shape under their readers; copy the table again (a fresh "
                    "checkpoint) to follow it"
                )

    def _ddl(self, query: str, event: Any, out: list[Change]) -> None:
        found = _TRUNCATE.match(query)
        if found is None:
            return
        schema = found.group(1) or (
            event.schema.decode() if isinstance(event.schema, bytes) else event.schema
        )
        namespace = f"{schema}.{found.group(2)}"
        if namespace in self.options.tables:
            out.append(Change(namespace, "truncate", None))


def _fix_times(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Negative fractional TIME values as the server has them (:func:`~.values.binlog_time`)."""
    for row in rows:
        for image in ("values", "before_values", "after_values"):
            values = row.get(image)
            if values is None:
                continue
            for name in columns:
                value = values.get(name)
                if value is not None:
                    values[name] = binlog_time(value)


def _stream_error(exc: BaseException) -> BaseException:
    if isinstance(exc, CdcError):
        return exc
    import pymysql

    if isinstance(exc, pymysql.err.OperationalError) and exc.args and exc.args[0] == _CANNOT_SEND:
        return LostChangesError(
            f"the server cannot send the binlog from where the capture resumes ({exc.args[1]}): the changes "
            "since are gone from it (purged, or never on this server); start a fresh log and checkpoint "
            "to copy the tables again"
        )
    if isinstance(exc, pymysql.err.OperationalError | pymysql.err.InterfaceError | ConnectionError | OSError):
        return StreamInterrupted(f"the binlog stream was cut: {exc}")
    return exc
