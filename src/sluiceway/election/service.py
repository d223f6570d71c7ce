"""What every process that works only while it is the elected leader shares (the harvester,
``sluice capture``): one thread that waits for leadership and runs *terms* until stopped, a stop
that wakes it, and ``wait`` that re-raises whatever ended it."""

from __future__ import annotations

import threading

from sluiceway.election.protocol import LeaderElection
from sluiceway.errors import SluicewayError


class ElectedService:
    """The skeleton: subclasses run their terms in :meth:`_main` (on the service's thread) and
    start it with :meth:`_start_thread`; an exception that escapes ``_main`` ends the service and
    :meth:`wait` raises it."""

    #: How errors name the service ("harvest", "capture").
    kind = "service"

    def __init__(self, election: LeaderElection) -> None:
        self.election = election
        self._stopping = threading.Event()
        self._leadership = threading.Condition()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # -- public API ----------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> bool:
        """Block until the service ends (``stop`` or a fatal error). Returns False on timeout;
        re-raises a fatal error."""
        if self._thread is None:
            raise SluicewayError(f"{self.kind} not started")
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        return not self._thread.is_alive()

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader()

    # -- for subclasses ------------------------------------------------------------------------
    def _main(self) -> None:
        raise NotImplementedError

    def _start_thread(self, name: str) -> None:
        if self._thread is not None:
            raise SluicewayError(f"{self.kind} already started")
        self._thread = threading.Thread(target=self._guarded, name=name, daemon=True)
        self._thread.start()

    def _guarded(self) -> None:
        try:
            self._main()
        except BaseException as exc:
            self._error = exc
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        """Called on the service's thread with what ended it (log it)."""

    def _leading(self) -> bool:
        return not self._stopping.is_set() and self.election.is_leader()

    def _await_leadership(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for leadership (or a stop); whether a term may run now."""
        with self._leadership:
            self._leadership.wait_for(lambda: self._stopping.is_set() or self.election.is_leader(), timeout)
        return self._leading()

    def _wake(self) -> None:
        """Wake the service's thread (leadership changed, or a stop)."""
        with self._leadership:
            self._leadership.notify_all()

    def _signal_stop(self) -> None:
        self._stopping.set()
        self._wake()

    def _join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
