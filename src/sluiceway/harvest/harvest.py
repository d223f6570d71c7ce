"""The embedded harvester: ``Harvest(config)`` with ``start``, ``stop``, ``wait`` and events."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluiceway.db import Database, Dialect, dsn_warnings, parse_dsn
from sluiceway.db.failures import grantee, server_of, wait_for_start, whoami
from sluiceway.election.elected import Elected
from sluiceway.election.lease import DatabaseLease
from sluiceway.election.protocol import ElectionListener, LeaderElection
from sluiceway.errors import (
    Cause,
    DatabaseError,
    Permanent,
    PublisherFailedError,
    SluicewayError,
    StartupRefused,
)
from sluiceway.harvest.config import HarvestConfig
from sluiceway.harvest.engine import Engine, EngineLimits
from sluiceway.harvest.events import Event, LeaderAcquired, LeaderFenced, LeaderRevoked
from sluiceway.harvest.ports import OutboxStore, Publisher
from sluiceway.outbox.table import OutboxLayout, OutboxLocation, locate_outbox, queries

if TYPE_CHECKING:
    from sluiceway.harvest.kafka import ClientLog

log = logging.getLogger("sluiceway.harvest")

EventHandler = Callable[[Event], None]


def engine_limits(config: HarvestConfig) -> EngineLimits:
    lim = config.limits
    dl = config.harvest.dead_letter
    return EngineLimits(
        max_in_flight_records=lim.max_in_flight_records,
        send_concurrency=lim.send_concurrency,
        send_buffer=lim.send_buffer,
        mark_query_records=lim.mark_query_records,
        mark_backoff=lim.mark_backoff,
        io_error_backoff=lim.io_error_backoff,
        drain_timeout=min(lim.queue_timeout, max(lim.drain_interval, 1.0)),
        min_metrics_interval=lim.min_metrics_interval,
        max_attempts=dl.max_attempts,
        dead_letter=dl.enabled,
        bury_permanent=dl.permanent_errors,
        park_key=dl.park_key,
        per_key_in_flight=lim.per_key_in_flight,
        idle_poll=lim.idle_poll,
        sequence_headers=config.harvest.sequence_headers,
    )


def _say_send_threads_do_not_apply(config: HarvestConfig) -> None:
    """goharvest's ``sendConcurrency`` and ``sendBuffer`` shape send threads; every built-in
    destination is sent to from the dispatching thread, without them. A file that sets them (a
    goharvest one, say) loads as before; its author is told once what bounds the sends instead."""
    lim = config.harvest.limits
    given = (("sendConcurrency", lim.send_concurrency), ("sendBuffer", lim.send_buffer))
    named = [key for key, value in given if value is not None]
    if named:
        log.info(
            "limits.%s: not used for %s, which is sent to without send threads; "
            "limits.maxInFlightRecords (%d) bounds the records in flight",
            " and limits.".join(named),
            config.harvest.describe_destination(),
            config.limits.max_in_flight_records,
        )


class Harvest(Elected):
    """Harvests an outbox while this process is the elected leader.

    >>> cfg = HarvestConfig.from_dict({"harvest": {               # doctest: +SKIP
    ...     "dataSource": "sqlite:///app.db", "journal": {"path": "./journal"}}})
    >>> with Harvest(cfg) as harvest:                             # doctest: +SKIP
    ...     harvest.set_event_handler(print)
    ...     harvest.wait(timeout=10)

    Collaborators can be injected for tests (``store_factory``, ``publisher_factory``, ``election``);
    by default they follow from the configuration. ``stop`` lets in-flight deliveries finish (or
    leaves them for the next leader) and releases leadership.
    """

    kind = "harvest"

    def __init__(
        self,
        config: HarvestConfig | dict[str, Any] | str | Path,
        *,
        store_factory: Callable[[], OutboxStore] | None = None,
        publisher_factory: Callable[[int], Publisher] | None = None,
        election: LeaderElection | None = None,
    ) -> None:
        super().__init__()
        if isinstance(config, dict):
            config = HarvestConfig.from_dict(config)
        elif isinstance(config, str | Path):
            config = HarvestConfig.from_file(config)
        self.config = config
        h = config.harvest
        if store_factory is None or (election is None and h.election_kind == "database"):
            # The data source is used: say now if it does not say what its author meant.
            for warning in dsn_warnings(h.data_source):
                log.warning("dataSource: %s", warning)
        if publisher_factory is None:
            _say_send_threads_do_not_apply(config)
        self._source: OutboxLocation | None = None
        self._checks_source = store_factory is None
        self._store_factory = store_factory or self._default_store_factory()
        self._publisher_factory = publisher_factory or self._default_publisher_factory()
        self.election = election or self._default_election()
        self._handler: EventHandler | None = None
        self._ended_by_election = False
        self.engine = Engine(self._store_factory, _NoPublisher(), engine_limits(config), self._emit)
        self.name = h.name

    # -- public API ----------------------------------------------------------------------------
    def check(self) -> None:
        """The start-up check, run before :meth:`start` (``sluice reap`` does): what the harvester
        needs — the outbox (its database, its table, the right to read, update and delete its
        rows), the destination (a NATS, RabbitMQ or Redis target's connection, credentials and
        stream or exchange; a Kafka cluster's metadata, also for a Kafka election; a journal's
        directory) and last, for a database election, the lease table (created if missing, as
        the campaign would: nothing else can refuse by then).

        A database or broker out of reach is waited for, up to ``startupTimeout`` (30 s;
        ``forever`` waits for ever); a permanent failure (a missing privilege, table or stream,
        wrong credentials) is raised at once. Raises :class:`~sluiceway.errors.StartupError` or
        :class:`~sluiceway.errors.ConfigError`, each one line that names the fix.
        """
        h = self.config.harvest
        timeout = h.startup_timeout
        source = server_of(parse_dsn(h.data_source))
        location = wait_for_start(self._check_outbox, what=source, timeout=timeout, credentials="dataSource")
        if h.target is not None:
            target = h.target
            wait_for_start(
                lambda _seconds: self.check_destination(),
                what=target.describe(),
                timeout=timeout,
                credentials="harvest.target",
            )
        if h.destination == "kafka" or h.election_kind == "kafka":
            from sluiceway.harvest.kafka import check_kafka

            kafka = h.kafka_config
            wait_for_start(
                lambda seconds: check_kafka(kafka, seconds),
                what=f"Kafka at {kafka.get('bootstrap.servers')}",
                timeout=timeout,
                credentials="baseKafkaConfig",
            )
        if h.journal is not None:
            from sluiceway.harvest.journal_target import check_journal_path

            path = h.journal.path
            wait_for_start(lambda _seconds: check_journal_path(path), what=f"journal {path}", timeout=timeout)
        if isinstance(self.election, DatabaseLease):
            wait_for_start(self.election.check, what=source, timeout=timeout, credentials="dataSource")
        # Said once every check has passed: the database found helps only once the run can go on.
        self._source = location
        log.info("outbox %s found in %s database %r", h.outbox_table, h.dialect.value, location.database)

    def _check_outbox(self, seconds: float) -> OutboxLocation:
        h = self.config.harvest
        with Database(h.data_source, connect_timeout=seconds) as db:
            location = locate_outbox(db, h.outbox_table)
            _check_outbox_rights(db, location.layout)
        return location

    def set_event_handler(self, handler: EventHandler | None) -> None:
        """Receive events (LeaderAcquired, LeaderRefreshed, LeaderRevoked, LeaderFenced, MeterRead,
        RecordDeadLettered). Called from harvester threads: return quickly."""
        self._handler = handler

    def check_source(self) -> OutboxLocation:
        """Connect to the outbox database, find the outbox table, and log which database that is.

        Raises :class:`~sluiceway.errors.DatabaseUnavailableError` when the database cannot be
        reached and :class:`~sluiceway.errors.ConfigError` when the table is not there.
        ``sluice reap`` calls it before ``start``; otherwise the harvester thread logs the same
        line when it starts (or a warning, and carries on as before, if it cannot).
        """
        h = self.config.harvest
        with Database(h.data_source) as db:
            self._source = locate_outbox(db, h.outbox_table)
        log.info("outbox %s found in %s database %r", h.outbox_table, db.dialect.value, self._source.database)
        return self._source

    def check_destination(self) -> None:
        """Connect to a NATS, RabbitMQ or Redis target and check what it names (credentials,
        stream, exchange), within about its ``connectTimeout``.

        Raises :class:`~sluiceway.errors.BrokerError` naming the broker, the server and what is
        wrong. ``sluice reap`` calls it before ``start``, so a set-up mistake is one line and an
        exit code, not a leader that holds its rows and retries forever. Kafka and journal
        destinations are not checked here (Kafka's client reports an unreachable cluster itself).
        """
        target = self.config.harvest.target
        if target is not None:
            from sluiceway.brokers import check_broker

            check_broker(target)

    # -- internals ---------------------------------------------------------------------------
    def _before_election(self) -> None:
        self._prepare()
        if self._spares is not None:
            self._spares.prepare()  # warm a client while the election runs

    def _listener(self) -> ElectionListener:
        return _Listener(self)

    def _emit(self, event: Event) -> None:
        handler = self._handler
        if handler is not None:
            handler(event)

    def _run(self) -> None:
        if self._checks_source and self._source is None:
            try:
                self.check_source()
            except Exception as exc:  # only a log line: the election and the terms retry on their own
                log.warning("outbox not reachable yet: %s", " ".join(str(exc).split()))
        try:
            while not self._stopping.is_set():
                if self._await_leadership(0.1):
                    self._term()
        except BaseException as exc:
            log.exception("harvester stopped by an error")
            self._error = exc

    def _term(self) -> None:
        epoch = int(getattr(self.election, "epoch", 0))
        try:
            publisher = self._publisher_factory(epoch)
        except SluicewayError as exc:
            log.warning("cannot open the destination for this term: %s", exc)
            self._stopping.wait(self.config.limits.io_error_backoff)
            return
        self.engine.publisher = publisher
        self._ended_by_election = False

        try:
            destination = self.config.harvest.describe_destination()
            self.engine.run_term(
                self._leading, on_start=lambda leader_id: self._emit(LeaderAcquired(leader_id, destination))
            )
        except PublisherFailedError as exc:
            # The client is spent (a fatal producer error): end this term; if we still lead, the
            # next one starts with a fresh client and re-marks every row this one left.
            log.warning("the destination client failed (%s): starting a new term with a fresh one", exc)
            self._stopping.wait(self.config.limits.io_error_backoff)
            return
        finally:
            publisher.close()
            if self._spares is not None:
                # The spare lived through whatever ended this term (an outage, say): start afresh.
                self._spares.discard()
        if not self._stopping.is_set() and not self._ended_by_election:
            # Our own deadline passed before the election thread said so: that is a fence.
            self._emit(LeaderFenced())

    # -- defaults from configuration -------------------------------------------------------
    _metrics: Any = None

    _tracing: Any = None

    def _prepare(self) -> None:
        h = self.config.harvest
        if h.tracing.enabled and self._tracing is None:
            from sluiceway.harvest.tracing import traced
            from sluiceway.tracing import start_tracing

            self._tracing = start_tracing("sluice-reap")
            tracer, system, untraced = self._tracing.tracer, h.destination, self._publisher_factory
            self._publisher_factory = lambda epoch: traced(untraced(epoch), tracer, system=system)
            log.info("tracing: a span per publish, exported over OTLP (OTEL_* settings)")
        if h.metrics_addr:
            from sluiceway.harvest.metrics import HarvestMetrics

            self._metrics = HarvestMetrics(
                h.name, destination=h.destination, outbox=(h.data_source, h.outbox_table)
            )
            host, port = self._metrics.serve(h.metrics_addr)
            log.info("metrics on http://%s:%d/metrics", host, port)
            user = self._handler

            def both(event: Event) -> None:
                self._metrics.observe(event)
                if user is not None:
                    user(event)

            self._handler = both

    def _default_store_factory(self) -> Callable[[], OutboxStore]:
        from sluiceway.outbox.store import SqlOutboxStore

        h = self.config.harvest
        return lambda: SqlOutboxStore(h.data_source, h.outbox_table)

    def _default_publisher_factory(self) -> Callable[[int], Publisher]:
        h = self.config.harvest
        if h.target is not None:
            return self._broker_publisher_factory()
        if h.journal is not None:
            target = h.journal

            def journal(epoch: int) -> Publisher:
                from sluiceway.harvest.journal_target import JournalPublisher

                return JournalPublisher(
                    target.path,
                    epoch=epoch,
                    register=target.epoch_register,
                    segment_bytes=target.segment_bytes,
                    fsync=target.fsync,
                )

            return journal

        from sluiceway.harvest.kafka import SparePublishers

        # A fresh client per leadership term (nothing a fenced term queued can leak into the next),
        # taken from a warm spare so a new leader publishes at once.
        spares = SparePublishers(self._kafka_log().apply(h.producer_config))
        self._spares = spares
        return spares.take

    def _broker_publisher_factory(self) -> Callable[[int], Publisher]:
        """NATS, RabbitMQ or Redis: a fresh client per term that stops retrying once we lead no more."""
        from sluiceway.harvest.brokers import BrokerPublisher, msg_id_prefix

        h = self.config.harvest
        target = h.target
        assert target is not None
        prefix = msg_id_prefix(target, h.data_source, h.outbox_table)
        return lambda epoch: BrokerPublisher(target, prefix=prefix, may_send=self.election.is_leader)

    def _default_election(self) -> LeaderElection:
        h = self.config.harvest
        lim = self.config.limits
        if h.election_kind == "kafka":
            from sluiceway.election.neli import KafkaElection

            return KafkaElection(
                self._kafka_log().apply(h.kafka_config),
                h.topic_for_leader,
                h.group_id,
                heartbeat_timeout=lim.heartbeat_timeout,
                min_poll_interval=lim.min_poll_interval,
                poll_duration=lim.poll_duration,
            )
        ttl = h.election.lease_timeout or lim.heartbeat_timeout
        return DatabaseLease(h.data_source, h.election_name, ttl=ttl, table=h.lease_table)

    _spares: Any = None
    _client_log: ClientLog | None = None

    def _kafka_log(self) -> ClientLog:
        """One rate-limited log for every Kafka client of this harvester (see ``ClientLog``)."""
        if self._client_log is None:
            from sluiceway.harvest.kafka import ClientLog

            self._client_log = ClientLog()
        return self._client_log

    def _close(self) -> None:
        if self._spares is not None:
            self._spares.close()
        if self._tracing is not None:
            # Flushed, not shut down: the provider is the process's (the application's spans go
            # through it too, and a harvester started again uses it); it is shut down at exit.
            self._tracing.flush()
        if self._metrics is not None:
            self._metrics.close()
        if self._client_log is not None:
            self._client_log.flush()


def _check_outbox_rights(db: Database, layout: OutboxLayout) -> None:
    """What the harvester does to outbox rows, done to none: read them (``stats``), reset one
    (``UPDATE``) and purge one (``DELETE``) that no row matches. A refusal names the GRANT."""
    q = queries(db.dialect, layout)
    steps = (
        ("read", "stats", None),
        ("update", "reset", {"id": -1, "leader_id": str(uuid.UUID(int=0))}),
        ("delete from", "purge_one", {"id": -1}),
    )
    for verb, name, params in steps:
        try:
            db.execute(q[name], params, what=f"outbox check: {name}")
        except DatabaseError as exc:
            if exc.cause is not Cause.PRIVILEGE or db.dialect is Dialect.SQLITE:
                raise  # SQLite's read-only file: said by the generic fix
            user, _ = whoami(db)
            who = "user" if db.dialect is Dialect.MYSQL else "role"
            raise StartupRefused(
                Permanent(
                    Cause.PRIVILEGE,
                    f"the {who} {user!r} may not {verb} the outbox table {layout.table}: {exc.detail}",
                    f"GRANT SELECT, UPDATE, DELETE ON {layout.table} TO {grantee(user, db.dialect)}",
                )
            ) from exc


class _Listener:
    def __init__(self, harvest: Harvest) -> None:
        self.h = harvest

    def leader_acquired(self, epoch: int) -> None:
        self.h._wake()

    def leader_revoked(self) -> None:
        self.h._ended_by_election = True
        self.h._emit(LeaderRevoked())
        self.h._wake()

    def leader_fenced(self) -> None:
        self.h._ended_by_election = True
        self.h._emit(LeaderFenced())
        self.h._wake()


class _NoPublisher:
    def send(self, record: Any, on_done: Any) -> None:
        raise SluicewayError("no publisher outside a leadership term")

    def flush(self, timeout: float) -> int:
        return 0

    def close(self) -> None:
        pass
