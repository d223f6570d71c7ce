"""Shared CLI plumbing: logging set-up and turning our errors into one clear line + exit code.

User text is never markup. Partition names, keys, table names, file names and error messages
(a YAML error quotes ``[oops``) hold square brackets, and rich would read ``[bold]p1`` as a style
and print ``p1``. So both consoles are made with ``markup=False``: every string printed through
them, and every string cell of a table they print, is shown as written. Our own emphasis is
given as styles (:func:`styled`), never spelled in the text.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from sluiceway import logs
from sluiceway.errors import SluicewayError

F = TypeVar("F", bound=Callable[..., Any])

#: Output that is not a terminal (a pipe, a file) is never cut to fit a width: it keeps its full lines.
_UNBOUNDED = 100_000


def _console(*, stderr: bool = False) -> Console:
    # markup=False: user text (partition names, paths, driver messages) is shown as written.
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, markup=False, width=None if stream.isatty() else _UNBOUNDED)


console = _console()
err_console = _console(stderr=True)

#: ``--metrics-addr``, the same on every long-running command.
METRICS_ADDR_HELP = (
    "Serve Prometheus metrics on HOST:PORT; a bare :PORT listens on 127.0.0.1 "
    "(give a host to listen elsewhere)."
)


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line from plain strings (shown as written) and ``(text, style)`` pairs (our emphasis).

    >>> styled(("error:", "bold red"), " partition [bold]p1").plain
    'error: partition [bold]p1'
    """
    return Text.assemble(*parts)


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(styled(("error:", "bold red"), " ", message), highlight=False, soft_wrap=True)
    return typer.Exit(code)


def friendly_errors(func: F) -> F:
    """Report SluicewayError as one line on stderr and exit 1 (no traceback for expected errors)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except SluicewayError as exc:
            raise fail(str(exc)) from None

    return wrapper  # type: ignore[return-value]


def setup_logging(level: int | str = logging.INFO, fmt: str = "text") -> None:
    logs.setup(level, fmt)
