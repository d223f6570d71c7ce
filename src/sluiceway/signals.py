"""Stopping a long-running command on SIGTERM or Ctrl-C: one place that installs the handlers and
puts back the ones it found.

Every long-running command (``sluice reap``, ``sluice capture``, ``sluice feed worker``,
``sluice pipeline run``, ``sluice ui``) stops the same way: the signal asks its service to stop,
the service finishes what is in flight, and the command returns. Handlers can only be installed
on the main thread; elsewhere (a service embedded in a thread of a user's program) nothing is
installed and the caller stops the service itself.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

#: The signals that ask a command to stop.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stopping_on_signals(stop: Callable[[str], None]) -> Iterator[None]:
    """Call ``stop(name)`` (``"SIGTERM"``, ``"SIGINT"``) on a stop signal while inside; the
    handlers found are put back after. Off the main thread, nothing is installed.

    >>> with stopping_on_signals(lambda name: print("stop on", name)):
    ...     signal.raise_signal(signal.SIGTERM)
    stop on SIGTERM
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        stop(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class Service(Protocol):
    """A service with a life of its own (the harvester, ``sluice capture``)."""

    def start(self) -> Any: ...

    def wait(self, timeout: float | None = None) -> bool:
        """True once it has ended (raising what ended it, if anything did)."""
        ...

    def stop(self) -> None: ...


def run_service(
    service: Service,
    *,
    log: logging.Logger,
    stopping: str = "stopping",
    started: Callable[[], None] = lambda: None,
) -> None:
    """Start ``service``, call ``started()``, and wait until it ends or a stop signal arrives (it is
    logged to ``log``: ``received SIGTERM: <stopping>``); then stop it. What ended it is raised."""
    done = threading.Event()

    def on_signal(name: str) -> None:
        log.info("received %s: %s", name, stopping)
        done.set()

    with stopping_on_signals(on_signal):
        service.start()
        try:
            started()
            while not done.is_set():
                if service.wait(timeout=0.2):
                    break
        finally:
            service.stop()
