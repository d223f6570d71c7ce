"""The ``sluice`` command line (and the ``reaper`` alias for goharvest users)."""

from __future__ import annotations

import sys

import typer

from sluiceway.cli import outbox as outbox_cli

app = typer.Typer(
    name="sluice",
    help=(
        "sluiceway: move data out of operational databases reliably and in order.\n\n"
        "Examples:\n\n"
        "  sluice outbox init --dsn sqlite:///app.db\n\n"
        "  sluice reap -f reaper.yaml\n\n"
        "  sluice journal read ./data/journal --follow"
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain help: sentences re-flowed to the terminal's width, no type label on plain flags
    # (``--tombstone <bool>``), and usage errors as plain lines; sub-apps inherit it.
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},  # the terminal's width, up to 120 columns
)
app.add_typer(outbox_cli.app, name="outbox")


def _register_optional() -> None:
    """Sub-apps that live in their own modules; each registers itself if present."""
    import importlib

    for module, name in (
        ("sluiceway.cli.reap", None),
        ("sluiceway.cli.capture", None),
        ("sluiceway.cli.journal", "journal"),
        ("sluiceway.cli.pipeline", "pipeline"),
        ("sluiceway.cli.feed", "feed"),
        ("sluiceway.cli.demo", None),
        ("sluiceway.cli.overview", None),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue
            raise
        if name is None:
            mod.register(app)
        else:
            app.add_typer(mod.app, name=name)


_register_optional()


def main() -> None:
    app()


def reaper_main() -> None:
    """``reaper -f reaper.yaml``: goharvest's command, backed by ``sluice reap``."""
    sys.argv = [sys.argv[0], "reap", *sys.argv[1:]]
    app()


if __name__ == "__main__":
    main()
