"""Change data capture from MariaDB's binlog against the server's own ceilings (``bench/cdc.py
--source mariadb``).

(a) sync: the same N changes (inserts in transactions of T rows) captured into a journal (fsync
    on, durable) by the capture, against a receive-only binlog client of the same events (a
    replica connection that reads each event's header and nothing more: the protocol's ceiling
    in Python), against ``mariadb-binlog --read-from-remote-server --raw`` (the server's own C
    client, writing the events to a file), and against python-mysql-replication decoding the
    rows with nothing done with them (the part of the capture that is the library's).
(b) copy: a table of M rows copied by the capture (``snapshot: initial``, chunks) into a journal,
    against ``SELECT *`` of the whole table read by a plain client (PyMySQL, every row fetched).

Rounds alternate the order of ours and the baselines; the best round of each counts. The server
is a private MariaDB (binlog on, row events, full images and metadata) started for the run.

    .venv/bin/python bench/cdc.py --source mariadb [--changes 200000] [--txn 50] [--rows 200000]
                                                   [--rounds 3]

Prints a table, then one JSON line: {"bench": "cdc-mariadb", "capture_vs_receiver": …, …}.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

from _common import report
from sluiceway.cdc.mysql.assemble import position
from sluiceway.cdc.mysql.capture import BinlogOptions
from sluiceway.cdc.service import CaptureService
from sluiceway.journal import Journal
from sluiceway.testing import PrivateMariaDB

DB = "bench"


def setup(db: PrivateMariaDB, rows: int) -> None:
    db.execute(f"CREATE DATABASE {DB}")
    db.execute(
        "CREATE TABLE events (id BIGINT PRIMARY KEY, account INT NOT NULL, amount DECIMAL(12, 2), "
        "note VARCHAR(64), at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
        database=DB,
    )
    db.execute(
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, owner VARCHAR(40) NOT NULL, balance DECIMAL(12, 2), "
        "opened DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), tags VARCHAR(40))",
        database=DB,
    )
    conn = db.connect(DB)
    with conn.cursor() as cur:
        for start in range(1, rows + 1, 5_000):
            ids = range(start, min(start + 5_000, rows + 1))
            cur.execute(
                "INSERT INTO accounts (id, owner, balance, tags) VALUES "
                + ",".join(f"({i}, 'owner-{i}', {i}.25, 'a,b')" for i in ids)
            )
    conn.close()


def write_changes(db: PrivateMariaDB, start: int, changes: int, per_txn: int) -> None:
    conn = db.connect(DB)
    with conn.cursor() as cur:
        for at in range(start, start + changes, per_txn):
            cur.execute("BEGIN")
            cur.execute(
                "INSERT INTO events (id, account, amount, note) VALUES "
                + ",".join(f"({i}, {i % 1000}, {i % 977}.5, 'event {i}')" for i in range(at, at + per_txn))
            )
            cur.execute("COMMIT")
    conn.close()


def master_position(db: PrivateMariaDB) -> tuple[str, int]:
    name, pos = db.execute("SHOW MASTER STATUS")[0][:2]
    return str(name), int(pos)


def receive_only(db: PrivateMariaDB, start: tuple[str, int], end: tuple[str, int]) -> float:
    """A replica connection reading each event's header only, from ``start`` to ``end``."""
    conn = db.connect()
    with conn.cursor() as cur:
        cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
        cur.execute("SET @mariadb_slave_capability = 4")
    name = start[0].encode()
    packet = struct.pack("<IHI", start[1], 0, 7001) + name
    began = time.perf_counter()
    conn._execute_command(0x12, packet)  # COM_BINLOG_DUMP
    target = end[1]  # (one binlog file holds the run: max_binlog_size is 1 GiB)
    while True:
        data = conn._read_packet().get_all_data()
        if data[0] != 0:
            raise SystemExit(f"the binlog dump ended early: {data[:80]!r}")
        kind = data[1 + 4]
        log_pos = struct.unpack_from("<I", data, 1 + 13)[0]
        if kind == 16 and log_pos >= target:  # the XID that ends the run
            break
    elapsed = time.perf_counter() - began
    conn.close()
    return elapsed


def mariadb_binlog(db: PrivateMariaDB, start: tuple[str, int], end: tuple[str, int], work: str) -> float:
    """The server's own C client, streaming the events raw to a file."""
    os.makedirs(work, exist_ok=True)
    began = time.perf_counter()
    subprocess.run(
        ["mariadb-binlog", "--read-from-remote-server", "--raw", "--host=127.0.0.1", f"--port={db.port}",
         "--user=root", f"--start-position={start[1]}", f"--stop-position={end[1]}",
         f"--result-file={work}/", start[0]],
        check=True, capture_output=True,
    )  # fmt: skip
    return time.perf_counter() - began


