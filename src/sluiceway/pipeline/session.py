"""Building the SparkSession the pipeline runs on (classic local/cluster or Spark Connect)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Data source options whose values Spark masks wherever it shows a plan (the UI's SQL tab, the
#: event log, ``explain``): our sources take their DSN as ``dsn`` and broker URLs as ``url`` or
#: ``servers``, and Spark's own pattern (``spark.redaction.regex``: password, secret, token) adds
#: Kafka's ``kafka.sasl.password``.
REDACTED_OPTIONS = "(?i)url|dsn|servers|password|secret|token"


def session_settings(
    master: str = "local[*]", *, warehouse: str | None = None, conf: dict[str, str] | None = None
) -> dict[str, str]:
    """The Spark settings :func:`build_session` gives a session for ``master`` (``conf`` last, so
    a pipeline spec's ``spark:`` mapping wins).

    >>> session_settings("local[2]")["spark.ui.enabled"]
    'false'
    >>> session_settings("sc://spark:15002", conf={"spark.sql.shuffle.partitions": "8"})
    {'spark.sql.shuffle.partitions': '8'}
    """
    settings: dict[str, str] = {}
    if not master.startswith("sc://"):
        settings = {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.sql.session.timeZone": "UTC",
            # Parquet sinks written by Spark: timestamps as microseconds, not the legacy INT96.
            "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
            "spark.driver.memory": "2g",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.python.worker.reuse": "true",
            # Masks our sources' DSNs and URLs in every plan Spark shows (its UI, explain, event logs).
            "spark.sql.redaction.options.regex": REDACTED_OPTIONS,
        }
        if warehouse:
            settings["spark.sql.warehouse.dir"] = warehouse
    if master.startswith("local"):
        # Spark's errors, not its task-failure traces (log4j2-quiet.properties). In the driver
        # JVM's *default* options, which Spark puts before `spark.driver.extraJavaOptions`: a
        # spec's own JVM options (-Xms, a heap dump on OOM…) are added to them, not dropped.
        log4j = Path(__file__).with_name("log4j2-quiet.properties")
        settings["spark.driver.defaultJavaOptions"] = f'"-Dlog4j.configurationFile=file:{log4j}"'
    settings.update(conf or {})
    return settings


def build_session(
    master: str = "local[*]",
    *,
    app_name: str = "sluiceway",
    warehouse: str | None = None,
    conf: dict[str, str] | None = None,
) -> Any:
    """Create (or get) a SparkSession for ``master``: ``local[*]``, ``spark://…`` or ``sc://…``.

    ``PYSPARK_PYTHON`` is pinned to this interpreter so Python workers find the same packages.
    ``conf``: extra Spark settings (a pipeline spec's ``spark:`` mapping).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # A local session listens on loopback only (and logs warnings rather than Spark's
        # chatter: session_settings).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Its Python workers import PySpark's cached bytecode rather than compiling Spark's zip
        # of it (workersite/sitecustomize.py): they inherit the driver JVM's PYTHONPATH.
        site = str(Path(__file__).with_name("workersite"))
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if site not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([site, *paths])
    from pyspark.sql import SparkSession

    builder: Any = SparkSession.builder.appName(app_name)
    if master.startswith("sc://"):
        # The Connect client's own builder: it works even where a classic session already runs
        # in this process (the generic builder refuses to mix the two).
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        builder = ConnectSession.builder.appName(app_name).remote(master)
    else:
        builder = builder.master(master)
    for key, value in session_settings(master, warehouse=warehouse, conf=conf).items():
        builder = builder.config(key, value)
    from pyspark import SparkContext

    launching = not master.startswith("sc://") and SparkContext._active_spark_context is None
    before = _children() if launching else set()
    try:
        with _jvm_start_up_quiet() if launching else contextlib.nullcontext():
            session = builder.getOrCreate()
    except BaseException:
        # Interrupted (Ctrl-C) or failed while the JVM starts: PySpark leaves the JVM it launched
        # running (its gateway waits for a driver that is gone), an orphan for good. Not ours.
        for pid in _children() - before:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        raise
    if not master.startswith("sc://"):
        session.sparkContext.setLogLevel("ERROR")
    _quiet_query_context_loggers()
    return session


def _children() -> set[int]:
    """This process's child processes (Linux's /proc; none known elsewhere)."""
    me, found = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid …": comm may hold spaces and parentheses; ppid follows the last ")".
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == me:
            found.add(int(stat.parent.name))
    return found


#: What the JVM prints on stderr as every local session starts, that reads like trouble and is
#: none: the JDK's notice that Spark uses an incubating module, and Spark's shell-style hint
#: about log levels (we set them: session_settings, log4j2-quiet.properties).
_START_UP_NOISE = (
    b"WARNING: Using incubator modules:",
    b'Setting default log level to "',
    b"To adjust logging level use sc.setLogLevel(",
)


@contextlib.contextmanager
def _jvm_start_up_quiet() -> Iterator[None]:
    """Launch the JVM with its stderr through a filter that drops :data:`_START_UP_NOISE` and
    passes every other line on, for as long as the JVM lives (its errors still reach the user).

    The JVM inherits file descriptor 2 from this process when PySpark starts it: for that moment
    only, descriptor 2 is a pipe; ours is given back at once, and a thread copies the pipe's
    lines to it."""
    try:
        target = os.dup(2)
    except OSError:  # no stderr to speak of
        yield
        return
    read_end, write_end = os.pipe()
    threading.Thread(target=_forward, args=(read_end, target), name="sluice-jvm-stderr", daemon=True).start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        os.dup2(target, 2)  # ours again; the JVM (and its Python workers) keep the pipe


def _forward(read_end: int, target: int) -> None:
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        for line in iter(pipe.readline, b""):
            if not line.startswith(_START_UP_NOISE):
                with contextlib.suppress(OSError):
                    os.write(target, line)
    with contextlib.suppress(OSError):
        os.close(target)


def _quiet_query_context_loggers() -> None:
    """PySpark logs every analysis error it raises, as one JSON line of many kilobytes (the whole
    message and the query's text) on stderr, before the caller has said a word. We say the error
    once, in one line (:func:`sluiceway.pipeline.errors.explain`): those loggers are silenced."""
    import logging

    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL + 1)
