"""Running a pipeline on Spark Structured Streaming: one query per sink, each with its own checkpoint.

Every sink reads the source independently (``<checkpoint>/<sink>`` is its offset log), through
the pipeline's namespace filter and transforms and its own namespace filter, into a
``foreachBatch`` :class:`~sluiceway.pipeline.sinks.handler.BatchHandler`. So a slow or failing
sink never holds the others back: its query stops (at the last good offset) and theirs go on.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluiceway.pipeline.checkpoint import CheckpointLock
from sluiceway.pipeline.compat import is_connect_session, tolerate_observed_metrics_in_commands
from sluiceway.pipeline.dedup import dedup_by_sequence
from sluiceway.pipeline.errors import (
    PipelineError,
    SinkFailed,
    StepPaused,
    explain,
    file_system_fault,
    from_python_worker,
)
from sluiceway.pipeline.operator import SinkStatus
from sluiceway.pipeline.operator import skip as skip_record
from sluiceway.pipeline.operator import status as sinks_status
from sluiceway.pipeline.preflight import check_checkpoint
from sluiceway.pipeline.sinks.handler import BatchHandler, Stopping
from sluiceway.pipeline.sinks.kinds import check_sinks
from sluiceway.pipeline.sources.adapters import adapter
from sluiceway.pipeline.spec import PipelineSpec
from sluiceway.pipeline.state import RunState, StateStore
from sluiceway.pipeline.transforms import apply_transforms
from sluiceway.signals import stopping_on_signals

if TYPE_CHECKING:
    from sluiceway.cdc.service import CaptureService

log = logging.getLogger("sluiceway.pipeline")

#: How long a stop waits for in-flight batches before it interrupts them.
STOP_GRACE = 25.0


def register_sources(spark: Any) -> None:
    """Register the sluiceway data sources (``sluice-journal``, ``sluice-kafka``, ``sluice-outbox``,
    ``sluice-nats``, ``sluice-redis``, and ``sluice-postgres-cdc`` for batch copies) with a session.

    For example::

        register_sources(spark)
        spark.readStream.format("sluice-journal").option("path", "./data/journal").load()
    """
    for cls in _source_classes().values():
        spark.dataSource.register(cls)
    if is_connect_session(spark):
        # A Declarative Pipelines run would otherwise fail at its end (see compat's docstring).
        tolerate_observed_metrics_in_commands()


def _source_classes() -> dict[str, type]:
    from sluiceway.pipeline.sources.cdc import PostgresCdcDataSource
    from sluiceway.pipeline.sources.journal import JournalDataSource
    from sluiceway.pipeline.sources.kafka import KafkaDataSource
    from sluiceway.pipeline.sources.nats import NatsDataSource
    from sluiceway.pipeline.sources.outbox import OutboxDataSource
    from sluiceway.pipeline.sources.redis import RedisDataSource

    classes = (
        JournalDataSource,
        KafkaDataSource,
        OutboxDataSource,
        PostgresCdcDataSource,
        NatsDataSource,
        RedisDataSource,
    )
    return {cls.name(): cls for cls in classes}


def register_query_source(spark: Any, fmt: str, query: str) -> str:
    """Register a copy of source ``fmt`` for one streaming query alone; returns the name to read.

    Spark 4.3 builds every Python function of a registered Python data source around one shared
    Java map of environment variables, and a streaming query's source runner writes into that map
    when the query starts. If another query using the same registered source is serializing a
    task at that moment, the task's bytes are torn and it fails to deserialize
    (``java.io.OptionalDataException``) — seen when a pipeline's sink queries (re)start side by
    side. A registration of its own gives each query a map of its own.
    """
    sources = _source_classes()
    if fmt not in sources:
        raise ValueError(f"no such sluiceway source {fmt!r}: expected one of {', '.join(sorted(sources))}")
    base = sources[fmt]
    digest = hashlib.sha1(query.encode()).hexdigest()[:10]
    alias = f"{fmt}-q{digest}"
    copy = type(
        f"{base.__name__}_{digest}",
        (base,),
        {"name": classmethod(lambda cls: alias), "__module__": __name__, "__doc__": base.__doc__},
    )
    spark.dataSource.register(copy)
    return alias


def source_format(
    spec: PipelineSpec, sink: str, *, max_records: int | None = None, owner: str = ""
) -> tuple[str, dict[str, str]]:
    """The data source name and options that read the pipeline's source for one sink.

    ``owner`` names the pipeline run (a CDC slot serves one run at a time)."""
    return adapter(spec).spark_format(spec, sink, max_records=max_records)


def build_stream(
    spark: Any, spec: PipelineSpec, sink: str, *, max_records: int | None = None, owner: str = ""
) -> Any:
    """The streaming DataFrame one sink consumes: source → namespace filter → transforms → sink filter."""
    fmt, opts = source_format(spec, sink, max_records=max_records, owner=owner)
    fmt = register_query_source(spark, fmt, f"{spec.name}/{sink}")
    df = spark.readStream.format(fmt).options(**opts).load()
    if adapter(spec).dedup(spec):
        df = dedup_by_sequence(df)
    if spec.namespace != ".*":
        # Columns taken from the DataFrame itself, so a Spark Connect DataFrame gets Connect columns
        # even in a process that also runs a classic session.
        df = df.filter(df["namespace"].rlike(spec.namespace))
    df = apply_transforms(
        spark, df, list(spec.transforms), view_prefix=f"sluice_{spec.name}_{sink}".replace("-", "_")
    )
    sink_spec = spec.sink(sink)
    if sink_spec.namespace != ".*":
        df = df.filter(df["namespace"].rlike(sink_spec.namespace))
    return df


@dataclass
class SinkRun:
    """How one sink's query ended (or that it is still running)."""

    sink: str
    state: RunState
    error: str | None = None
    offset: int | None = None


