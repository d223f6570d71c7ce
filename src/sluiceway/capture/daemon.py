"""``Capture(config)``: stream one replication slot to a broker while this process is the leader.

Parts, all of them already sluiceway's: the leader election of the harvester (a database lease
by default, NELI with Kafka), the CDC capture engine (:class:`sluiceway.cdc.capture.SlotCapture`:
the slot read once, transactions assembled in commit order, the DBLog copy), and the
harvester's publishers (Kafka, NATS JetStream, RabbitMQ, Redis Streams, the journal) behind a
:class:`~sluiceway.capture.target.PublishTarget`.

A *term* is one leadership: a fresh destination client, a fresh replication connection from the
slot's confirmed position, until leadership ends or something fails. A lost database or broker
connection ends the term; the next one (after a backoff, one warning per outage) sends again
from the confirmed position. Anything the capture cannot get past by waiting — a server without
``wal_level=logical``, a change the destination can never accept — stops the capture with one
line. The slot's ``active_pid`` check stays as a second guard against two readers: a new leader
waits for its predecessor's walsender to go.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from sluiceway.capture.config import CaptureConfig
from sluiceway.capture.metrics import CaptureMeter
from sluiceway.capture.offload import ProcessTarget
from sluiceway.capture.publishing import Wrapper, open_target, published_file
from sluiceway.capture.target import DeliveryFailed, PublishTarget
from sluiceway.cdc.capture import CaptureOptions, SlotCapture
from sluiceway.cdc.errors import SlotInUseError, StreamInterrupted
from sluiceway.cdc.mysql.capture import (
    BinlogCapture,
    BinlogOptions,
    CheckpointFile,
    check_resume,
    check_writable,
    describe_position,
)
from sluiceway.cdc.mysql.server import BinlogSession
from sluiceway.cdc.pgoutput import format_lsn
from sluiceway.cdc.postgres import CdcSession, TableSpec
from sluiceway.db.dsn import parse_dsn
from sluiceway.db.failures import server_of, wait_for_start
from sluiceway.election.elected import Elected
from sluiceway.election.lease import DatabaseLease
from sluiceway.election.protocol import ElectionListener, LeaderElection
from sluiceway.errors import (
    Cause,
    DatabaseError,
    DatabaseUnavailableError,
    Permanent,
    StartupRefused,
)
from sluiceway.harvest.ports import Publisher

log = logging.getLogger("sluiceway.capture")

#: Failures a term waits out: the next term starts afresh from the confirmed position.
TRANSIENT = (StreamInterrupted, DatabaseUnavailableError, DeliveryFailed, SlotInUseError)


class Capture(Elected):
    """Captures while elected. ``check()``, ``start()``, ``wait()``, ``stop()`` (or a ``with``).

    >>> with Capture("capture.yaml") as capture:      # doctest: +SKIP
    ...     capture.wait(timeout=60)

    ``stop`` waits up to 60 s for the term to end; what was in flight is sent again by the next
    leader.
    """

    kind = "capture"
    stop_wait = 60.0

    def __init__(
        self,
        config: CaptureConfig | dict[str, Any] | str | Path,
        *,
        election: LeaderElection | None = None,
        publisher_factory: Callable[[int], Publisher] | None = None,
        wrap: Wrapper | None = None,
    ) -> None:
        """``publisher_factory``: each term's publisher, in this process (tests); ``wrap``: wraps
        each term's publisher (a picklable callable where publishing runs in a process of its own:
        ``publishProcess``, the default)."""
        super().__init__()
        if isinstance(config, dict):
            config = CaptureConfig.from_dict(config)
        elif isinstance(config, str | Path):
            config = CaptureConfig.from_file(config)
        self.config = config
        c = config.capture
        self.name = c.name
        self.options: CaptureOptions | BinlogOptions
        if c.binlog:
            assert c.server_id is not None  # the configuration's check
            self.options = BinlogOptions(
                dsn=c.dsn,
                tables=c.table_list,
                server_id=c.server_id,
                state_dir=c.state_path,
                snapshot=c.snapshot,
                chunk_size=c.chunk_size,
            )
        else:
            assert c.slot is not None and c.publication is not None
            self.options = CaptureOptions(
                dsn=c.dsn,
                tables=c.table_list,
                slot=c.slot,
                publication=c.publication,
                state_dir=c.state_path,
                snapshot=c.snapshot,
                chunk_size=c.chunk_size,
            )
        self.meter = CaptureMeter(c.name, c.destination)
        self.election = election or self._default_election()
        self._publisher_factory = publisher_factory
        self._wrap = wrap
        self._slot: SlotCapture | BinlogCapture | None = None
        #: Terms begun (a test and ``status`` read it).
        self.terms = 0

    # -- public API ----------------------------------------------------------------------------
    def check(self) -> None:
        """What the capture needs, before it campaigns, creating nothing until nothing else can
        refuse: the server's settings and the role's (``REPLICATION``), the tables and the right
        to read them, the publication (there and covering the tables, or the right to create or
        extend it), the destination (a NATS, RabbitMQ or Redis connection and its stream or
        exchange, a Kafka cluster, a journal's directory) and last, for a database election, the
        lease table (created if missing, as the campaign would).

        A database or broker out of reach is waited for up to ``startupTimeout`` (``forever``:
        for ever); a refusal is raised at once. Raises a
        :class:`~sluiceway.errors.SluicewayError` (one line naming the fix)."""
        c = self.config.capture
        if c.tracing.enabled:
            from sluiceway.tracing import require_tracing

            require_tracing()  # the otel extra, before any connection is made
        timeout = c.startup_timeout
        server = server_of(parse_dsn(c.dsn))
        wait_for_start(self._check_database, what=server, timeout=timeout, credentials="dsn")
        if c.target is not None:
            from sluiceway.brokers import check_broker

            target = c.target
            wait_for_start(
                lambda _seconds: check_broker(target),
                what=target.describe(),
                timeout=timeout,
                credentials="target",
            )
        if c.kafka is not None:
            from sluiceway.harvest.kafka import check_kafka

            kafka = dict(c.kafka)
            wait_for_start(
                lambda seconds: check_kafka(kafka, seconds),
                what=f"Kafka at {kafka.get('bootstrap.servers')}",
                timeout=timeout,
                credentials="kafka",
            )
        from sluiceway.harvest.journal_target import check_journal_path

        for journal in (c.journal, c.dead_letter.journal if c.dead_letter else None):
            if journal is not None:
                wait_for_start(
                    partial(_ignoring_seconds, check_journal_path, journal.path),
                    what=f"journal {journal.path}",
                    timeout=timeout,
                )
        if isinstance(self.election, DatabaseLease):
            wait_for_start(self.election.check, what=server, timeout=timeout, credentials="dsn")

    def _check_database(self, seconds: float) -> None:
        if isinstance(self.options, BinlogOptions):
            binlog = BinlogSession(self.options.dsn)
            try:
                binlog.check_server()
                check_writable(binlog, self.options, binlog.resolve_tables(self.options.tables))
                # What the term's check refuses (a server the published positions are not of, or
                # that purged them), refused before the campaign: it reads the same two files.
                held = published_file(self.config.capture).read()
                if held is not None:
                    saved = CheckpointFile(self.options.state_dir).load()
                    check_resume(
                        binlog, held, saved, server_id=binlog.server_id(), mariadb=binlog.is_mariadb()
                    )
            finally:
                binlog.close()
            return
        session = CdcSession(self.options.dsn, connect_timeout=seconds)
        try:
            user = session.check_server()
            tables = session.resolve_tables(self.options.tables)
            _check_publication(session, self.options.publication, tables, user)
        finally:
            session.close()

    @property
    def position(self) -> int:
        """Where this process's capture stands: every change before it is acknowledged by the
        destination and confirmed to PostgreSQL (0 before its first term)."""
        slot = self._slot
        return slot.durable if slot is not None else self.meter.confirmed

    # -- terms -----------------------------------------------------------------------------------
    def _before_election(self) -> None:
        addr = self.config.capture.metrics_addr
        if addr:
            host, port = self.meter.serve(addr)
            log.info("metrics on http://%s:%d/metrics", host, port)

    def _listener(self) -> ElectionListener:
        return _Listener(self)

    def _interrupt(self) -> None:
        slot = self._slot
        if slot is not None:
            slot.stop()

    def _close(self) -> None:
        self.meter.close()

    def _run(self) -> None:
        outage: str | None = None
        try:
            while not self._stopping.is_set():
                if not self._await_leadership(0.2):
                    continue
                try:
                    self._term(recovering=outage is not None)
                    outage = None
                except TRANSIENT as exc:
                    if self._stopping.is_set():
                        break  # stopped while changes awaited acknowledgements: the next leader sends them
                    text = " ".join(str(exc).split())
                    kind = type(exc).__name__
                    if outage != kind:  # one line per outage, not one per attempt
                        log.warning("capture: %s; trying again from the confirmed position", text)
                        outage = kind
                    self._stopping.wait(self.config.capture.retry_backoff)
        except BaseException as exc:
            self._error = exc
            log.error("capture stopped: %s", " ".join(str(exc).split()))
        finally:
            self.meter.leader(False)

    def _term(self, *, recovering: bool) -> None:
        epoch = int(getattr(self.election, "epoch", 0))
        self.terms += 1
        c = self.config.capture
        target: PublishTarget | ProcessTarget
        if c.publish_process and self._publisher_factory is None:
            target = ProcessTarget(
                self.config, epoch, may_continue=self._leading, meter=self.meter, wrap=self._wrap
            )
        else:
            target = open_target(
                c,
                epoch,
                may_continue=self._leading,
                meter=self.meter,
                publisher_factory=self._publisher_factory,
                wrap=self._wrap,
            )
        slot: SlotCapture | BinlogCapture
        if isinstance(self.options, BinlogOptions):
            slot = BinlogCapture(self.options, target)
            where: Callable[[int], str] = describe_position
        else:
            slot = SlotCapture(self.options, target)
            where = format_lsn
        target.on_durable = slot.durable_at
        self._slot = slot
        try:
            try:
                slot.prepare()
                slot.start()
            except DatabaseError as exc:
                raise DatabaseUnavailableError(str(exc)) from exc
            self.meter.leader(True)
            log.info(
                "capture %s %s: %s from %s to %s",
                self.name,
                "resumed" if recovering else "leading",
                f"slot {c.slot}" if c.slot else f"the binlog as replica {c.server_id}",
                where(slot.position),
                c.describe_destination(),
            )
            slot.run(until=self._until(slot, target))
        finally:
            self._slot = None
            self.meter.leader(False)
            slot.close()
            target.close()

    def _until(
        self, slot: SlotCapture | BinlogCapture, target: PublishTarget | ProcessTarget
    ) -> Callable[[], bool]:
        """The capture's stop test, called between appends; also where the meter reads positions."""
        read_at = [0.0]

        def until() -> bool:
            now = time.monotonic()
            if now - read_at[0] >= 1.0:
                read_at[0] = now
                self.meter.position(slot.durable, slot.wal_end)
            target.check()  # a failed delivery ends the term even while no change arrives
            return not self._leading()

        return until

    # -- defaults from configuration ---------------------------------------------------------
    def _default_election(self) -> LeaderElection:
        c = self.config.capture
        if c.election.kind == "kafka":
            from sluiceway.election.neli import KafkaElection

            assert c.kafka is not None
            return KafkaElection(
                dict(c.kafka),
                f"{c.election_name}-leader",
                c.election_name,
                heartbeat_timeout=c.election.lease_timeout,
            )
        return DatabaseLease(c.dsn, c.election_name, ttl=c.election.lease_timeout, table=c.lease_table)


def _ignoring_seconds(check: Callable[[str], None], path: str, _seconds: float) -> None:
    check(path)


def _check_publication(session: CdcSession, name: str, tables: list[TableSpec], user: str) -> None:
    """The publication is there and publishes every insert, update and delete of the tables — or
    this role may create it (CREATE on the database, owner of every table) or add the tables it
    lacks (owner of it and of them), as the capture's first term would. Reads only."""
    listed = ", ".join(t.sql_name for t in tables)
    row = session.one("publication", {"name": name})
    if row is None:
        not_owned = [str(r[0]) for r in session.rows("not_owned", {"oids": [t.oid for t in tables]})]
        may_create = session.one("may_create_publication")
        if not_owned or not (may_create and may_create[0]):
            why = f"it does not own {', '.join(not_owned)}" if not_owned else "no CREATE on the database"
            raise StartupRefused(
                Permanent(
                    Cause.PRIVILEGE,
                    f"publication {name} does not exist, and the role {user!r} may not create it ({why})",
                    f"as the tables' owner, run: CREATE PUBLICATION {name} FOR TABLE {listed} "
                    "WITH (publish_via_partition_root = true)",
                )
            )
        return
    publishes_insert, publishes_update, publishes_delete, _truncate, all_tables = row
    if not (publishes_insert and publishes_update and publishes_delete):
        raise StartupRefused(
            Permanent(
                Cause.CONFIGURATION,
                f"publication {name} does not publish every insert, update and delete",
                f"ALTER PUBLICATION {name} SET (publish = 'insert, update, delete, truncate')",
            )
        )
    if all_tables:
        return
    present = {str(r[0]) for r in session.rows("publication_tables", {"name": name})}
    lacking = [t for t in tables if t.namespace not in present]
    if not lacking:
        return
    owned = session.one("publication_owned", {"name": name})
    others = session.rows("not_owned", {"oids": [t.oid for t in lacking]})
    if not (owned and owned[0]) or others:
        add = ", ".join(t.sql_name for t in lacking)
        raise StartupRefused(
            Permanent(
                Cause.PRIVILEGE,
                f"publication {name} lacks {add}, and the role {user!r} may not "
                "add them (it must own the publication and the tables)",
                f"as their owner, run: ALTER PUBLICATION {name} ADD TABLE {add}",
            )
        )


class _Listener:
    def __init__(self, capture: Capture) -> None:
        self.c = capture

    def leader_acquired(self, epoch: int) -> None:
        self.c._wake()

    def leader_revoked(self) -> None:
        log.info("capture %s: leadership revoked", self.c.name)
        self._end()

    def leader_fenced(self) -> None:
        log.warning("capture %s: leadership lost (fenced): stopping this term", self.c.name)
        self._end()

    def _end(self) -> None:
        slot = self.c._slot
        if slot is not None:
            slot.stop()
        self.c._wake()


__all__ = ["Capture"]
