"""Where a binlog capture stands on its server, for ``sluice status``, ``sluice pipeline status``
and the console. A binlog reader holds no slot, so what a slot's row would say is read from the
server's list of binary logs (with their sizes) and the capture's GTID checkpoint
(``binlog.json``). Reads only."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sluiceway.cdc.mysql.assemble import split_position
from sluiceway.cdc.mysql.capture import CheckpointFile, describe_position
from sluiceway.cdc.mysql.gtid import epoch_of
from sluiceway.cdc.mysql.server import BinlogSession
from sluiceway.cdc.progress import BinlogStatus, TableProgress, table_progress


def behind_bytes(held: int, logs: dict[int, tuple[str, int]]) -> int | None:
    """Bytes of binlog the server wrote after ``held`` (a position on it): the rest of its file and
    every later file. ``None`` when its file is no longer on the server (purged).

    >>> behind_bytes(3 << 32 | 100, {2: ("b.000002", 900), 3: ("b.000003", 500), 4: ("b.000004", 70)})
    470
    """
    number, pos = split_position(held)
    if number not in logs:
        return None
    return max(0, logs[number][1] - pos) + sum(size for n, (_name, size) in logs.items() if n > number)


def read_binlog_progress(
    session: BinlogSession, state_dir: str, tables: str | Sequence[str], *, snapshot: str, held: int | None
) -> tuple[list[TableProgress], BinlogStatus, Callable[[int], str]]:
    """Each of ``tables`` with its copy's progress, the capture's place on the server (``held``:
    the position its target holds, if any), and how a position of it reads (``binlog.000003:1234``)."""
    logs = session.binary_log_sizes()
    server = session.server_id()
    checkpoint = CheckpointFile(state_dir).load()
    # Positions of this epoch are offsets in this server's binlog (a capture that never moved: 0).
    here = 0 if checkpoint is None else checkpoint.epoch if checkpoint.server_id == server else None
    names = {n: name for n, (name, _size) in logs.items()}

    def where(position: int) -> str:
        return describe_position(position, names if epoch_of(position) == here else None)

    namespaces = [t.namespace for t in session.resolve_tables(tables)]
    progress = table_progress(state_dir, namespaces, snapshot=snapshot, position=where)
    # Bytes behind only for a position on this server (of its epoch).
    behind = None if held is None or here is None or epoch_of(held) != here else behind_bytes(held, logs)
    status = BinlogStatus(
        server_id=server,
        end=describe_position(session.current(), names),
        behind_bytes=behind,
        gtids=None if checkpoint is None else checkpoint.gtid,
        checkpoint_server_id=None if checkpoint is None else checkpoint.server_id,
    )
    return progress, status, where
