"""MariaDB GTID positions, and where the capture resumes from after a server switch: pure.

A binlog file and offset name a place in *one* server's binlog. Another server of the same
replication topology (a replica promoted in a failover) has the same transactions under other
files and offsets, and the same file names mean other things there. A MariaDB GTID
(``domain-server-sequence``) names a transaction on every server of the topology; the GTID
*state* — the last GTID per replication domain — names a place in the stream anywhere.

The capture keeps its positions as one growing number (:func:`~.assemble.position`) and, next to
them, a :class:`Checkpoint`: which server the positions are from (its ``@@server_id``), and the GTID
state at one durable position. On the same server the capture resumes by file and offset (exact,
and no scan); on another it resumes from the checkpoint's GTID state (:func:`plan_resume`), under a
new *epoch* so that positions keep growing across the switch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sluiceway.cdc.errors import CdcError

#: Bits of a position above the file number (< 2**20: MariaDB's six-digit binlog numbers) and the
#: offset (32 bits): the epoch, one more for every server the capture moved to.
EPOCH_SHIFT = 52


def epoch_of(position: int) -> int:
    return position >> EPOCH_SHIFT


def advance(state: dict[str, str], gtid: str) -> None:
    """``state`` (last GTID per domain) after the transaction ``gtid`` (MariaDB's form; a MySQL
    ``uuid:n`` GTID or none leaves it as it is)."""
    domain, dash, _rest = gtid.partition("-")
    if dash and domain.isdigit():
        state[domain] = gtid


def parse_state(text: str) -> dict[str, str]:
    """A GTID state as the server prints it (``0-1-100,1-2-7``)."""
    state: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if part:
            advance(state, part)
    return state


def format_state(state: Mapping[str, str]) -> str:
    return ",".join(state[d] for d in sorted(state, key=int))


def covers(state: str, wanted: str) -> bool:
    """``state`` (a capture's, last GTID per domain) is at or past ``wanted`` (a server's
    ``@@gtid_binlog_pos``) in every domain: each domain's sequence numbers only grow, whichever
    server wrote them.

    >>> covers("0-1-10,1-2-3", "0-2-9,1-2-3"), covers("0-1-10", "0-1-10,1-2-1")
    (True, False)
    """
    have = {domain: _sequence(gtid) for domain, gtid in parse_state(state).items()}
    return all(have.get(domain, -1) >= _sequence(gtid) for domain, gtid in parse_state(wanted).items())


def _sequence(gtid: str) -> int:
    """The sequence number of a MariaDB GTID (``domain-server-sequence``)."""
    return int(gtid.rsplit("-", 1)[1])


def missing(wanted: str, binlog_state: str) -> list[str]:
    """The GTIDs of the state ``wanted`` a server whose ``@@gtid_binlog_state`` is
    ``binlog_state`` (the last GTID of each domain and server) has not written: it lacks those
    transactions, so a stream from ``wanted`` cannot start there."""
    have: dict[tuple[str, str], int] = {}
    for part in binlog_state.split(","):
        fields = part.strip().split("-")
        if len(fields) == 3 and fields[2].isdigit():
            have[(fields[0], fields[1])] = int(fields[2])
    out = []
    for gtid in parse_state(wanted).values():
        domain, server, seq = gtid.split("-", 2)
        if have.get((domain, server), -1) < int(seq):
            out.append(gtid)
    return out


@dataclass(frozen=True)
class Checkpoint:
    """At ``position`` (the capture's numbering, epoch included) the GTID state was ``gtid``;
    positions of ``epoch`` are offsets in the binlog of the server whose id is ``server_id``."""

    server_id: int
    epoch: int
    position: int
    gtid: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Checkpoint:
        return cls(int(data["server_id"]), int(data["epoch"]), int(data["position"]), str(data["gtid"]))


@dataclass(frozen=True)
class Resume:
    """Where the reader starts: by ``gtid`` state when set, else at ``position``'s file and offset;
    ``epoch``: the epoch of the positions it reads; ``behind``: the checkpoint was older than the
    held position (its changes since are read, and sent, again)."""

    epoch: int
    gtid: str | None = None
    behind: bool = False


def plan_resume(held: int, server_id: int, saved: Checkpoint | None, *, gtids: bool) -> Resume:
    """How to resume from ``held`` (the target's position) on the server ``server_id``.

    ``gtids``: the server is a MariaDB (its GTIDs name a place on every server). Raises
    :class:`~sluiceway.cdc.errors.CdcError` when the server is another one and no GTID state says
    where its stream matches the held position.
    """
    epoch = epoch_of(held)
    if saved is None or (saved.server_id == server_id and saved.epoch == epoch):
        return Resume(epoch)  # the server the positions are from (or a log from before checkpoints)
    if saved.server_id != server_id and saved.epoch == epoch:
        what = f"the server changed (server id {saved.server_id} → {server_id})"
    else:
        what = f"the capture moved to server id {server_id} and did not read from it yet"
    if not gtids:
        raise CdcError(
            f"{what}: the held binlog file and offset name another server's binlog, and resuming by "
            "GTID is for MariaDB only; point the capture back at the server, or start a fresh log "
            "and checkpoint to copy the tables again"
        )
    if saved.position > held:
        raise CdcError(
            f"{what}, and the capture's GTID checkpoint (position {saved.position}) is past what its "
            f"log holds ({held}): they are not of one capture; start a fresh log and checkpoint"
        )
    if not saved.gtid:
        raise CdcError(f"{what}, and the capture's GTID checkpoint holds no GTID state to resume from")
    if saved.server_id == server_id and saved.epoch > epoch:
        new_epoch = saved.epoch  # moved here before, and read nothing since
    else:
        new_epoch = max(saved.epoch, epoch) + 1
    return Resume(new_epoch, saved.gtid, behind=saved.position < held)
