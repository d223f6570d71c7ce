"""Log lines in one format for every process of a run: the CLI's own, and the Spark Python
workers a pipeline starts (its sources' readers, its sinks' tasks), which inherit the format
through the environment. Without this a worker's warning reached the console as a bare message,
without time, level or logger, beside the driver's formatted lines."""

from __future__ import annotations

import json
import logging
import os
import sys

#: The format the CLI chose (``text`` or ``json``), for the processes it starts.
FORMAT_ENV = "SLUICE_LOG_FORMAT"


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload)


def _handler(fmt: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    return handler


def setup(level: int | str = logging.INFO, fmt: str = "text") -> None:
    """Log to stderr in ``fmt`` at ``level``; the processes this one starts adopt the format."""
    root = logging.getLogger()
    root.handlers[:] = [_handler(fmt)]
    root.setLevel(level)
    os.environ[FORMAT_ENV] = fmt


def adopt() -> None:
    """In a process the CLI started indirectly (a Spark Python worker): log warnings and errors in
    the CLI's format, unless nothing set one or logging is already configured here."""
    fmt = os.environ.get(FORMAT_ENV)
    root = logging.getLogger()
    if fmt not in ("text", "json") or root.handlers:
        return
    root.addHandler(_handler(fmt))
    root.setLevel(logging.WARNING)
