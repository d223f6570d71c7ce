"""The ``sluice`` command line (and the ``reaper`` alias for goharvest users).

Why it is shaped so:

* ``sluice --help`` answers at once. The commands are listed from :data:`COMMANDS`, a table of
  names, modules and summaries; a command's module, and what it imports (Spark, Kafka, pydantic
  models, rich tables), is loaded only when that command runs or its help is asked for. A test
  holds the table to the modules, so a summary cannot drift from its command.
* One error boundary for every command (:meth:`SluiceGroup.invoke`). Our own errors are already
  one line where commands catch them (``friendly_errors``); whatever else escapes a command is
  said in one line too (``error: Type: message (caused by …)``) with exit 1, and Ctrl-C is
  ``interrupted`` with exit 130. ``--debug`` or ``SLUICE_DEBUG=1`` adds the traceback. typer's
  own endings (an exit code, a usage error, ``--help``) pass through as they are.
* The current directory comes first on ``sys.path``, as ``python -m`` puts it: ``--processor
  myproc:process`` and a pipeline's ``python: myapp.transforms:fn`` find the modules beside the
  files a user runs ``sluice`` from.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
import traceback
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import islice
from typing import TYPE_CHECKING, Any

import typer
import typer.main
from typer.core import TyperGroup

import sluiceway
from sluiceway import logs

if TYPE_CHECKING:
    from typer._click import Command, Context, HelpFormatter

#: The environment's way to ask for ``--debug``.
DEBUG_ENV = "SLUICE_DEBUG"


@dataclass(frozen=True)
class Entry:
    """Where a command lives, and what ``sluice --help`` says of it (the first paragraph of its
    own help). Its module has ``register(app)``, or an ``app`` added under the command's name."""

    module: str
    summary: str


#: Every command of ``sluice``, in the order ``sluice --help`` lists them.
COMMANDS: dict[str, Entry] = {
    "outbox": Entry("sluiceway.cli.outbox", "Create and inspect outbox tables."),
    "reap": Entry(
        "sluiceway.cli.reap",
        "Harvest an outbox while this process is the elected leader, until SIGTERM/SIGINT.",
    ),
    "capture": Entry(
        "sluiceway.cli.capture",
        "Stream a PostgreSQL replication slot to Kafka, NATS, RabbitMQ, Redis or a journal while this "
        "process is the elected leader, until SIGTERM/SIGINT.",
    ),
    "journal": Entry("sluiceway.cli.journal", "Work with a local journal (a durable append-only log)."),
    "pipeline": Entry(
        "sluiceway.cli.pipeline",
        "Run a pipeline (source → namespace filter → transforms → sinks) on Spark, one streaming query "
        "per sink, and inspect or steer it.",
    ),
    "feed": Entry(
        "sluiceway.cli.feed",
        "A database-backed fan-out/fan-in work queue: partitions of items, processed gate by gate.",
    ),
    "status": Entry(
        "sluiceway.cli.overview",
        "Is anything stuck, where, since when: every outbox, journal, pipeline, feed and capture watched.",
    ),
    "ui": Entry(
        "sluiceway.cli.overview",
        "Serve a web console over the workspace: an overview, and a page per outbox, journal, pipeline, "
        "feed.",
    ),
    "demo": Entry(
        "sluiceway.cli.demo",
        "Run orders → outbox → harvester → journal → Spark pipeline → Parquet + feed → feed workers, then "
        "check that nothing was lost and every customer's events stayed in order.",
    ),
}


def _typer(**settings: Any) -> typer.Typer:
    """A Typer with the settings every level of ``sluice`` shares."""
    return typer.Typer(
        pretty_exceptions_enable=False,
        # Plain help: sentences re-flowed to the terminal's width, no type label on plain flags
        # (``--tombstone <bool>``), and usage errors as plain lines; sub-apps inherit it.
        rich_markup_mode=None,
        **settings,
    )


def load(name: str) -> Command:
    """Import command ``name``'s module and build its click command."""
    entry = COMMANDS[name]
    module = importlib.import_module(entry.module)
    holder = _typer()
    if hasattr(module, "register"):
        module.register(holder)
    else:
        holder.add_typer(module.app, name=name)
    command = typer.main.get_group(holder).commands.get(name)
    if command is None:
        raise LookupError(f"{entry.module} defines no command {name!r}")
    return command


class _Commands(MutableMapping[str, "Command"]):
    """The root's commands by name: every name in :data:`COMMANDS`, each loaded on first use (and
    any registered on the root itself)."""

    def __init__(self, registered: MutableMapping[str, Command]) -> None:
        self._loaded = dict(registered)

    def __getitem__(self, name: str) -> Command:
        if name not in self._loaded:
            if name not in COMMANDS:
                raise KeyError(name)
            self._loaded[name] = load(name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*COMMANDS, *self._loaded]))

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self._loaded))


