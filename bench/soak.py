"""The soak: all four parts running together at a steady offered load, every record accounted for.

    python bench/soak.py --minutes 30                 # the figures in docs/benchmarks.md
    python bench/soak.py --minutes 1 --sample 5       # what `make test` runs (tests/integration/test_soak.py)

What runs, each as the CLI a user would start, on a scratch PostgreSQL database:

* a producer (this process) stashing ``--rate`` outbox records a second over ``--keys`` keys, in
  transactions of a tenth of a second's worth, each record's value carrying its number ``n``;
* ``sluice reap``: the harvester with the database lease, outbox → journal;
* ``sluice pipeline run``: a continuous pipeline, journal → Parquet + PostgreSQL (upsert by key);
* two ``sluice feed worker`` processes working a feed that gets ``--feed-rate`` items a second
  (one partition a second).

Every ``--sample`` seconds: the resident memory, open file descriptors and threads of every
process (the pipeline as its Python driver, its JVM and its Python workers, these summed as proportional
set sizes: they are forks sharing pages), and the backlogs
(outbox rows, journal records the pipeline has not written, feed items not complete). At the end
the producer stops, everything drains, and the records are counted:

* journal: every ``n`` stashed is there (repeats allowed: at-least-once), each key in order;
* Parquet: every ``n`` once or more; PostgreSQL: each key holds its last ``n``;
* feed: every item added is complete, none failed.

The memory slope of each process (least squares over the samples after ``--warmup``, MB per 10
minutes) and the fd/thread ranges are reported; the process exits 1 if anything is unaccounted for.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, scratch_postgres
from sluiceway import OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.feed import Feed
from sluiceway.journal import Journal
from sluiceway.outbox import init_outbox

ROOT = Path(__file__).resolve().parent.parent
SLUICE = str(Path(sys.executable).with_name("sluice"))
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


# -- the parts, as processes -------------------------------------------------------------------
def write_configs(
    work: Path, dsn: str, trigger: str, driver_memory: str | None, jvm_options: str | None
) -> tuple[Path, Path]:
    reaper = work / "reaper.yaml"
    reaper.write_text(
        yaml.safe_dump(
            {
                "harvest": {
                    "dataSource": dsn,
                    "journal": {"path": str(work / "journal")},
                    "election": {"kind": "database", "leaseTimeout": "10s"},
                    "limits": {"minMetricsInterval": "60s"},
                }
            }
        )
    )
    spark = {
        **({"spark.driver.memory": driver_memory} if driver_memory else {}),
        **({"spark.driver.extraJavaOptions": jvm_options} if jvm_options else {}),
    }
    spec = work / "pipeline.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "pipeline": {
                    "name": "soak",
                    "source": {"type": "journal", "path": str(work / "journal")},
                    "sinks": [
                        {"name": "lake", "type": "parquet", "path": str(work / "lake")},
                        {"name": "db", "type": "postgres", "dsn": dsn, "table": "soak_view", "key": "key"},
                    ],
                    "checkpoint": str(work / "checkpoints"),
                    "trigger": {"interval": trigger},
                    **({"spark": spark} if spark else {}),
                }
            }
        )
    )
    return reaper, spec


def start(name: str, args: list[str], work: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    log = (work / f"{name}.log").open("wb")
    # Its own process group: a pipeline's JVM and Python workers go with it when it is stopped.
    return subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True
    )


def stop(procs: dict[str, subprocess.Popen[bytes]]) -> dict[str, int | None]:
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    codes: dict[str, int | None] = {}
    deadline = time.monotonic() + 60
    for name, p in procs.items():
        try:
            codes[name] = p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes[name] = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # whatever is left of its group
        if codes[name] is None:
            codes[name] = p.wait()
    return codes


# -- the producer ------------------------------------------------------------------------------
class Producer(threading.Thread):
    """``rate`` outbox records a second (ten transactions), and ``feed_rate`` feed items a second
    (one partition each second), until stopped. ``last[key]`` is the last ``n`` stashed per key."""

    def __init__(self, dsn: str, rate: int, feed_rate: int, keys: int) -> None:
        super().__init__(daemon=True, name="producer")
        self.dsn, self.rate, self.feed_rate, self.keys = dsn, rate, feed_rate, keys
        self.stashed = 0
        self.items = 0
        self.last: dict[str, int] = {}
        self.behind = 0.0  # the most the producer fell behind its schedule (s)
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported at the end: the soak fails
            self.error = exc

    def _run(self) -> None:
        per_tick = max(1, self.rate // 10)
        with psycopg.connect(self.dsn) as conn, Feed(self.dsn, migrate=False) as feed:
            stash = Stasher().prepare(conn)
            t0 = time.monotonic()
            tick = 0
            while not self.stopping.is_set():
                tick_last: dict[str, int] = {}
                for i in range(per_tick):
                    n = self.stashed + i
                    key = f"k{n % self.keys}"
                    stash.stash(OutboxRecord("orders", key, json.dumps({"n": n})))
                    tick_last[key] = n
                conn.commit()  # counted once committed
                self.stashed += per_tick
                self.last.update(tick_last)
                if tick % 10 == 0 and self.feed_rate:
                    feed.add(f"p{tick // 10}", [{"i": i} for i in range(self.feed_rate)])
                    self.items += self.feed_rate
                tick += 1
                late = time.monotonic() - (t0 + tick * 0.1)
                self.behind = max(self.behind, late)
                if late < 0:
                    self.stopping.wait(-late)


def process_item(item: Any) -> dict[str, bool]:
    """The feed workers' processor (``bench.soak:process_item``)."""
    return {"done": True}