class Pipeline:
    """A pipeline spec bound to a SparkSession.

    For example::

        spec = PipelineSpec.from_yaml("orders.yaml")
        Pipeline(spec, spark).run(once=True)                               # process what is there
        Pipeline(spec, spark).status()                                     # per-sink offsets and lag
    """

    def __init__(
        self, spec: PipelineSpec, spark: Any = None, *, master: str = "local[*]", metrics: Any = None
    ) -> None:
        self.spec = spec
        #: A :class:`~sluiceway.pipeline.metrics.PipelineMetrics` to count each sink's batches in.
        self.metrics = metrics
        if spec.tracing.enabled:
            from sluiceway.tracing import require_tracing

            require_tracing()  # the otel extra, before a session starts
        if spark is None:
            from sluiceway.pipeline.session import build_session

            spark = build_session(master, app_name=f"sluice-{spec.name}", conf=dict(spec.spark))
        self.spark = spark
        register_sources(spark)
        self.queries: dict[str, Any] = {}
        self.handlers: dict[str, BatchHandler] = {}
        self._stop = threading.Event()
        #: Set when this run stops: its sinks' batches that have not started write nothing.
        self._stopping = threading.Event()
        #: Names this run to sources that admit one run at a time.
        self.run_id = f"{spec.name}-{uuid.uuid4().hex[:8]}"
        #: The capture that feeds the source (CDC: slot → journal), once prepared.
        self.capture: CaptureService | None = None
        #: What ended the run other than a sink (the capture failing).
        self.failure: BaseException | None = None
        self._reported: set[str] = set()
        #: Held from :meth:`preflight` to the end of the run (:meth:`stop`).
        self._lock: CheckpointLock | None = None

    @classmethod
    def from_yaml(cls, path: str, spark: Any = None, *, master: str = "local[*]") -> Pipeline:
        return cls(PipelineSpec.from_yaml(path), spark, master=master)

    # -- starting --------------------------------------------------------------------------------
    def start_sink(self, sink: str, *, once: bool = False, max_records: int | None = None) -> Any:
        spec = self.spec
        sink_spec = spec.sink(sink)
        checkpoint = str(spec.checkpoint_dir(sink))
        tracing = None
        if spec.tracing.enabled:
            from sluiceway.pipeline.sinks.tracing import TraceSetup

            tracing = TraceSetup.here(spec.name, spec.source.type)
            tracing.start()  # the driver's; each task starts its own
        handler = BatchHandler(spec.name, sink_spec, checkpoint, stopping=self._stopping, tracing=tracing)
        df = build_stream(self.spark, spec, sink, max_records=max_records, owner=self.run_id)
        batch_fn = handler
        if self.metrics is not None and not is_connect_session(self.spark):
            batch_fn = self.metrics.metered(handler)  # Connect runs the function on the server
        writer = (
            df.writeStream.foreachBatch(batch_fn)
            .queryName(f"{spec.name}.{sink}")
            .option("checkpointLocation", checkpoint)
        )
        if once:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{int(spec.trigger.interval * 1000)} milliseconds")
        query = writer.start()
        self.queries[sink] = query
        self.handlers[sink] = handler
        log.info("pipeline %s: sink %s started (%s)", spec.name, sink, "once" if once else "continuous")
        return query

    def start(self, *, once: bool = False, sinks: list[str] | None = None) -> dict[str, Any]:
        self._stopping.clear()
        self.preflight()
        try:
            self._start_capture(once)
            for s in sinks or [s.name for s in self.spec.sinks]:
                self.start_sink(s, once=once)
        except BaseException:
            self._stop_capture()
            self._release()
            raise
        return dict(self.queries)

    # -- waiting and stopping --------------------------------------------------------------------
    def outcome(self, sink: str) -> SinkRun:
        query = self.queries[sink]
        if query.isActive:
            return SinkRun(sink, RunState.RUNNING)
        exc = query.exception()
        if exc is None:
            return SinkRun(sink, RunState.FINISHED)
        text = str(exc)
        if Stopping.MARKER in text:
            return SinkRun(sink, RunState.STOPPED)
        if StepPaused.MARKER in text:
            return SinkRun(sink, RunState.PAUSED)
        err = StateStore(self.spec.checkpoint_dir(sink)).load().error
        if err and "SinkFailed" in text:
            return SinkRun(sink, RunState.FAILED, err["message"], err.get("offset"))
        log.debug("pipeline %s: sink %s failed:\n%s", self.spec.name, sink, text)
        # Not the sink's write (that says so: SinkFailed): Spark's own, into the sink's checkpoint.
        # A full or read-only disk there is named by the place (the JVM's text does not name it).
        fault = None if "SinkFailed:" in text else file_system_fault(exc, str(self.spec.checkpoint_dir(sink)))
        if fault is not None:
            return SinkRun(sink, RunState.FAILED, f"checkpoint {fault.problem}")
        return SinkRun(sink, RunState.FAILED, failure_line(exc))

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, timeout: float = STOP_GRACE) -> None:
        """Stop every query, letting in-flight batches finish for up to ``timeout`` seconds."""
        self._stopping.set()
        deadline = time.monotonic() + timeout
        for query in self.queries.values():
            while query.isActive and _trigger_active(query) and time.monotonic() < deadline:
                time.sleep(0.1)
            if query.isActive:
                query.stop()
        for handler in self.handlers.values():
            handler.close()
        self._stop_capture()
        self._release()

    def wait(self, timeout: float | None = None) -> dict[str, SinkRun]:
        """Block until every query has ended (or a stop was requested, or ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stop.is_set():
            running = [q for q in self.queries.values() if q.isActive]
            if not running:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            # On the query itself, not a sleep: a --once run returns as its last batch commits.
            _await_end(running[0], 0.2)
            self._report_failures()
            if self.capture is not None and self.capture.error is not None:
                # The sinks cannot get further than the capture: stop them, say why in one line.
                log.error("pipeline %s: %s", self.spec.name, first_line(str(self.capture.error)))
                self.failure = self.capture.error
                break
        if self._stop.is_set():
            self.stop()
        return {s: self.outcome(s) for s in self.queries}

    def _report_failures(self) -> None:
        for sink in self.queries:
            if sink in self._reported:
                continue
            run = self.outcome(sink)
            if run.state is RunState.FAILED:
                self._reported.add(sink)
                at = f" at offset {run.offset}" if run.offset is not None else ""
                # One line; the whole cause (a driver's DETAIL lines, say) at debug level.
                log.error(
                    "pipeline %s: sink %s stopped%s: %s", self.spec.name, sink, at, first_line(run.error)
                )
                log.debug("pipeline %s: sink %s: %s", self.spec.name, sink, run.error)

    def run(
        self, *, once: bool = False, handle_signals: bool = True, timeout: float | None = None
    ) -> dict[str, SinkRun]:
        """Start every sink and wait. SIGTERM/SIGINT stop cleanly (in-flight batches finish)."""
        with _signals(self.request_stop, enabled=handle_signals):
            self.start(once=once)
            try:
                runs = self.wait(timeout)
            finally:
                if any(q.isActive for q in self.queries.values()):
                    self.stop()
                for handler in self.handlers.values():
                    handler.close()
                self._stop_capture()
                self._release()
        if self.failure is not None:
            raise self.failure
        for sink, outcome in runs.items():
            if outcome.state in (RunState.FINISHED, RunState.STOPPED):
                self._commit_source(sink)
        return runs

    def preflight(self) -> None:
        """Check what the source and every sink need before any query starts, so a problem is
        one clear line (:mod:`~sluiceway.pipeline.preflight`): the journal exists; databases,
        brokers and directories can be reached. For CDC also: the server's settings and our
        privileges, the tables, the publication and the slot (created when missing), that no one
        else reads the slot, and that the capture's journal is not behind it. The capture stays
        prepared for :meth:`start`.
        """
        if self.capture is not None:
            return
        source = adapter(self.spec)
        check_checkpoint(self.spec)
        source.check(self.spec)
        check_sinks(self.spec)
        if self._lock is None:
            lock = CheckpointLock(self.spec.checkpoint)
            lock.acquire()  # one run per checkpoint: a second is refused here, naming the first
            self._lock = lock
        service = source.capture(self.spec)
        if service is None:
            return
        try:
            service.prepare()
        except BaseException:
            self._release()
            raise
        self.capture = service

    def _release(self) -> None:
        """This run no longer holds its checkpoint."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def _start_capture(self, once: bool) -> None:
        """CDC: ``--once`` captures up to now first, then the sinks read the journal to its end;
        a continuous run captures on a background thread while the sinks follow the journal."""
        service = self.capture
        if service is None:
            return
        if once:
            self.capture = None
            service.catch_up()
        else:
            service.start()

    def _stop_capture(self) -> None:
        service, self.capture = self.capture, None
        if service is not None:
            service.close()

    def _commit_source(self, sink: str) -> None:
        """Tell the source that the sink's last committed batch is done (outbox: purge its rows)."""
        adapter(self.spec).commit(self.spec, sink)

    # -- operator tools --------------------------------------------------------------------------
    def step(self, sink: str) -> dict[str, Any]:
        """Process exactly one record for ``sink`` (then stop). Returns what happened."""
        store = StateStore(self.spec.checkpoint_dir(sink))
        with store.update() as st:
            st.step = 1
            before = st.records
        query = self.start_sink(sink, once=True, max_records=1)
        try:
            _await(query)
            run = self.outcome(sink)
        finally:
            self.handlers[sink].close()
            with store.update() as st:
                st.step = None
                state = st
        if run.state is RunState.FAILED:
            raise SinkFailed(sink, run.offset, run.error or "failed")
        written = state.records - before
        return {"sink": sink, "written": written, "offset": state.last_offset if written else None}

    def skip(self, sink: str, offset: int) -> None:
        skip_record(self.spec, sink, offset)

    def status(self) -> list[SinkStatus]:
        return sinks_status(self.spec)