#: What typer raises to end a run on purpose: an exit code (``--help`` too), an abort, a usage error.
_ENDINGS = (typer.Exit, typer.Abort, typer.TyperException)


class SluiceGroup(TyperGroup):
    """The root command: lazy sub-commands, listed from the table, and the error boundary."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _Commands(self.commands)

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        # From the table: listing the commands imports none of them.
        rows = [
            (name, COMMANDS[name].summary if name in COMMANDS else self.commands[name].get_short_help_str())
            for name in self.commands
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: Context) -> Any:
        debug = bool(ctx.params.get("debug"))
        try:
            return super().invoke(ctx)
        except typer.Exit as ending:
            behind = ending.__context__
            if debug and isinstance(behind, Exception) and not isinstance(behind, _ENDINGS):
                # fail() inside an except clause: the line is out, this is the error behind it.
                traceback.print_exception(behind)
            raise
        except _ENDINGS:
            raise
        except KeyboardInterrupt:
            if debug:
                traceback.print_exc()  # where it was when stopped: a command that hangs
            print("interrupted", file=sys.stderr)
            raise typer.Exit(130) from None
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
                raise  # the reader went away (sluice journal read | head): typer ends quietly
            from sluiceway.cli.common import report

            report(exc, debug=debug)
            raise typer.Exit(1) from None


class LogLevel(StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"sluice {sluiceway.__version__}")
        raise typer.Exit()


app = _typer(
    name="sluice",
    cls=SluiceGroup,
    help=(
        "sluiceway: move data out of operational databases reliably and in order.\n\n"
        "Examples:\n\n"
        "  sluice outbox init --dsn sqlite:///app.db\n\n"
        "  sluice reap -f reaper.yaml\n\n"
        "  sluice journal read ./data/journal --follow"
    ),
    no_args_is_help=True,
    context_settings={"max_content_width": 120},  # the terminal's width, up to 120 columns
)


@app.callback()
def _root(
    debug: bool = typer.Option(
        False,
        "--debug",
        envvar=DEBUG_ENV,
        help="On an error, show its traceback too.",
    ),
    log_level: LogLevel | None = typer.Option(
        None,
        "--log-level",
        case_sensitive=False,
        help="Log at this level rather than the command's default (INFO, or the level its config file "
        "names); a command's own --log-level wins.",
        show_default=False,
    ),
    version: bool = typer.Option(
        False, "--version", "-V", is_eager=True, callback=_show_version, help="Show the version and exit."
    ),
) -> None:
    if log_level is not None:
        # Now, for the commands that set up no logging of their own (sluice ui); the long-running
        # ones set it up again with their format, at this level (common.setup_logging).
        logs.setup(log_level.value)


def main(args: Sequence[str] | None = None) -> None:
    """``sluice …``"""
    _importable_from_cwd()
    _run(args)


def reaper_main() -> None:
    """``reaper -f reaper.yaml``: goharvest's command, backed by ``sluice reap``; ``sluice``'s own
    options (``--debug``, ``--log-level LEVEL``, ``--version``) may be given anywhere."""
    _importable_from_cwd()
    _run(reaper_args(sys.argv[1:]))


def reaper_args(args: Sequence[str]) -> list[str]:
    """``reaper``'s arguments as ``sluice``'s: the root's options first, then ``reap`` and the rest.

    >>> reaper_args(["-f", "reaper.yaml", "--log-level", "debug", "--debug"])
    ['--log-level', 'debug', '--debug', 'reap', '-f', 'reaper.yaml']
    """
    root: list[str] = []
    rest: list[str] = []
    words = iter(args)
    for word in words:
        if word in ("--debug", "--version", "-V") or word.startswith("--log-level="):
            root.append(word)
        elif word == "--log-level":
            root += [word, *islice(words, 1)]  # and its value
        else:
            rest.append(word)
    return [*root, "reap", *rest]


def _run(args: Sequence[str] | None) -> None:
    try:
        app(args=args)
    except KeyboardInterrupt:  # before a command started (SluiceGroup.invoke says it after)
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # the net beneath the boundary: a failure before a command started
        from sluiceway.cli.common import report

        words = sys.argv[1:] if args is None else args
        report(exc, debug="--debug" in words or _truthy(os.environ.get(DEBUG_ENV, "")))
        sys.exit(1)


def _truthy(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "t", "yes", "y", "on")


def _importable_from_cwd() -> None:
    """Put the current directory first on ``sys.path``, as ``python -m`` does (not under ``python
    -P`` or ``PYTHONSAFEPATH``, which ask for no such entry)."""
    if sys.flags.safe_path:
        return
    try:
        cwd = os.getcwd()
    except OSError:  # the directory was removed under us: nothing to import from there
        return
    if sys.path[:1] != [cwd]:
        sys.path.insert(0, cwd)


if __name__ == "__main__":
    main()
