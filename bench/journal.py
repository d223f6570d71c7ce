"""Journal throughput against this machine's raw ceiling, measured in the same run.

    .venv/bin/python bench/journal.py [--dir DIR] [--records N]

* (a) batched appends: 100-byte values, 1,000 records per append, each append durable, vs a raw
  loop that ``write``s the same 100,000 payload bytes and ``fdatasync``s, batch after batch.
  Measured with ``tx.write_many`` (the bulk call, the headline ratio) and with a ``tx.write``
  per record;
* (b) group commit: 16 threads appending one record per append, vs a raw loop of one
  ``write`` + ``fdatasync`` per record;
* (c) sequential reads of N records (default 1,000,000): the record iterator, ``read_arrow``,
  and — for scale — pyarrow's Parquet reader on the same records from a Parquet file.

The machine is shared and noisy, so the raw and journal measures run in interleaved rounds,
back to back; each ratio is the median of the per-round ratios (both sides of a round see the
same load), and each rate the median over rounds. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import report
from sluiceway.journal import Journal

VALUE = bytes(range(100))
BATCH = 1000
BATCHES = 150
THREADS = 16
PER_THREAD = 150


def rounds(runs: int, *fns: Callable[[], float]) -> list[list[float]]:
    """Run the measures interleaved, ``runs`` rounds; the rates of each measure, round by round."""
    results: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for i, fn in enumerate(fns):
            results[i].append(fn())
    return results


def median_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


# --- (a) batched appends --------------------------------------------------------------------
def raw_batched(directory: str, size: int = len(VALUE) * BATCH) -> float:
    path = os.path.join(directory, "raw-batched")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    payload = bytes(size)
    try:
        start = time.perf_counter()
        for _ in range(BATCHES):
            os.write(fd, payload)
            os.fdatasync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)
    return BATCHES * BATCH / elapsed


def disk_bytes_per_append(directory: str) -> int:
    """What one 1,000-record append adds to the segment file: records, their lengths, the BATCH header."""
    with tempfile.TemporaryDirectory(dir=directory) as d, Journal.open(d) as j:
        before = j.segments()[-1].size
        with j.append() as tx:
            tx.write_many([(f"key-{i:06d}", VALUE) for i in range(BATCH)])
        return j.segments()[-1].size - before


def journal_batched(directory: str, bulk: bool) -> float:
    with tempfile.TemporaryDirectory(dir=directory) as d, Journal.open(d) as j:
        records = [(f"key-{i:06d}", VALUE) for i in range(BATCH)]
        start = time.perf_counter()
        for _ in range(BATCHES):
            with j.append() as tx:
                if bulk:
                    tx.write_many(records)
                else:
                    for key, value in records:
                        tx.write(key, value)
        elapsed = time.perf_counter() - start
        assert j.head == BATCHES * BATCH
    return BATCHES * BATCH / elapsed


# --- (b) group commit -----------------------------------------------------------------------
def raw_per_record(directory: str) -> float:
    path = os.path.join(directory, "raw-single")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    n = THREADS * PER_THREAD // 2
    try:
        start = time.perf_counter()
        for _ in range(n):
            os.write(fd, VALUE)
            os.fdatasync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)
    return n / elapsed


def journal_group_commit(directory: str) -> float:
    with tempfile.TemporaryDirectory(dir=directory) as d, Journal.open(d) as j:
        barrier = threading.Barrier(THREADS + 1)

        def worker(n: int) -> None:
            key = f"thread-{n}"
            barrier.wait()
            for _ in range(PER_THREAD):
                with j.append() as tx:
                    tx.write(key, VALUE)

        pool = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
        for t in pool:
            t.start()
        barrier.wait()
        start = time.perf_counter()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - start
        assert j.head == THREADS * PER_THREAD
    return THREADS * PER_THREAD / elapsed


# --- (c) reads ------------------------------------------------------------------------------
def build_read_journal(directory: str, records: int) -> str:
    path = os.path.join(directory, "read-journal")
    with Journal.open(path, fsync=False) as j:
        for start in range(0, records, BATCH):
            with j.append() as tx:
                for i in range(start, min(records, start + BATCH)):
                    tx.write(f"key-{i % 50_000:06d}", VALUE, namespace="orders")
    return path


def read_iter(path: str, records: int) -> float:
    with Journal.open(path, read_only=True) as j:
        start = time.perf_counter()
        n = sum(1 for _ in j.read())
        elapsed = time.perf_counter() - start
    assert n == records
    return n / elapsed


def read_arrow(path: str, records: int) -> float:
    with Journal.open(path, read_only=True) as j:
        start = time.perf_counter()
        n = sum(rb.num_rows for rb in j.read_arrow())
        elapsed = time.perf_counter() - start
    assert n == records
    return n / elapsed


def build_parquet(path: str, directory: str) -> str:
    out = os.path.join(directory, "records.parquet")
    with Journal.open(path, read_only=True) as j:
        table = pa.Table.from_batches(list(j.read_arrow()))
    pq.write_table(table, out, row_group_size=65536)
    return out


def read_parquet(path: str, records: int) -> float:
    start = time.perf_counter()
    n = sum(rb.num_rows for rb in pq.ParquetFile(path).iter_batches(batch_size=65536))
    elapsed = time.perf_counter() - start
    assert n == records
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to put the scratch files (default: system temp)")
    parser.add_argument("--records", type=int, default=1_000_000, help="records for the read measures")
    parser.add_argument("--runs", type=int, default=7, help="interleaved rounds per write measure")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="sluice-bench-journal-") as scratch:
        disk = disk_bytes_per_append(scratch)
        raw_b_r, raw_d_r, jou_b_r, jou_w_r = rounds(
            args.runs,
            lambda: raw_batched(scratch),
            lambda: raw_batched(scratch, disk),
            lambda: journal_batched(scratch, bulk=True),
            lambda: journal_batched(scratch, bulk=False),
        )
        raw_1_r, jou_g_r = rounds(
            args.runs, lambda: raw_per_record(scratch), lambda: journal_group_commit(scratch)
        )
        path = build_read_journal(scratch, args.records)
        parquet = build_parquet(path, scratch)
        it_r, ar_r, pq_r = rounds(
            3,
            lambda: read_iter(path, args.records),
            lambda: read_arrow(path, args.records),
            lambda: read_parquet(parquet, args.records),
        )
    med = statistics.median
    raw_b, raw_d, jou_b, jou_w = med(raw_b_r), med(raw_d_r), med(jou_b_r), med(jou_w_r)
    raw_1, jou_g = med(raw_1_r), med(jou_g_r)
    it_rps, ar_rps, pq_rps = med(it_r), med(ar_r), med(pq_r)
    summary = {
        "bench": "journal",
        "ratio_batched": round(median_ratio(jou_b_r, raw_b_r), 3),
        "ratio_batched_write": round(median_ratio(jou_w_r, raw_b_r), 3),
        "ratio_batched_vs_disk_bytes": round(median_ratio(jou_b_r, raw_d_r), 3),
        "disk_bytes_per_append": disk,
        "ratio_group_commit": round(median_ratio(jou_g_r, raw_1_r), 2),
        "ratio_batched_rounds": [round(a / b, 3) for a, b in zip(jou_b_r, raw_b_r, strict=True)],
        "ratio_group_commit_rounds": [round(a / b, 2) for a, b in zip(jou_g_r, raw_1_r, strict=True)],
        "read_rps": round(it_rps),
        "read_arrow_rps": round(ar_rps),
        "ratio_arrow_vs_parquet": round(median_ratio(ar_r, pq_r), 3),
        "batched_rps": round(jou_b),
        "batched_write_rps": round(jou_w),
        "raw_batched_rps": round(raw_b),
        "group_commit_rps": round(jou_g),
        "raw_fdatasync_per_record_rps": round(raw_1),
        "parquet_rps": round(pq_rps),
        "read_records": args.records,
        "seconds": round(time.perf_counter() - started, 1),
    }
    rows = [
        ("(a) raw write+fdatasync, 100 KB payload batches", f"{raw_b:,.0f} rec/s"),
        ("(a) journal, 1,000-record appends, write_many", f"{jou_b:,.0f} rec/s"),
        ("(a) ratio (target ≥ 0.3)", f"{summary['ratio_batched']}"),
        ("(a) journal, 1,000-record appends, write per record", f"{jou_w:,.0f} rec/s"),
        ("(a) ratio, write per record", f"{summary['ratio_batched_write']}"),
        (f"(a) raw write+fdatasync of the journal's {disk:,} on-disk bytes", f"{raw_d:,.0f} rec/s"),
        ("(a) ratio vs the same on-disk bytes", f"{summary['ratio_batched_vs_disk_bytes']}"),
        ("(b) raw fdatasync per record", f"{raw_1:,.0f} rec/s"),
        (f"(b) journal, {THREADS} threads x 1-record appends", f"{jou_g:,.0f} rec/s"),
        ("(b) ratio (target ≥ 3)", f"{summary['ratio_group_commit']}"),
        ("(c) read(), record iterator", f"{it_rps:,.0f} rec/s"),
        ("(c) read_arrow()", f"{ar_rps:,.0f} rec/s"),
        ("(c) pyarrow Parquet reader, same records", f"{pq_rps:,.0f} rec/s"),
    ]
    report("journal", rows, summary)


if __name__ == "__main__":
    main()
