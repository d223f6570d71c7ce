"""Publishing from a process of its own: the slot is read and decoded here, the changes sent there.

One Python process holds one core at a time (the GIL). A capture does two things per change:
decode and assemble it (about 2.5 µs here), then make its message and hand it to the broker's
client library (5 to 10 µs: redis-py's pipeline, nats-py, the sender's loop). In one process they
take turns on one core; :class:`ProcessTarget` puts the second in a child process, so the two run
on two cores. What crosses is small: each append's Arrow batch (the stream's order), pickled as
Arrow IPC, down a pipe; back come the durable positions, failures, counts and log lines.

Why it is shaped so:

* The child runs the very :class:`~sluiceway.capture.target.PublishTarget` a capture runs in
  process, opened from the same configuration (:func:`~sluiceway.capture.publishing.open_target`):
  what is confirmed, refused, skipped or dead-lettered is decided in one place. The position the
  parent confirms to PostgreSQL is only ever one the child reported durable, so the rule holds:
  a position is confirmed only once the destination acknowledged everything before it.
* Leadership is the parent's. The child asks a flag in shared memory before each attempt (its
  ``may_send``); the parent clears it the moment it sees leadership gone (a reader thread looks
  every 10 ms, and at every ``check``) and when the term closes.
* The child never outlives its term: it asks the kernel for SIGKILL when the parent dies (Linux's
  parent-death signal, ``kill -9`` of the capture included) and stops at the pipe's end
  elsewhere. A child that dies ends the term (:class:`DeliveryFailed`); the next term sends again
  from the confirmed position, as after a lost connection.
* The parent keeps the window (changes handed over, not yet durable) and waits for room with the
  same short looks at failures and leadership as the in-process target; the child's own target
  has no window of its own, so its main thread is always back at the pipe at once and a send to
  it never waits long. The term's end is the pipe's end (a shutdown, never a send), so closing
  cannot wait on a full pipe either.
* Whatever stops the relay — an error in it, the child gone, a child that ends without being
  told — is the term's failure, raised at the next ``append`` or ``check``: a term never waits on
  a relay that is no more.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

from sluiceway.capture.config import CaptureConfig
from sluiceway.capture.metrics import CaptureMeter, commit_sample, value_bytes
from sluiceway.capture.publishing import Wrapper, open_target, published_file
from sluiceway.capture.target import DeliveryFailed, UndeliverableChange, prevailing
from sluiceway.cdc.errors import CdcError
from sluiceway.outbox.record import RecordColumns

log = logging.getLogger("sluiceway.capture")

#: How often the parent looks at leadership while nothing else wakes it.
LEADERSHIP_LOOK = 0.01
#: How long a closing child may take to let its last acknowledgements in and disconnect.
CLOSE_WAIT = 30.0
#: The child's own window: none (the parent's bounds what is in flight).
_UNBOUNDED = 1 << 62
#: The failures a child reports by name, raised as such in the parent; any other is a CdcError
#: that stops the capture, as an unexpected error of the in-process target would.
_FAILURES: dict[str, type[CdcError]] = {
    "DeliveryFailed": DeliveryFailed,
    "UndeliverableChange": UndeliverableChange,
}


class ProcessTarget:
    """A pipelined :class:`~sluiceway.cdc.target.CaptureTarget` whose publishing runs in a child
    process; see the module docstring. Opening it starts the child and waits until its client is
    ready (or raises what refused it, as the in-process target's opening would)."""

    pipelined = True

    def __init__(
        self,
        config: CaptureConfig,
        epoch: int,
        *,
        may_continue: Callable[[], bool],
        meter: CaptureMeter | None = None,
        wrap: Wrapper | None = None,
        max_in_flight: int = 20_000,
    ) -> None:
        self.config = config
        self.may_continue = may_continue
        self.meter = meter
        self.max_in_flight = max_in_flight
        #: Called (from the reader thread) with each new durable position.
        self.on_durable: Callable[[int], None] = lambda position: None
        self._position_file = published_file(config.capture)
        context = multiprocessing.get_context("spawn")  # the capture has threads: never fork it
        self._leading = context.RawValue(ctypes.c_bool, True)
        self._conn, child_end = context.Pipe()
        level = logging.getLogger("sluiceway").getEffectiveLevel()
        root_level = logging.getLogger().getEffectiveLevel()
        self._process = context.Process(
            target=_serve,
            args=(child_end, config, epoch, self._leading, os.getpid(), level, root_level, wrap),
            name=f"sluice-capture-publisher-{config.capture.name}",
            daemon=True,
        )
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._sent: deque[tuple[int, int]] = deque()  # (end, changes) of appends not yet durable
        self._in_flight = 0
        self._failure: CdcError | None = None
        self._durable = 0
        self._closing = False
        try:
            self._process.start()
        except BaseException:  # the wrapper cannot be pickled, say
            self._conn.close()
            child_end.close()
            raise
        child_end.close()
        try:
            self._await_ready()
        except BaseException:
            self._stop_child()
            self._conn.close()
            raise
        self._reader = threading.Thread(target=self._read, name="sluice-capture-relay", daemon=True)
        self._reader.start()

    # -- the CaptureTarget port ------------------------------------------------------------------
    def position(self) -> int | None:
        """What this target published last (None: nothing recorded — the slot's position rules)."""
        return self._position_file.read()

    def append(self, batch: pa.RecordBatch, end: int) -> None:
        count = batch.num_rows
        with self._room:
            while self._in_flight and self._in_flight + count > self.max_in_flight:
                self._check_locked()
                self._room.wait(0.05)
            self._check_locked()
            self._sent.append((end, count))
            self._in_flight += count
        try:
            self._conn.send(("append", batch, end))
        except OSError as exc:  # the child is gone: its exit is the story (the reader tells it)
            self._process.join(1.0)
            raise self._failure or self._gone(exc) from exc

    def check(self) -> None:
        """Raise what ended deliveries: a failed change, leadership gone, the child gone, or an
        append not acknowledged in time (the child's own target decides that)."""
        with self._lock:
            self._check_locked()

    def close(self) -> None:
        self._closing = True
        self._leading.value = False  # no attempt starts after the term: the next leader's are next
        # The pipe's end tells the child to finish (after what it has not read yet): a shutdown
        # never waits, where a send might, on a full pipe.
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_WR)
        self._process.join(CLOSE_WAIT)
        self._stop_child()
        self._reader.join(5.0)
        if not self._reader.is_alive():
            self._conn.close()
        self._process.close()

    # -- the parent's side -----------------------------------------------------------------------
    def _check_locked(self) -> None:
        if self._failure is not None:
            raise self._failure
        if not self._reader.is_alive():  # cannot be: the relay records why it ends
            raise DeliveryFailed("the capture's publishing relay ended")
        if not self.may_continue():
            self._leading.value = False
            raise DeliveryFailed("leadership ended while changes awaited their acknowledgements")

    def _await_ready(self) -> None:
        """Until the child's client is ready; raise what it reported instead, or that leadership
        went meanwhile."""
        while True:
            if not self._conn.poll(LEADERSHIP_LOOK * 10):
                if not self.may_continue():
                    raise DeliveryFailed("leadership ended while the publishing process started")
                if not self._process.is_alive():
                    raise self._early_exit(None)
                continue
            try:
                message = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise self._early_exit(exc) from exc
            if message[0] == "ready":
                return
            if message[0] == "failed":
                raise _failure_of(message[1], message[2])
            self._relay(message)  # a log line of its start

    def _read(self) -> None:
        """The child's reports, in order, until it closes; leadership looked at every
        :data:`LEADERSHIP_LOOK`, busy or not. Whatever ends it early is the term's failure."""
        conn = self._conn
        look_at = 0.0
        try:
            while True:
                now = time.monotonic()
                if now >= look_at:
                    look_at = now + LEADERSHIP_LOOK
                    if not self.may_continue():
                        self._leading.value = False
                try:
                    if not conn.poll(LEADERSHIP_LOOK):
                        continue
                    message = conn.recv()
                except (EOFError, OSError) as exc:
                    if not self._closing:
                        self._process.join(1.0)
                        self._fail(self._gone(exc))
                    return
                if message[0] == "closed":
                    if not self._closing:
                        self._process.join(1.0)
                        self._fail(self._gone(None))
                    return
                self._relay(message)
        except Exception as exc:  # a report the parent could not take: the term cannot go on
            log.exception("capture: relaying the publishing process's reports failed")
            self._fail(CdcError(f"relaying the publishing process's reports failed: {exc}"))

    def _relay(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "durable":
            self._moved(message[1])
        elif kind == "failed":
            self._fail(_failure_of(message[1], message[2]))
        elif kind == "published":
            if self.meter is not None:
                self.meter.count_published(message[1], message[2], message[3])
        elif kind == "skipped":
            if self.meter is not None:
                self.meter.skipped(message[1])
        elif kind == "dead_lettered":
            if self.meter is not None:
                self.meter.dead_lettered()
        elif kind == "log":
            record = logging.makeLogRecord(message[1])
            logger = logging.getLogger(record.name)
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)

    def _moved(self, position: int) -> None:
        with self._room:
            while self._sent and self._sent[0][0] <= position:
                self._in_flight -= self._sent.popleft()[1]
            self._room.notify_all()
        if position > self._durable:
            self._durable = position
            self.on_durable(position)

    def _fail(self, failure: CdcError) -> None:
        with self._room:
            self._failure = prevailing(self._failure, failure)
            self._room.notify_all()

    def _gone(self, exc: BaseException | None) -> DeliveryFailed:
        code = self._process.exitcode
        how = (
            "is still running"
            if code is None
            else f"was killed by signal {-code}"
            if code < 0
            else f"exited with status {code}"
        )
        why = f" ({exc})" if exc is not None and str(exc) else ""
        return DeliveryFailed(f"the capture's publishing process {how}{why}")

    def _early_exit(self, exc: BaseException | None) -> CdcError:
        """The child ended before it was ready without saying why (it could not start: an import,
        a script without ``if __name__ == "__main__":`` run again by the spawn): no retry helps."""
        self._process.join(1.0)
        return CdcError(f"{self._gone(exc)} before it was ready; its error is above")

    def _stop_child(self) -> None:
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5.0)


