"""``sluice journal``: append to, read, inspect and compact a local journal."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sluiceway.cli.common import console, err_console, fail, friendly_errors, styled
from sluiceway.journal import Journal, Record

app = typer.Typer(
    help=(
        "Work with a local journal (a durable append-only log).\n\n"
        "Examples:\n\n"
        "  sluice journal append ./data/journal --key user-1 --value hello --namespace users\n\n"
        "  sluice journal read ./data/journal --from 100 --follow\n\n"
        "  sluice journal info ./data/journal\n\n"
        "  sluice journal compact ./data/journal"
    ),
    no_args_is_help=True,
)

PathArg = Annotated[Path, typer.Argument(help="Journal directory.", show_default=False)]


def note(message: str) -> None:
    """A line on stderr that is not an error: stdout stays the records alone."""
    err_console.print(message, highlight=False, soft_wrap=True)


def _parse_headers(raw: list[str]) -> list[tuple[str, str]]:
    headers = []
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--header must look like key=value, got {item!r}")
        headers.append((key, value))
    return headers


@app.command()
@friendly_errors
def append(
    path: PathArg,
    key: Annotated[str, typer.Option("--key", "-k", help="Record key.")],
    value: Annotated[str | None, typer.Option("--value", "-v", help="Record value (UTF-8 text).")] = None,
    value_file: Annotated[
        Path | None,
        typer.Option("--value-file", help="Read the value from a file ('-' for stdin), as bytes."),
    ] = None,
    tombstone: Annotated[bool, typer.Option("--tombstone", help="Write a tombstone (no value).")] = False,
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="Record namespace.")] = "",
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", help="A header key=value (repeatable).")
    ] = None,
) -> None:
    """Append one record durably and say the offset it was given.

    Example: sluice journal append ./j --key k1 --value hello --header source=cli
    """
    given = [value is not None, value_file is not None, tombstone]
    if sum(given) != 1:
        raise fail("give exactly one of --value, --value-file or --tombstone")
    data: bytes | None
    if value is not None:
        data = value.encode()
    elif value_file is not None:
        try:
            data = sys.stdin.buffer.read() if str(value_file) == "-" else value_file.read_bytes()
        except OSError as exc:
            raise fail(f"cannot read {value_file}: {exc.strerror}") from None
    else:
        data = None
    headers = _parse_headers(header or [])
    with Journal.open(path) as journal, journal.append() as tx:
        tx.write(key, data, headers=headers, namespace=namespace)
    what = "tombstone" if data is None else "record"
    typer.echo(f"appended 1 {what} at offset {tx.offsets.start} of {path}")


def record_json(rec: Record) -> dict[str, Any]:
    """The JSON shape of a record printed by ``read``: value as text, or base64 when not UTF-8."""
    out: dict[str, Any] = {"offset": rec.offset, "namespace": rec.namespace, "key": rec.key}
    if rec.value is None:
        out["value"] = None
    else:
        try:
            out["value"] = rec.value.decode()
        except UnicodeDecodeError:
            out["value"] = base64.b64encode(rec.value).decode()
            out["value_encoding"] = "base64"
    out["headers"] = [[k, v] for k, v in rec.headers]
    out["timestamp"] = rec.timestamp.isoformat()
    return out


def _table_row(rec: Record) -> list[str]:
    js = record_json(rec)
    value = "∅" if js["value"] is None else str(js["value"])
    if len(value) > 60:
        value = value[:57] + "..."
    if js.get("value_encoding"):
        value = f"(base64) {value}"
    headers = ", ".join(f"{k}={v}" for k, v in rec.headers)
    return [str(rec.offset), rec.namespace, rec.key, value, headers, js["timestamp"]]


_COLUMNS = ["offset", "namespace", "key", "value", "headers", "timestamp"]


@app.command()
@friendly_errors
def read(
    path: PathArg,
    from_offset: Annotated[int, typer.Option("--from", min=0, help="First offset to read.")] = 0,
    to_offset: Annotated[int | None, typer.Option("--to", min=0, help="Stop before this offset.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep waiting for new records.")] = False,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=0, help="With --follow: stop after this many idle seconds."),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="json (one object per line) or table.")] = "json",
) -> None:
    """Print committed records, one JSON object per line (or a table).

    Works while a writer is appending (it does not take the writer lock). A read that finds no
    record says why on stderr (past the end, an empty journal) and exits 0: an empty range is
    not an error. --to before --from is (exit 2).

    Example: sluice journal read ./j --from 10 --to 20 --format table
    """
    if fmt not in ("json", "table"):
        raise fail(f"--format must be json or table, got {fmt!r}")
    if to_offset is not None and to_offset < from_offset:
        raise fail(f"--to {to_offset} is before --from {from_offset}", code=2)
    with Journal.open(path, read_only=True) as journal:
        head = journal.head
        records = _counted(journal.read(from_offset, to_offset, follow=follow, timeout=timeout))
        try:
            if fmt == "json":
                for rec in records:
                    sys.stdout.write(json.dumps(record_json(rec), ensure_ascii=False) + "\n")
                    if follow:
                        sys.stdout.flush()
            elif follow:
                typer.echo("\t".join(_COLUMNS))
                for rec in records:
                    typer.echo("\t".join(_table_row(rec)))
            else:
                table = Table(*_COLUMNS)
                for rec in records:
                    table.add_row(*_table_row(rec))
                if records.count:
                    console.print(table)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except BrokenPipeError:
            raise typer.Exit(0) from None
        if not records.count and not follow:
            note(_why_empty(journal, from_offset, to_offset, head))


class _counted:
    """An iterator of records that counts what it gave."""

    def __init__(self, records: Iterator[Record]) -> None:
        self._records = records
        self.count = 0

    def __iter__(self) -> Iterator[Record]:
        for rec in self._records:
            self.count += 1
            yield rec


def _why_empty(journal: Journal, start: int, stop: int | None, head: int) -> str:
    """Why ``read`` found nothing in ``[start, stop)``, in one line."""
    if start > head:
        return f"no records: --from {start} is past the journal's end (next offset {head})"
    if head == 0:
        return "no records: the journal is empty"
    if start == head:
        return (
            f"no records: --from {start} is the journal's end (next offset {head}; --follow waits for more)"
        )
    if stop == start:
        return f"no records: --to {stop} is --from {start} (--to is the first offset not read)"
    first = journal.first_offset()
    if stop is not None and stop <= first:
        return (
            f"no records: --to {stop} is below the journal's first offset {first} "
            "(the records before it were released or expired)"
        )
    end = head if stop is None else min(stop, head)
    return (
        f"no records from offset {start} to {end - 1}: compaction kept none of them "
        "(it keeps each key's last)"
    )


@app.command()
@friendly_errors
def info(
    path: PathArg,
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
) -> None:
    """Show the head offset, segments and sizes, registers and named consumers.

    Example: sluice journal info ./j --format json
    """
    if fmt not in ("json", "table"):
        raise fail(f"--format must be json or table, got {fmt!r}")
    with Journal.open(path, read_only=True) as journal:
        segments = journal.segments()
        registers = journal.registers()
        consumers = journal.consumers()
        data: dict[str, Any] = {
            "path": str(path),
            "head": journal.head,
            "start": segments[0].base if segments else 0,
            "segments": [{"base": s.base, "bytes": s.size} for s in segments],
            "bytes": sum(s.size for s in segments),
            "registers": registers,
            "consumers": consumers,
        }
    if fmt == "json":
        typer.echo(json.dumps(data))
        return
    console.print(
        styled(
            (str(path), "bold"),
            "  head ",
            (str(data["head"]), "bold"),
            f"  start {data['start']}  {len(segments)} segment(s), {data['bytes']} bytes",
        ),
        highlight=False,
    )
    seg_table = Table("segment base", "bytes", title="segments")
    for s in segments:
        seg_table.add_row(str(s.base), str(s.size))
    console.print(seg_table)
    reg_table = Table("register", "value", title="registers")
    for name, text in sorted(registers.items()):
        reg_table.add_row(name, text)
    console.print(reg_table)
    con_table = Table("consumer", "offset", "lag", title="consumers")
    for consumer, offset in sorted(consumers.items()):
        con_table.add_row(consumer, str(offset), str(data["head"] - offset))
    console.print(con_table)


@app.command()
@friendly_errors
def compact(
    path: PathArg,
    horizon: Annotated[
        int | None,
        typer.Option(
            "--horizon", min=0, help="Also allow compacting below this offset (default: consumers only)."
        ),
    ] = None,
) -> None:
    """Apply retention and compact closed segments (latest record per key below the consumers' offsets).

    Needs the writer lock: run it when no writer is open, or call Journal.compact() in the writer.

    Example: sluice journal compact ./j
    """
    with Journal.open(path) as journal:
        result = journal.compact(horizon=horizon)
    if result.horizon == 0 and horizon is None:
        typer.echo("no named consumers have committed offsets: nothing is below the compaction horizon")
    typer.echo(
        f"horizon {result.horizon}: rewrote {result.segments_rewritten} segment(s), "
        f"removed {result.records_removed} record(s), {result.bytes_before - result.bytes_after} bytes; "
        f"retention removed {result.segments_expired} segment(s)"
    )
