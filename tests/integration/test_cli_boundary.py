"""``sluice``'s promise when something goes wrong: one line on stderr and a non-zero exit.

Every command is driven into an unexpected error (its callback made to raise) through the real
entry point, in this process; the rest runs ``sluice`` as its console script does, in a child
process whose own directory, not the current one, is first on ``sys.path``.
"""

from __future__ import annotations

import errno
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

import sluiceway
from sluiceway.cli import common
from sluiceway.cli.main import COMMANDS, app, reaper_args
from sluiceway.errors import ConfigError
from sluiceway.feed import Feed
from sluiceway.testing import wait_until
from tests.support import ROOT

# -- every command, in this process -------------------------------------------------------------


def command_paths(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command under ``command`` with its path (``("feed", "rate", "set")``), itself first."""
    yield path, command
    for name in command.list_commands(None) if hasattr(command, "commands") else ():
        yield from command_paths(command.get_command(None, name), (*path, name))


def runnable(command: Any) -> bool:
    """A command that does something when run: a leaf, or a group that runs without a sub-command."""
    return not hasattr(command, "commands") or bool(command.invoke_without_command)


ALL_PATHS = [path for path, _ in command_paths(typer.main.get_command(app))]
RUNNABLE = [path for path, command in command_paths(typer.main.get_command(app)) if runnable(command)]


def sabotaged(path: tuple[str, ...]) -> Any:
    """The root command with ``path``'s callback raising an error no one expects, and none of its
    parameters required (so that it gets as far as its callback with no arguments)."""
    root = typer.main.get_command(app)
    command = root
    for name in path:
        command = command.get_command(None, name)

    def boom(**_: object) -> None:
        try:
            raise OSError(errno.EACCES, "Permission denied", "/x/journal/0.log")
        except OSError as exc:
            raise RuntimeError(f"boom in {' '.join(path)}") from exc

    command.callback = boom
    for param in command.params:
        param.required = False
    return root


def run_in_process(root: Any, args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as ended:
        root.main(args=args, prog_name="sluice")
    return int(ended.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("path", RUNNABLE, ids=" ".join)
def test_an_unexpected_error_is_one_line_and_exit_1(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_in_process(sabotaged(path), list(path), capsys)
    assert code == 1
    assert err.splitlines() == [
        f"error: RuntimeError: boom in {' '.join(path)} "
        "(caused by PermissionError: [Errno 13] Permission denied: '/x/journal/0.log')"
    ]


@pytest.mark.parametrize("path", RUNNABLE, ids=" ".join)
def test_debug_adds_the_traceback(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_in_process(sabotaged(path), ["--debug", *path], capsys)
    assert code == 1
    lines = err.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert "PermissionError: [Errno 13] Permission denied: '/x/journal/0.log'" in lines
    assert lines[-1].startswith(f"error: RuntimeError: boom in {' '.join(path)} (caused by PermissionError")


def test_sluice_debug_in_the_environment_is_debug(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_DEBUG", "1")
    code, err = run_in_process(sabotaged(("journal", "info")), ["journal", "info"], capsys)
    assert code == 1 and err.startswith("Traceback (most recent call last):")


def test_debug_shows_what_is_behind_an_expected_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # friendly_errors already said it in one line; --debug adds where it came from.
    spec = tmp_path / "spec.yaml"
    spec.write_text("pipeline: {name: x}\n")
    root = typer.main.get_command(app)
    code, err = run_in_process(root, ["pipeline", "status", str(spec)], capsys)
    assert code == 1 and len(err.splitlines()) == 1 and err.startswith("error: ")
    code, debug_err = run_in_process(
        typer.main.get_command(app), ["--debug", "pipeline", "status", str(spec)], capsys
    )
    assert code == 1 and debug_err.startswith(err) and "Traceback (most recent call last):" in debug_err


# -- the one line ---------------------------------------------------------------------------------

PY4J_MESSAGE = (
    "An error occurred while calling o42.load.\n"
    ": java.io.FileNotFoundException: /data/in (No such file or directory)\n"
    "\tat java.base/java.io.FileInputStream.open0(Native Method)\n"
    "\tat org.apache.spark.sql.DataFrameReader.load(DataFrameReader.scala:185)\n"
    "\t... 12 more\n"
    "Caused by: java.lang.RuntimeException: deeper\n"
    "\tat x.Y.z(Y.java:1)\n"
)


class Py4JJavaError(Exception):
    pass


def raised(make: Any) -> BaseException:
    try:
        make()
    except BaseException as exc:
        return exc
    raise AssertionError("nothing raised")


def test_a_java_stack_trace_is_cut_and_the_rest_joined() -> None:
    def load() -> None:
        raise Py4JJavaError(PY4J_MESSAGE)

    assert common.one_line(raised(load)) == (
        "Py4JJavaError: An error occurred while calling o42.load. "
        "java.io.FileNotFoundException: /data/in (No such file or directory)"
    )


def test_a_python_traceback_in_a_message_is_cut() -> None:
    def worker() -> None:
        raise RuntimeError(
            "An exception was thrown from the Python worker.\nTraceback (most recent call last):\n"
            '  File "x.py", line 1\nValueError: bad'
        )

    assert common.one_line(raised(worker)) == "RuntimeError: An exception was thrown from the Python worker."


def test_causes_fold_in_once_and_say_how() -> None:
    def wrapped() -> None:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as exc:
            raise ConfigError(f"cannot reach the broker: {exc}") from exc

    # Our own error: no type; its cause already in its words: not said twice.
    assert common.one_line(raised(wrapped)) == "cannot reach the broker: [Errno 111] Connection refused"

    def while_handling() -> None:
        try:
            {}["missing"]
        except KeyError:
            raise ValueError("no default either")  # noqa: B904 - the implicit context is the point

    assert (
        common.one_line(raised(while_handling))
        == "ValueError: no default either (while handling KeyError: 'missing')"
    )


def test_a_message_that_cannot_be_read_is_its_type() -> None:
    class GatewayGone(Exception):
        def __str__(self) -> str:
            raise ConnectionError("the JVM is gone")

    def fail() -> None:
        raise GatewayGone()

    assert common.one_line(raised(fail)) == "GatewayGone"


# -- sluice as its console script runs it ---------------------------------------------------------


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``sluice`` and ``reaper`` as pip installs them: scripts in a directory of their own."""
    bin_dir = tmp_path_factory.mktemp("bin")
    for name, function in (("sluice", "main"), ("reaper", "reaper_main")):
        (bin_dir / name).write_text(
            f"import sys\nfrom sluiceway.cli.main import {function}\nsys.exit({function}())\n"
        )
    return bin_dir


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SLUICE_DEBUG", "SLUICE_LOG_LEVEL")}
    # This tree's code first, whatever the virtualenv was installed from (a git worktree).
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "COLUMNS": "200"}