# -- sampling ----------------------------------------------------------------------------------
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids[ppid].append(int(entry))
    return kids


def _tree(pid: int, kids: dict[int, list[int]]) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _usage(pid: int) -> tuple[float, int, int] | None:
    """(RSS MB, open fds, threads) of one process, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
        threads = len(os.listdir(f"/proc/{pid}/task"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return int(fields[1]) * PAGE_KB / 1024, fds, threads


def _pss_mb(pid: int) -> float:
    """Proportional set size (MB): forked workers share pages, and their RSS summed counts those
    pages once per worker."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _is_jvm(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "java"
    except OSError:
        return False


def sample(procs: dict[str, subprocess.Popen[bytes]]) -> dict[str, tuple[float, int, int]]:
    """Per role: the process itself; the pipeline also as its JVM and its Python workers (summed)."""
    kids = _children()
    out: dict[str, tuple[float, int, int]] = {}
    me = _usage(os.getpid())
    if me:
        out["producer (this)"] = me
    for name, p in procs.items():
        if name != "pipeline":
            got = _usage(p.pid)
            if got:
                out[name] = got
            continue
        driver = _usage(p.pid)
        if driver:
            out["pipeline driver"] = driver
        workers = [0.0, 0, 0]
        for pid in _tree(p.pid, kids)[1:]:
            got = _usage(pid)
            if got is None:
                continue
            if _is_jvm(pid):
                out["pipeline JVM"] = got
            else:
                workers = [workers[0] + _pss_mb(pid), workers[1] + got[1], workers[2] + got[2]]
        out["pipeline workers (PSS)"] = (workers[0], int(workers[1]), int(workers[2]))
    return out


def pipeline_jvm(proc: subprocess.Popen[bytes]) -> int | None:
    """The pid of the pipeline's JVM (a child of its Python driver), if it is up."""
    return next((pid for pid in _tree(proc.pid, _children())[1:] if _is_jvm(pid)), None)


_NMT_LINE = re.compile(r"^-\s+(?P<what>[\w ]+?) \(reserved=\d+KB, committed=(?P<kb>\d+)KB[,)]")


