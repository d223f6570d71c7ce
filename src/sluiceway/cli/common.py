"""Shared CLI plumbing: logging set-up and turning errors into one clear line + exit code.

Errors we raise on purpose (:class:`SluicewayError`) are one line where a command catches them
(:func:`friendly_errors`, :func:`fail`). Anything else that escapes a command reaches the entry
point's boundary (``sluiceway.cli.main``), which prints it with :func:`report`: one line, the
exception's type and message with its causes folded in, and the traceback only when asked for.

User text is never markup. Partition names, keys, table names, file names and error messages
(a YAML error quotes ``[oops``) hold square brackets, and rich would read ``[bold]p1`` as a style
and print ``p1``. So both consoles are made with ``markup=False``: every string printed through
them, and every string cell of a table they print, is shown as written. Our own emphasis is
given as styles (:func:`styled`), never spelled in the text.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import traceback
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
    """Log to stderr in ``fmt`` at ``level``, unless the command line chose another level.

    ``level`` is the command's default (INFO, or the level its config file names). A command's own
    ``--log-level`` given on the command line wins; else ``sluice --log-level`` does.
    """
    logs.setup(_chosen_level(level), fmt)


def _chosen_level(level: int | str) -> int | str:
    from typer._click.globals import get_current_context  # typer runs its own copy of click

    ctx = get_current_context(silent=True)
    if ctx is None:
        return level
    if "log_level" in ctx.params:
        source = ctx.get_parameter_source("log_level")
        if source is not None and source.name != "DEFAULT":
            return level  # the command's own --log-level, given: it is already ``level``
    chosen = ctx.find_root().params.get("log_level")
    if chosen is None:
        return level
    return str(getattr(chosen, "value", chosen))


# -- the one line for an unexpected error ---------------------------------------------------------

#: Where a message stops and a stack trace begins: Python's, or the one PySpark appends.
_TRACE_STARTS = ("Traceback (most recent call last):", "JVM stacktrace:")
#: A Java stack frame (Py4J puts the JVM's stack trace in its message), or its elision.
_JAVA_FRAME = re.compile(r"^\s+(at \S+\(.*\)|\.\.\. \d+ more)\s*$")


def report(exc: BaseException, *, debug: bool = False) -> None:
    """Say ``exc`` as one ``error:`` line on stderr; with ``debug``, its traceback first."""
    if debug:
        traceback.print_exception(exc)
    fail(one_line(exc))


def one_line(exc: BaseException) -> str:
    """``exc`` and what led to it as one line: ``Type: message``, each cause folded in after it.

    A cause (``raise … from``) is said as ``(caused by …)``, an exception being handled when this
    one was raised as ``(while handling …)``; a cause whose words are already in the line is left
    out. Our own errors are said without their type: their messages are written for users. A
    message over several lines is joined into one, and stops where a stack trace starts (the Java
    frames Py4J and PySpark put in theirs).

    >>> try:
    ...     try:
    ...         raise FileNotFoundError(2, "No such file or directory", "spec.yaml")
    ...     except OSError as exc:
    ...         raise RuntimeError("cannot read the spec") from exc
    ... except RuntimeError as exc:
    ...     print(one_line(exc))
    RuntimeError: cannot read the spec (caused by FileNotFoundError: [Errno 2] No such file or directory: 'spec.yaml')
    """  # noqa: E501
    line = _describe(exc)
    seen = {id(exc)}
    current = exc
    while True:
        if current.__cause__ is not None:
            current, how = current.__cause__, "caused by"
        elif current.__context__ is not None and not current.__suppress_context__:
            current, how = current.__context__, "while handling"
        else:
            return line
        if id(current) in seen:  # a cycle: exceptions re-raised from their own handlers
            return line
        seen.add(id(current))
        message = _message(current)
        described = _describe(current)
        if described in line or (message and message in line):
            continue
        line += f" ({how} {described})"


def _describe(exc: BaseException) -> str:
    message = _message(exc)
    if isinstance(exc, SluicewayError) and message:
        return message
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a Py4J error asks the JVM for its text; a JVM that is gone cannot answer
        return ""
    kept: list[str] = []
    for raw in text.splitlines():
        if raw.strip().startswith(_TRACE_STARTS) or _JAVA_FRAME.match(raw):
            break
        # Py4J starts the JVM's part with ": " ("An error occurred while calling o42.load.\n: java…").
        piece = raw.strip().removeprefix(": ")
        if piece:
            kept.append(piece)
    return " ".join(kept)
