"""Serving the console: bind first, then announce; a signal is a clean stop.

Why it is shaped so: ``sluice ui`` used to print ``sluice ui on http://…`` and only then let uvicorn
bind, so a busy port came after the promise, as uvicorn's log line. And uvicorn, after its graceful
shutdown, raises the signal it caught again with the handlers it found, so SIGTERM ended the
process by that signal (exit 143) even though it had stopped cleanly. Here :func:`listen` binds
the socket before anything is printed (a bind that fails is one :class:`ListenError`), and
:func:`serve` gives uvicorn the bound socket with our own SIGTERM/SIGINT handler in place: the
signal uvicorn raises again lands there, and ``serve`` returns. A second Ctrl-C still cuts the
graceful shutdown short (uvicorn's own rule).
"""

from __future__ import annotations

import os
import socket
from typing import Any

import uvicorn

from sluiceway.errors import SluicewayError
from sluiceway.signals import stopping_on_signals

#: The signals that stop the console.


class ListenError(SluicewayError):
    """The console cannot listen on ``host:port`` (the port is taken, the address is not ours…)."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        self.host = host
        self.port = port
        self.reason = reason
        super().__init__(f"cannot listen on {address(host, port)}: {reason}")


def address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets: ``[::1]:8080``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` and listening (port 0: one the system picks).

    >>> sock = listen("127.0.0.1", 0)
    >>> listen("127.0.0.1", sock.getsockname()[1])
    Traceback (most recent call last):
    ...
    sluiceway.ui.serve.ListenError: cannot listen on 127.0.0.1:...: address already in use
    >>> sock.close()
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        # create_server sets SO_REUSEADDR (as uvicorn does): a port in TIME_WAIT after a restart
        # is free, one another process listens on is not.
        return socket.create_server((host, port), family=family)
    except socket.gaierror as exc:  # a host name that does not resolve
        raise ListenError(host, port, _lower(exc.strerror or str(exc))) from None
    except OSError as exc:
        # The system's own words (create_server adds "(while attempting to bind …)" to them).
        raise ListenError(host, port, _lower(os.strerror(exc.errno) if exc.errno else str(exc))) from None


def _lower(reason: str) -> str:
    return reason[:1].lower() + reason[1:]


def serve(app: Any, sock: socket.socket) -> None:
    """Serve ``app`` on the bound ``sock`` until SIGTERM or SIGINT; return once stopped cleanly."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))

    def stop(signal_name: str) -> None:
        server.should_exit = True  # also before uvicorn runs: it then starts and stops at once

    with stopping_on_signals(stop):
        server.run(sockets=[sock])