def _await(query: Any) -> None:
    try:
        query.awaitTermination()
    except Exception as exc:  # the outcome is read from the query and the state file
        if StepPaused.MARKER not in str(exc) and "SinkFailed" not in str(exc):
            raise PipelineError(f"query {query.name} failed: {failure_line(exc)}") from None


def _await_end(query: Any, seconds: float) -> None:
    """Up to ``seconds`` for ``query`` to end, returning at once when it does. A query that
    failed raises here; what ended it is read by :meth:`Pipeline.outcome`."""
    with suppress(Exception):
        query.awaitTermination(seconds)


def _trigger_active(query: Any) -> bool:
    try:
        return bool(query.status.get("isTriggerActive"))
    except Exception:  # the query ended between the two calls
        return False


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failed|Violation|Exit)\w*: .+")


def failure_line(exc: BaseException) -> str:
    """A failed query in one line: a transform's (a Python worker's) error as it says itself
    (:func:`explain`); anything else, Spark's own errors that name the file or path, from its text."""
    return explain(exc) if from_python_worker(exc) else summarize(str(exc))


def summarize(text: str) -> str:
    """One line out of a failed query's text (a JVM and Python traceback): our own ``SinkFailed``
    if it is there, else the Python exception a traceback ends with, else the first line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "SinkFailed:" in line:
            return line.split("SinkFailed:", 1)[1].strip()[:500]
    if "Traceback (most recent call last)" in text:
        raised = [line for line in lines if _EXCEPTION_LINE.match(line)]
        if raised:
            return raised[-1][:500]
    return lines[0][:500] if lines else text[:500]


def first_line(text: str | None) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


@contextmanager
def _signals(callback: Any, *, enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return

    def stop(name: str) -> None:
        log.info("received %s: stopping (in-flight batches finish first)", name)
        callback()

    with stopping_on_signals(stop):
        yield