def library_decode(db: PrivateMariaDB, start: tuple[str, int], end: tuple[str, int]) -> tuple[float, int]:
    """python-mysql-replication decoding every row event, nothing done with the rows."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import XidEvent
    from pymysqlreplication.row_event import WriteRowsEvent

    began = time.perf_counter()
    stream = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": db.port, "user": "root", "password": ""},
        server_id=7002, blocking=True, resume_stream=True, log_file=start[0], log_pos=start[1],
        only_events=[WriteRowsEvent, XidEvent], enable_logging=False,
    )  # fmt: skip
    rows = 0
    for event in stream:
        if isinstance(event, WriteRowsEvent):
            rows += len(event.rows)
        elif stream.log_file == end[0] and event.packet.log_pos >= end[1]:
            break
    elapsed = time.perf_counter() - began
    stream.close()
    return elapsed, rows


def capture(
    db: PrivateMariaDB, work: str, server_id: int, start: int, end: int | None, **extra: Any
) -> tuple[float, int]:
    """The capture into a fresh journal from ``start`` (``snapshot: initial``: the copy), until
    it holds ``end`` (or the copy is complete); records appended."""
    log_dir = os.path.join(work, "log")
    options = BinlogOptions(
        db.dsn(DB), extra.pop("tables", ("events",)), server_id, os.path.join(work, "state"), **extra
    )
    if end is not None:
        # Resume exactly at `start`, as a capture whose journal holds that position.
        with Journal.open(log_dir) as journal, journal.append(set_registers={"cdc.lsn": str(start)}):
            pass
    service = CaptureService(options, log_dir)
    began = time.perf_counter()
    capture = service.prepare()
    capture.start()
    try:
        if end is None:
            capture.catch_up()
        else:
            capture.run(until=lambda: capture.durable >= end)
    finally:
        elapsed = time.perf_counter() - began
        service.close()
    with Journal.open(log_dir, read_only=True) as journal:
        return elapsed, journal.head


def select_all(db: PrivateMariaDB) -> tuple[float, int]:
    conn = db.connect(DB)
    began = time.perf_counter()
    with conn.cursor() as cur:
        cur.execute("SELECT * FROM accounts")
        rows = len(cur.fetchall())
    elapsed = time.perf_counter() - began
    conn.close()
    return elapsed, rows


def run(args: Any) -> None:
    work_root = tempfile.mkdtemp(prefix="sluice-bench-cdc-maria-")
    db = PrivateMariaDB({"max-binlog-size": "1G", "innodb-buffer-pool-size": "512M"}).start()
    t: dict[str, list[float]] = {
        k: [] for k in ("receiver", "c_client", "library", "capture", "select", "copy")
    }
    try:
        setup(db, args.rows)
        next_id = 1
        for round_no in range(args.rounds):
            start = master_position(db)
            write_changes(db, next_id, args.changes, args.txn)
            next_id += args.changes
            end = master_position(db)
            number = int(start[0].rpartition(".")[2])
            first, last = position(number, start[1]), position(int(end[0].rpartition(".")[2]), end[1])
            work = os.path.join(work_root, f"r{round_no}")

            def counted(result: tuple[float, int], expected: int, what: str) -> float:
                if result[1] != expected:
                    raise SystemExit(f"{what}: expected {expected}, got {result[1]}")
                return result[0]

            steps: dict[str, Callable[[], float]] = {
                "receiver": lambda: receive_only(db, start, end),  # noqa: B023
                "c_client": lambda: mariadb_binlog(db, start, end, work + "-raw"),  # noqa: B023
                "library": lambda: counted(library_decode(db, start, end), args.changes, "library"),  # noqa: B023
                "capture": lambda: counted(
                    capture(db, work + "-cap", 7100 + round_no, first, last, snapshot="never"),  # noqa: B023
                    args.changes,
                    "capture",
                ),
            }
            for name in steps if round_no % 2 == 0 else reversed(list(steps)):
                t[name].append(steps[name]())
            copy_steps: dict[str, Callable[[], float]] = {
                "select": lambda: counted(select_all(db), args.rows, "select"),
                "copy": lambda: counted(
                    capture(db, work + "-copy", 7200 + round_no, 0, None, tables=("accounts",)),  # noqa: B023
                    args.rows,
                    "copy",
                ),
            }
            for name in copy_steps if round_no % 2 == 0 else reversed(list(copy_steps)):
                t[name].append(copy_steps[name]())
            shutil.rmtree(work_root, ignore_errors=True)
            os.makedirs(work_root, exist_ok=True)
            print(f"round {round_no}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in t.items()), flush=True)
        n, m = args.changes, args.rows
        rate = {k: (m if k in ("select", "copy") else n) / min(v) for k, v in t.items()}
        summary = {
            "bench": "cdc-mariadb",
            "changes": n,
            "rows_per_txn": args.txn,
            "copy_rows": m,
            "rounds": args.rounds,
            **{f"{k}_per_s": round(v) for k, v in rate.items()},
            "capture_vs_receiver": round(rate["capture"] / rate["receiver"], 3),
            "capture_vs_c_client": round(rate["capture"] / rate["c_client"], 3),
            "capture_vs_library": round(rate["capture"] / rate["library"], 3),
            "library_vs_receiver": round(rate["library"] / rate["receiver"], 3),
            "copy_vs_select": round(rate["copy"] / rate["select"], 3),
        }
        report(
            f"capture (binlog → durable journal) against MariaDB's own ceilings (best of {args.rounds})",
            [
                (
                    "(a) receive-only replica client (event headers only)",
                    f"{rate['receiver']:,.0f} changes/s",
                ),
                ("mariadb-binlog --raw (the server's C client)", f"{rate['c_client']:,.0f} changes/s"),
                ("python-mysql-replication, rows decoded, nothing else", f"{rate['library']:,.0f} changes/s"),
                ("capture → journal", f"{rate['capture']:,.0f} changes/s"),
                ("capture / receive-only client", f"{summary['capture_vs_receiver']:.2f}"),
                ("capture / the library's decoding alone", f"{summary['capture_vs_library']:.2f}"),
                ("(b) SELECT * by a plain client", f"{rate['select']:,.0f} rows/s"),
                ("copy → journal", f"{rate['copy']:,.0f} rows/s"),
                ("copy / SELECT", f"{summary['copy_vs_select']:.2f}"),
            ],
            summary,
        )
    finally:
        db.stop()
        shutil.rmtree(work_root, ignore_errors=True)


__all__ = ["run"]
