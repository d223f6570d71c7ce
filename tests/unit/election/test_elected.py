"""The elected-service life the harvester and ``sluice capture`` share (``Elected``)."""

from __future__ import annotations

import threading

import pytest

from sluiceway.election.elected import Elected
from sluiceway.election.protocol import ElectionListener
from sluiceway.errors import SluicewayError


class HandElection:
    """An election the test decides, calling the listener as a real one would."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.leading = False
        self.listener: ElectionListener | None = None

    def start(self, listener: ElectionListener) -> None:
        self.calls.append("campaign")
        self.listener = listener

    def is_leader(self) -> bool:
        return self.leading

    def stop(self) -> None:
        self.calls.append("release")

    def win(self) -> None:
        self.leading = True
        assert self.listener is not None
        self.listener.leader_acquired(1)

    def lose(self) -> None:
        self.leading = False
        assert self.listener is not None
        self.listener.leader_revoked()


class Terms(Elected):
    """Counts terms; a term lasts while leading. The wait for leadership is long (60 s), so only
    a wake-up from the listener or ``stop`` lets a test see a term begin or the thread end."""

    kind = "terms"
    stop_wait = 10.0  # far longer than a wake-up takes, far shorter than the wait for leadership

    def __init__(self, fail: BaseException | None = None) -> None:
        super().__init__()
        self.name = "t"
        self.calls: list[str] = []
        self.election = HandElection(self.calls)
        self.began = threading.Event()
        self.ended = threading.Event()
        self.fail = fail

    def _listener(self) -> ElectionListener:
        service = self

        class Wakes:
            def leader_acquired(self, epoch: int) -> None:
                service._wake()

            def leader_revoked(self) -> None:
                service._wake()

            def leader_fenced(self) -> None:
                service._wake()

        return Wakes()

    def _before_election(self) -> None:
        self.calls.append("prepare")

    def _interrupt(self) -> None:
        self.calls.append("interrupt")

    def _close(self) -> None:
        self.calls.append("close")

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                if not self._await_leadership(60):
                    continue
                if self.fail is not None:
                    raise self.fail
                self.began.set()
                with self._leadership:
                    self._leadership.wait_for(lambda: not self._leading(), 60)
                self.ended.set()
        except BaseException as exc:
            self._error = exc


def test_a_term_begins_when_the_listener_says_we_lead_and_ends_when_we_do_not() -> None:
    service = Terms()
    with service:
        assert service.calls == ["prepare", "campaign"]
        assert not service.began.is_set()
        service.election.win()
        assert service.began.wait(10), "leader_acquired did not wake the wait for leadership"
        assert service.is_leader
        service.election.lose()
        assert service.ended.wait(10), "leader_revoked did not end the term"
    assert service.wait(0) is True
    assert service.calls == ["prepare", "campaign", "interrupt", "release", "close"]


def test_stop_ends_a_thread_waiting_for_leadership_at_once() -> None:
    service = Terms().start()
    service.stop()
    assert service.wait(0) is True, "stop did not wake the wait for leadership"
    service.stop()  # idempotent
    assert service.calls.count("release") == 2


def test_a_fatal_error_in_the_thread_is_raised_by_wait() -> None:
    service = Terms(fail=RuntimeError("boom")).start()
    service.election.win()
    with pytest.raises(RuntimeError, match="boom"):
        service.wait(10)
    service.stop()


def test_start_twice_and_wait_before_start_name_the_service() -> None:
    service = Terms()
    with pytest.raises(SluicewayError, match="terms not started"):
        service.wait(0)
    service.start()
    try:
        with pytest.raises(SluicewayError, match="terms already started"):
            service.start()
    finally:
        service.stop()