def _failure_of(kind: str, text: str) -> CdcError:
    return _FAILURES.get(kind, CdcError)(text)


# -- the child's side ---------------------------------------------------------------------------------
class _Outbox:
    """The child's side of the pipe: reports sent whole from any of its threads, one at a time."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def __call__(self, *message: Any) -> None:
        with self._lock, contextlib.suppress(OSError):  # the parent is gone: its death ends us
            self.conn.send(message)


class _RelayMeter:
    """The :class:`CaptureMeter` calls a :class:`PublishTarget` makes, sent to the parent's meter."""

    def __init__(self, report: _Outbox) -> None:
        self.report = report

    def published(self, records: RecordColumns, batch: pa.RecordBatch) -> None:
        self.report("published", len(records), value_bytes(records), commit_sample(batch))

    def skipped(self, count: int) -> None:
        self.report("skipped", count)

    def dead_lettered(self) -> None:
        self.report("dead_lettered")


class _RelayHandler(logging.Handler):
    """The child's log records, formatted, to the parent (whose handlers and format apply)."""

    def __init__(self, report: _Outbox) -> None:
        super().__init__()
        self.report = report

    def emit(self, record: logging.LogRecord) -> None:
        fields = {
            "name": record.name,
            "levelno": record.levelno,
            "levelname": record.levelname,
            "msg": record.getMessage(),
            "created": record.created,
            "processName": record.processName,
        }
        if record.exc_info:
            fields["exc_text"] = logging.Formatter().formatException(record.exc_info)
        self.report("log", fields)


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the parent dies (Linux): a child of a killed capture must not publish on."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(1)


