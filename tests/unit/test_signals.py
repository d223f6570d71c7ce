"""One way to stop a long-running command: the handlers are installed for the run and put back after."""

from __future__ import annotations

import logging
import signal
import threading

import pytest

from sluiceway.signals import STOP_SIGNALS, run_service, stopping_on_signals


class Service:
    def __init__(self, ends_after: int | None = None, error: Exception | None = None) -> None:
        self.calls: list[str] = []
        self.ends_after, self.error, self.waits = ends_after, error, 0

    def start(self) -> None:
        self.calls.append("start")

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        if self.waits == 2 and self.ends_after is None:
            signal.raise_signal(signal.SIGTERM)
        if self.ends_after is not None and self.waits >= self.ends_after:
            if self.error is not None:
                raise self.error
            return True
        return False

    def stop(self) -> None:
        self.calls.append("stop")


def test_a_stop_signal_stops_the_service_and_the_handlers_are_put_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    service = Service()
    log = logging.getLogger("sluiceway.test")
    with caplog.at_level(logging.INFO, "sluiceway.test"):
        run_service(service, log=log, stopping="stopping (test)", started=lambda: service.calls.append("up"))
    assert service.calls == ["start", "up", "stop"]
    assert "received SIGTERM: stopping (test)" in caplog.text
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before


def test_what_ended_the_service_is_raised_after_it_is_stopped() -> None:
    service = Service(ends_after=1, error=RuntimeError("broken"))
    with pytest.raises(RuntimeError, match="broken"):
        run_service(service, log=logging.getLogger("sluiceway.test"))
    assert service.calls == ["start", "stop"]


def test_off_the_main_thread_nothing_is_installed() -> None:
    seen: list[object] = []

    def inside() -> None:
        with stopping_on_signals(lambda name: None):
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=inside)
    thread.start()
    thread.join()
    assert seen == [signal.getsignal(signal.SIGTERM)]
