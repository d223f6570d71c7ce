"""Serving Prometheus metrics: one address rule and one endpoint for every long-running process.

``sluice reap``, ``sluice feed worker`` and ``sluice pipeline run`` each keep their series on a
private registry (two harvesters in one process must not share counters) and serve it with
:func:`serve_metrics` when given ``--metrics-addr``. Off by default; a bare ``:PORT`` or
``PORT`` listens on loopback, so exposing metrics beyond the machine takes an explicit host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluiceway.errors import ConfigError

#: The host a metrics address without one listens on.
DEFAULT_HOST = "127.0.0.1"


def parse_metrics_addr(addr: str, *, option: str = "metrics-addr") -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``PORT`` → ``(host, port)``; the host defaults to loopback.
    (``sluice ui --addr`` follows the same rule; ``option`` names the option in errors.)

    >>> parse_metrics_addr(":9464")
    ('127.0.0.1', 9464)
    >>> parse_metrics_addr("0.0.0.0:9464")
    ('0.0.0.0', 9464)
    """
    host, _, port = addr.strip().rpartition(":")
    host = host.strip("[]") or DEFAULT_HOST
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"expected HOST:PORT or :PORT, got {addr!r}", path=option) from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"port {number} is out of range", path=option)
    return host, number


@dataclass
class MetricsEndpoint:
    """A running ``/metrics`` HTTP server (a daemon thread); ``port`` is the bound one (0 picks)."""

    host: str
    port: int
    _server: Any

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def serve_metrics(registry: Any, addr: str) -> MetricsEndpoint:
    """Serve ``registry`` on ``addr`` (see :func:`parse_metrics_addr`) until ``close()``."""
    from prometheus_client import start_http_server

    host, port = parse_metrics_addr(addr)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return MetricsEndpoint(host, int(server.server_port), server)