def _end_within_close_wait(_signum: int, _frame: Any) -> None:
    """The child's SIGTERM: the pipe's end is waited for, at most :data:`CLOSE_WAIT` (as long as the
    capture's close waits for us), then the process ends without its cleanup."""
    timer = threading.Timer(CLOSE_WAIT, os._exit, (1,))
    timer.daemon = True
    timer.start()


def _serve(
    conn: Connection,
    config: CaptureConfig,
    epoch: int,
    leading: Any,
    parent: int,
    level: int,
    root_level: int,
    wrap: Wrapper | None,
) -> None:
    """The child process: a :class:`PublishTarget` fed the parent's appends until it says close."""
    _die_with_parent(parent)
    # Ctrl-C reaches a terminal's whole process group, and a service manager's SIGTERM the whole
    # control group: the stop is the capture's to make, and it closes the pipe, which ends us
    # after what we hold is sent. Dying at once instead would show the capture a failed term
    # ("killed by signal 15; trying again") while it stops cleanly. A SIGTERM sent to us alone
    # (multiprocessing's exit handler ends daemonic children so) still ends us, within CLOSE_WAIT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _end_within_close_wait)
    report = _Outbox(conn)
    root = logging.getLogger()
    root.handlers[:] = [_RelayHandler(report)]
    root.setLevel(root_level)
    logging.getLogger("sluiceway").setLevel(level)
    from sluiceway.heap import tune_collector

    tune_collector()  # as the capture's own process is

    def may_continue() -> bool:
        return bool(leading.value)

    try:
        target = open_target(
            config.capture,
            epoch,
            may_continue=may_continue,
            meter=_RelayMeter(report),
            wrap=wrap,
            max_in_flight=_UNBOUNDED,  # the parent's window bounds it: we always read the pipe at once
        )
    except BaseException as exc:
        report("failed", type(exc).__name__, str(exc))
        return
    target.on_durable = lambda position: report("durable", position)
    report("ready")
    failure: Exception | None = None  # the one reported

    def tell(exc: Exception) -> None:
        nonlocal failure
        if prevailing(failure, exc) is not failure:
            failure = exc
            kind = type(exc).__name__
            report("failed", kind, " ".join(str(exc).split()) or kind)

    try:
        while True:
            try:
                if not conn.poll(0.05):
                    # After a failure the parent ends the term; a refusal found meanwhile (the
                    # cause of what failed first) is still told, as the in-process target would.
                    target.check()
                    continue
                message = conn.recv()
            except (EOFError, OSError):
                leading.value = False  # the term is over (the parent closed, or is gone)
                return
            except Exception as exc:
                tell(exc)
                continue
            if failure is None:  # after a failure the parent ends the term: what comes is dropped
                try:
                    target.append(message[1], message[2])
                except Exception as exc:
                    tell(exc)
    finally:
        try:
            target.close()
        except Exception:
            log.warning("capture: closing the destination failed", exc_info=True)
        report("closed")


__all__ = ["ProcessTarget"]
