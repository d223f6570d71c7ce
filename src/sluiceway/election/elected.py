"""``Elected``: the life of a service that works only while this process leads.

The harvester and ``sluice capture`` are each one thread that waits to be elected, works a *term*
while leadership lasts, and waits again. What they share is here: ``start``, ``stop``, ``wait``,
a ``with`` block, and the wait for leadership that a listener's call cuts short. A subclass gives
the thread's body (``_run``), the listener its election calls, and what to do around a start and
a stop.
"""

from __future__ import annotations

import threading
from typing import Self

from sluiceway.election.protocol import ElectionListener, LeaderElection
from sluiceway.errors import SluicewayError


class Elected:
    """One worker thread that works while ``election`` says this process leads."""

    #: What errors and the thread's name call the service (``harvest``, ``capture``).
    kind = "service"
    #: How long ``stop`` waits for the thread; ``None``: until in-flight work is done.
    stop_wait: float | None = None

    name: str
    election: LeaderElection

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._leadership = threading.Condition()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # -- what a subclass gives -------------------------------------------------------------------
    def _run(self) -> None:
        raise NotImplementedError

    def _listener(self) -> ElectionListener:
        raise NotImplementedError

    def _before_election(self) -> None:
        """Called by ``start`` before campaigning (metrics, warm clients)."""

    def _interrupt(self) -> None:
        """Called by ``stop`` once the stop is asked for, before the thread is joined."""

    def _close(self) -> None:
        """Called by ``stop`` last, after leadership is released."""

    # -- public API ------------------------------------------------------------------------------
    def start(self) -> Self:
        if self._thread is not None:
            raise SluicewayError(f"{self.kind} already started")
        self._before_election()
        self.election.start(self._listener())
        self._thread = threading.Thread(target=self._run, name=f"sluice-{self.kind}-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop working, wait for the thread (``stop_wait``), release leadership. Idempotent."""
        self._stopping.set()
        self._wake()
        self._interrupt()
        if self._thread is not None:
            self._thread.join(self.stop_wait)
        self.election.stop()
        self._close()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the service ends (``stop`` or a fatal error). Returns False on timeout;
        re-raises the fatal error."""
        if self._thread is None:
            raise SluicewayError(f"{self.kind} not started")
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        return not self._thread.is_alive()

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- for the thread and the listener ---------------------------------------------------------
    def _wake(self) -> None:
        """Cut short the thread's wait for leadership (a listener's call, a stop)."""
        with self._leadership:
            self._leadership.notify_all()

    def _leading(self) -> bool:
        return not self._stopping.is_set() and self.election.is_leader()

    def _await_leadership(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds to lead (or to be stopped); True when a term may begin."""
        with self._leadership:
            self._leadership.wait_for(lambda: self._stopping.is_set() or self.election.is_leader(), timeout)
        return self._leading()


__all__ = ["Elected"]