def jvm_native(pid: int) -> dict[str, float]:
    """The JVM's own account of its committed memory (MB) per category — Java Heap, Class,
    Thread, Code, GC, Internal, Other... — when it runs with ``-XX:NativeMemoryTracking=summary``;
    empty otherwise."""
    try:
        text = subprocess.run(
            ["jcmd", str(pid), "VM.native_memory", "summary"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _NMT_LINE.match(line.strip())
        if m:
            out[m["what"]] = int(m["kb"]) / 1024
    return out


def backlog(db: Database, journal: Path, feed_prefix: str = "feed_") -> dict[str, int]:
    outbox = db.fetchone("SELECT count(*) FROM outbox")
    try:
        head = Journal.head_offset(journal)
    except Exception:  # the harvester creates the journal as it starts
        head = 0
    try:
        written = db.fetchone('SELECT coalesce(max("offset"), -1) FROM soak_view')
    except Exception:  # the sink creates its table with its first batch
        written = (-1,)
    items = db.fetchone(f"SELECT count(*) FROM {feed_prefix}items WHERE status <> 'complete'")
    return {
        "outbox": int(outbox[0]) if outbox else -1,
        "pipeline": max(0, head - 1 - int(written[0])) if written else -1,
        "feed": int(items[0]) if items else -1,
    }


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB), in MB per 10 minutes."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mx) * (v - my) for t, v in points) / var * 600.0


# -- the accounting ----------------------------------------------------------------------------
def account(work: Path, db: Database, producer: Producer) -> dict[str, Any]:
    import pyarrow.dataset as ds

    total = producer.stashed
    problems: list[str] = []
    seen: dict[str, list[int]] = defaultdict(list)
    journal_records = 0
    with Journal.open(work / "journal", read_only=True) as journal:
        for r in journal.read():
            journal_records += 1
            seen[str(r.key)].append(json.loads(r.value or b"{}")["n"])
    got = {n for ns in seen.values() for n in ns}
    if got != set(range(total)):
        problems.append(f"journal: {len(set(range(total)) - got)} records missing")
    for key, ns in seen.items():
        collapsed = [n for i, n in enumerate(ns) if i == 0 or n != ns[i - 1]]
        if collapsed != sorted(set(ns)):
            problems.append(f"journal: key {key} out of order")
            break

    table = ds.dataset(str(work / "lake"), format="parquet").to_table(columns=["value"])
    lake = [json.loads(v)["n"] for v in table.column("value").to_pylist()]
    if set(lake) != set(range(total)):
        problems.append(f"parquet: {len(set(range(total)) - set(lake))} records missing")

    rows = db.fetchall("SELECT key, value FROM soak_view")
    mirror = {str(k): (json.loads(v) if isinstance(v, str | bytes) else v)["n"] for k, v in rows}
    if mirror != producer.last:
        wrong = sum(1 for k, n in producer.last.items() if mirror.get(k) != n)
        problems.append(f"postgres sink: {wrong} of {len(producer.last)} keys not at their last record")

    done = db.fetchone("SELECT count(*) FROM feed_items WHERE status = 'complete'")
    failed = db.fetchone("SELECT count(*) FROM feed_items WHERE status = 'failed'")
    complete = int(done[0]) if done else -1
    if complete != producer.items or (failed and failed[0]):
        problems.append(
            f"feed: {complete} of {producer.items} items complete, {failed[0] if failed else '?'} failed"
        )
    return {
        "stashed": total,
        "journal_records": journal_records,
        "journal_repeats": journal_records - len(got),
        "parquet_rows": len(lake),
        "postgres_keys": len(mirror),
        "feed_items": producer.items,
        "feed_complete": complete,
        "problems": problems,
    }


def error_lines(work: Path) -> list[str]:
    """The ERROR lines of the parts' logs (a stopped sink says why in one)."""
    return [
        f"{log.stem}: {line.strip()}"
        for log in sorted(work.glob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if " ERROR " in line
    ]


def drained(db: Database, work: Path, producer: Producer) -> bool:
    import pyarrow.dataset as ds

    b = backlog(db, work / "journal")
    if b["outbox"] or b["feed"] or b["pipeline"]:
        return False
    if Journal.head_offset(work / "journal") < producer.stashed:
        return False
    # The Parquet sink is a query of its own: it may be a batch behind the PostgreSQL one.
    return bool(ds.dataset(str(work / "lake"), format="parquet").count_rows() >= producer.stashed)


# -- the run -----------------------------------------------------------------------------------
def soak(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="sluice-soak-"))
    with scratch_postgres("sluice_soak") as dsn:
        with Database(dsn) as db:
            init_outbox(db)
        Feed(dsn).close()  # the feed's tables
        reaper, spec = write_configs(work, dsn, args.trigger, args.driver_memory, args.jvm_options)
        Journal.open(work / "journal").close()  # the pipeline's source must exist before it starts
        procs: dict[str, subprocess.Popen[bytes]] = {}
        producer = Producer(dsn, args.rate, args.feed_rate, args.keys)
        samples: list[tuple[float, dict[str, tuple[float, int, int]], dict[str, int]]] = []
        native: list[tuple[float, dict[str, float]]] = []  # the JVM's NMT summary per sample
        tracking = "NativeMemoryTracking" in (args.jvm_options or "")
        worst: dict[str, int] = defaultdict(int)
        codes: dict[str, int | None] = {}
        db = Database(dsn)
        try:
            procs["harvester"] = start("harvester", [SLUICE, "reap", "-f", str(reaper)], work)
            procs["pipeline"] = start(
                "pipeline", [SLUICE, "pipeline", "run", str(spec), "--master", "local[2]"], work
            )
            for i in (1, 2):
                procs[f"feed worker {i}"] = start(
                    f"feed-worker-{i}",
                    [SLUICE, "feed", "worker", "--dsn", dsn, "--processor", "bench.soak:process_item",
                     "--concurrency", "2"],
                    work,
                )  # fmt: skip
            producer.start()
            t0 = time.monotonic()
            end = t0 + args.minutes * 60
            next_sample = t0
            while time.monotonic() < end:
                dead = [name for name, p in procs.items() if p.poll() is not None]
                if dead or producer.error:
                    raise RuntimeError(f"stopped early: {dead or producer.error} (logs in {work})")
                if time.monotonic() >= next_sample:
                    now = time.monotonic() - t0
                    b = backlog(db, work / "journal")
                    for k, v in b.items():
                        worst[k] = max(worst[k], v)
                    samples.append((now, sample(procs), b))
                    jvm = pipeline_jvm(procs["pipeline"]) if tracking else None
                    if jvm is not None:
                        native.append((now, jvm_native(jvm)))
                        if len(native) == 1 and not native[0][1]:
                            print("soak: no native memory account from jcmd (is jcmd here?)", file=sys.stderr)
                    print(
                        f"{now / 60:5.1f} min  stashed {producer.stashed:>8}  backlog {b}  "
                        + "  ".join(f"{k} {v[0]:.0f}MB" for k, v in samples[-1][1].items()),
                        flush=True,
                    )
                    next_sample += args.sample
                time.sleep(0.5)
            producer.stopping.set()
            producer.join(30)
            if producer.is_alive():
                raise RuntimeError("the producer did not stop within 30 s")
            drain_start = time.monotonic()
            stuck: str | None = None
            while not drained(db, work, producer):
                dead = [name for name, p in procs.items() if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"stopped while draining: {dead} (logs in {work})")
                if time.monotonic() - drain_start > args.drain_timeout:
                    # Still a report: the samples are what the run was for, and the accounting
                    # says what is missing where; the parts' own error lines say why.
                    stuck = f"not drained after {args.drain_timeout:.0f}s: {backlog(db, work / 'journal')}"
                    break
                time.sleep(1)
            drain_seconds = time.monotonic() - drain_start
            codes = stop(procs)
            result = account(work, db, producer)
            if stuck is not None:
                result["problems"] += [stuck, *error_lines(work)]
        finally:
            producer.stopping.set()
            if procs and not codes:
                codes = stop(procs)
            db.close()
    if producer.error:
        result["problems"].append(f"producer: {producer.error}")
    bad_exit = {k: v for k, v in codes.items() if v not in (0, -signal.SIGTERM)}
    if bad_exit:
        result["problems"].append(f"exit codes {bad_exit}")

    warm = args.warmup * 60 if args.warmup is not None else args.minutes * 60 / 6
    after = [(t, s) for t, s, _ in samples if t >= warm] or [(t, s) for t, s, _ in samples]
    roles = sorted({role for _, s in after for role in s})
    r = result
    rows: list[tuple[str, str]] = [
        ("minutes, offered load", f"{args.minutes:g}, {args.rate} rec/s + {args.feed_rate} items/s"),
        (
            "records stashed / in journal (repeats)",
            f"{r['stashed']:,} / {r['journal_records']:,} ({r['journal_repeats']})",
        ),
        ("parquet rows; postgres keys", f"{r['parquet_rows']:,}; {r['postgres_keys']}"),
        ("feed items added / complete", f"{r['feed_items']:,} / {r['feed_complete']:,}"),
        ("worst backlog: outbox, pipeline, feed", f"{worst['outbox']}, {worst['pipeline']}, {worst['feed']}"),
        ("drain after the producer stopped", f"{drain_seconds:.1f}s"),
        ("producer behind schedule (max)", f"{producer.behind:.2f}s"),
    ]
    slopes: dict[str, dict[str, Any]] = {}
    for role in roles:
        series = [(t, s[role]) for t, s in after if role in s]
        mb = [v[0] for _, v in series]
        slopes[role] = {
            "rss_mb": [round(min(mb), 1), round(max(mb), 1)],
            "mb_per_10min": round(slope([(t, v[0]) for t, v in series]), 2),
            "fds": [min(v[1] for _, v in series), max(v[1] for _, v in series)],
            "threads": [min(v[2] for _, v in series), max(v[2] for _, v in series)],
            # Every sample after the warm-up: minute, RSS MB, fds, threads (to see steps, not
            # only a slope: a JVM's heap grows in steps as it expands towards its maximum).
            "samples": [[round(t / 60, 1), round(v[0], 1), v[1], v[2]] for t, v in series],
        }
        s = slopes[role]
        rows.append(
            (
                role,
                f"RSS {s['rss_mb'][0]:.0f} to {s['rss_mb'][1]:.0f} MB, {s['mb_per_10min']:+.2f} MB/10 min; "
                f"fds {s['fds'][0]} to {s['fds'][1]}; threads {s['threads'][0]} to {s['threads'][1]}",
            )
        )
    jvm_parts: dict[str, dict[str, Any]] = {}
    native_after = [(t, n) for t, n in native if t >= warm and n]
    for what in sorted({w for _, n in native_after for w in n}):
        part = [(t, n[what]) for t, n in native_after if what in n]
        jvm_parts[what] = {
            "mb": [round(min(v for _, v in part), 1), round(max(v for _, v in part), 1)],
            "mb_per_10min": round(slope(part), 2),
        }
    growing = sorted(jvm_parts.items(), key=lambda kv: -abs(kv[1]["mb_per_10min"]))[:6]
    if growing:
        rows.append(
            (
                "pipeline JVM, committed by part (NMT)",
                "; ".join(f"{k} {v['mb'][1]:.0f} MB {v['mb_per_10min']:+.2f}" for k, v in growing),
            )
        )
    for problem in result["problems"]:
        rows.append(("PROBLEM", problem))
    report(
        f"soak: {args.minutes:g} min, samples after {warm / 60:.1f} min of warm-up",
        rows,
        {
            "bench": "soak",
            **result,
            "worst_backlog": dict(worst),
            "drain_s": round(drain_seconds, 1),
            "processes": slopes,
            **({"jvm_native": jvm_parts} if jvm_parts else {}),
        },
    )
    if result["problems"]:
        print(f"logs kept in {work}", file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=200, help="outbox records a second")
    parser.add_argument("--feed-rate", type=int, default=20, help="feed items a second")
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=None, help="minutes (default: a sixth of the run)")
    parser.add_argument("--trigger", default="2s", help="the pipeline's micro-batch interval")
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    parser.add_argument("--driver-memory", help="the pipeline's spark.driver.memory (its JVM's heap)")
    parser.add_argument(
        "--jvm-options",
        help="the pipeline JVM's spark.driver.extraJavaOptions; with -XX:NativeMemoryTracking=summary "
        "each sample also reads the JVM's own account of its memory (jcmd VM.native_memory)",
    )
    return soak(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