def sluice(scripts: Path, *args: str, cwd: Path, script: str = "sluice") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(scripts / script), *args],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_append_where_a_journal_cannot_be_is_one_line(scripts: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    result = sluice(scripts, "journal", "append", "afile/journal", "--key", "k", "--value", "v", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr == "error: NotADirectoryError: [Errno 20] Not a directory: 'afile/journal'\n"


def test_append_to_a_read_only_directory_is_one_line(scripts: Path, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes to a read-only directory (the path-under-a-file test covers root)")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        result = sluice(
            scripts, "journal", "append", "locked/journal", "--key", "k", "--value", "v", cwd=tmp_path
        )
    finally:
        locked.chmod(0o700)
    assert result.returncode == 1
    assert result.stderr == "error: PermissionError: [Errno 13] Permission denied: 'locked/journal'\n"


def test_version(scripts: Path, tmp_path: Path) -> None:
    for script, flag in (("sluice", "--version"), ("sluice", "-V"), ("reaper", "--version")):
        result = sluice(scripts, flag, cwd=tmp_path, script=script)
        assert (result.returncode, result.stdout, result.stderr) == (
            0,
            f"sluice {sluiceway.__version__}\n",
            "",
        )


def test_reaper_takes_sluices_own_options_anywhere() -> None:
    assert reaper_args(["-f", "r.yaml", "--debug", "--log-level", "debug"]) == [
        "--debug", "--log-level", "debug", "reap", "-f", "r.yaml",
    ]  # fmt: skip
    assert reaper_args(["--log-level=info", "-f", "r.yaml"]) == ["--log-level=info", "reap", "-f", "r.yaml"]


HEAVY = ("pyspark", "confluent_kafka", "pydantic", "rich", "psycopg", "httpx", "pyarrow", "pandas", "uvicorn")


def test_help_lists_every_command_and_imports_none(scripts: Path, tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.write_text(
        "import atexit, sys\n"
        "atexit.register(lambda: print(' '.join(sorted(sys.modules)), file=sys.stderr))\n"
        f"sys.argv[0] = 'sluice'\nexec(open({str(scripts / 'sluice')!r}).read())\n"
    )
    result = subprocess.run(
        [sys.executable, str(probe), "--help"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    listed = result.stdout.split("Commands:\n", 1)[1]
    for name, entry in COMMANDS.items():
        assert f"  {name} " in listed and entry.summary in " ".join(listed.split()), name
    imported = set(result.stderr.split())
    assert not {m for m in imported if m.startswith("sluiceway.cli.") and m not in ("sluiceway.cli.main",)}
    assert not {m for m in imported if m.split(".")[0] in HEAVY}


def test_the_table_is_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    # The tree the tests above walk was read whole: nested commands, and groups that run alone.
    assert ("feed", "rate", "set") in RUNNABLE and ("outbox", "dead", "list") in RUNNABLE
    assert {(name,) for name in COMMANDS} - {("outbox",), ("journal",), ("pipeline",), ("feed",)} <= set(
        RUNNABLE
    )
    # Each summary is its command's own first paragraph, and every module of the CLI is listed.
    root = typer.main.get_command(app)
    for name, entry in COMMANDS.items():
        command = root.get_command(None, name)
        assert command.name == name
        assert " ".join((command.help or "").split("\n\n")[0].split()) == entry.summary, name
    modules = {p.stem for p in (ROOT / "src/sluiceway/cli").glob("*.py")} - {"__init__", "main", "common"}
    assert modules == {entry.module.rsplit(".", 1)[1] for entry in COMMANDS.values()}
    # And every command and sub-command still answers --help.
    for path in ALL_PATHS:
        with pytest.raises(SystemExit) as ended:
            typer.main.get_command(app).main(args=[*path, "--help"], prog_name="sluice")
        out = capsys.readouterr().out
        assert ended.value.code == 0 and out.startswith(f"Usage: {' '.join(['sluice', *path])} "), path


def _writer(fifo: Path) -> int | None:
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader yet
            return None
        raise


#: read(2)'s system call number, where we know it.
_READ_SYSCALL = {"x86_64": "0", "aarch64": "63"}.get(platform.machine())


def _blocked_in_read(pid: int) -> bool:
    """Whether the process sleeps in read(2), or (no /proc, another machine) it cannot be told."""
    try:
        call = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return True
    return _READ_SYSCALL is None or (bool(call) and call[0] == _READ_SYSCALL)


def test_ctrl_c_is_one_line_and_exit_130(scripts: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "value"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(scripts / "sluice"),
            "journal",
            "append",
            "j",
            "--key",
            "k",
            "--value-file",
            str(fifo),
        ],
        cwd=tmp_path,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C raises KeyboardInterrupt in the child even where this process was started ignoring it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    writer = None
    try:
        # The writer's end opens once the command holds the reader's: it is then in (or at) its read.
        writer = wait_until(lambda: _writer(fifo), timeout=60, message="sluice reading the value")
        # In the read itself, not just before it: a signal that lands between Python's check for
        # signals and the system call is only seen when the call returns (CPython's own race).
        wait_until(lambda: _blocked_in_read(proc.pid), timeout=60, message="sluice blocked in read")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if writer is not None:
            os.close(writer)
        proc.kill()
        proc.wait()
    assert (proc.returncode, out, err) == (130, "", "interrupted\n")


@pytest.fixture
def feed_dir(tmp_path: Path) -> Path:
    """A directory holding a feed with one item, and ``myproc.py``, a processor that logs."""
    (tmp_path / "myproc.py").write_text(
        "import logging\n\n"
        "def process(item):\n"
        "    logging.getLogger('myproc').debug('processing item %s', item.id)\n"
        "    return {'done': True}\n"
    )
    with Feed(f"sqlite:///{tmp_path / 'w.db'}") as feed:
        feed.add("p", [b"a"])
    return tmp_path


WORKER = ("feed", "worker", "--dsn", "sqlite:///w.db", "--until-idle", "--poll-interval", "0.05")


def test_a_processor_in_the_current_directory_imports(scripts: Path, feed_dir: Path) -> None:
    result = sluice(scripts, *WORKER, "--processor", "myproc:process", cwd=feed_dir)
    assert result.returncode == 0, result.stderr
    assert "1 completed, 0 failed" in result.stdout
    assert "processing item" not in result.stderr  # INFO: the processor's debug line is not shown


def test_a_processor_that_cannot_be_imported_says_how_to_fix_it(scripts: Path, feed_dir: Path) -> None:
    result = sluice(scripts, *WORKER, "--processor", "elsewhere.ocr:process", cwd=feed_dir)
    assert result.returncode == 1
    assert result.stderr == (
        "error: processor: cannot import processor module 'elsewhere.ocr': No module named 'elsewhere' "
        "(run from the directory that holds it, or add that directory to PYTHONPATH)\n"
    )
    # A module that is there but lacks what it imports: the missing dependency is named, no hint.
    (feed_dir / "needs.py").write_text("import no_such_dependency\n")
    result = sluice(scripts, *WORKER, "--processor", "needs:process", cwd=feed_dir)
    assert result.returncode == 1
    assert result.stderr == (
        "error: processor: cannot import processor module 'needs': No module named 'no_such_dependency'\n"
    )


def test_log_level_on_the_root_reaches_a_long_running_command(scripts: Path, feed_dir: Path) -> None:
    result = sluice(scripts, "--log-level", "debug", *WORKER, "--processor", "myproc:process", cwd=feed_dir)
    assert result.returncode == 0, result.stderr
    assert "DEBUG   myproc: processing item 1" in result.stderr
    # The command's own --log-level, where it has one, wins.
    with Feed(f"sqlite:///{feed_dir / 'w.db'}") as feed:
        feed.add("q", [b"b"])
    own = ("--log-level", "debug", "--processor", "myproc:process")
    result = sluice(scripts, "--log-level", "error", *WORKER, *own, cwd=feed_dir)
    assert "DEBUG   myproc: processing item 2" in result.stderr
