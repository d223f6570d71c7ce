"""SIGKILL a journal writer at random points, hundreds of times, and check what survives.

A *fork server* (one interpreter that has already imported sluiceway) forks a fresh writer
process per cycle, so a cycle costs milliseconds rather than an interpreter start. Each writer
recovers the journal, then appends forever — appends of 0 to 200 records, each carrying
``append_id:i:n`` in its values and setting the ``last`` register to its id (with an
expectation on the previous value, so a register that was not applied atomically with its
records would make the writer fail, not just the test) — and logs every acknowledged append
to an ack file. The test kills it at a random moment, then recovers the journal itself and
checks:

* every acknowledged append is there, whole, at the offsets it was given;
* every append present is whole (all-or-nothing) and is either acknowledged or the one that
  was in flight when the writer died;
* offsets are contiguous and nothing seen before changed (no offset assigned twice);
* the ``last`` register matches the records (applied atomically with them);
* the named consumer offset is at least the last acknowledged commit.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from sluiceway.journal import Journal
from sluiceway.testing import wait_until

CYCLES = 200
REPO = Path(__file__).resolve().parents[2]

SERVER = textwrap.dedent(
    """
    import os, random, sys
    from sluiceway.journal import Journal

    def writer(path, ack_path, seed, first_id):
        rng = random.Random(seed)
        ack = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        j = Journal.open(path, segment_bytes=32 * 1024)
        last = j.registers().get("last")
        append_id = first_id
        while True:
            n = rng.choice([0, 1, 3, 10, 50, 200])
            with j.append(expect_registers={"last": last}, set_registers={"last": str(append_id)}) as tx:
                for i in range(n):
                    pad = b"." * rng.randint(0, 300)
                    tx.write(f"k{rng.randint(0, 9)}", f"{append_id}:{i}:{n}:".encode() + pad)
            os.write(ack, f"A {append_id} {tx.offsets.start} {n}\\n".encode())
            last = str(append_id)
            if rng.random() < 0.2:
                j.commit_offset("c", tx.offsets.stop)
                os.write(ack, f"C {tx.offsets.stop}\\n".encode())
            append_id += 1

    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "run":
            pid = os.fork()
            if pid == 0:
                try:
                    writer(args[0], args[1], int(args[2]), int(args[3]))
                finally:
                    os._exit(3)  # an exception in the writer: reported as exit status 3
            print(pid, flush=True)
        elif cmd == "kill":
            pid = int(args[0])
            os.kill(pid, 9)
            _, status = os.waitpid(pid, 0)
            print(status, flush=True)
    """
)


class ForkServer:
    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def ask(self, line: str) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        assert reply, "fork server died"
        return int(reply)

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(10)
        self.proc.stdout.close()


def read_acks(ack: Path) -> tuple[dict[int, tuple[int, int]], list[int]]:
    appends: dict[int, tuple[int, int]] = {}
    commits: list[int] = []
    if ack.exists():
        for line in ack.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] == "A":
                appends[int(parts[1])] = (int(parts[2]), int(parts[3]))
            elif len(parts) == 2 and parts[0] == "C":
                commits.append(int(parts[1]))
    return appends, commits


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigkill_writer_hundreds_of_times(tmp_path: Path) -> None:
    path, ack = str(tmp_path / "journal"), tmp_path / "acks"
    rng = random.Random(20261125)
    server = ForkServer()
    seen: dict[int, bytes] = {}  # every record ever observed, by offset
    in_flight: set[int] = set()  # the append each killed writer may have been committing
    last_register: str | None = None
    groups: dict[int, tuple[int, int]] = {}  # append id -> (first offset, n)
    stable = 0  # offsets below this live in closed segments, which recovery never touches
    try:
        for cycle in range(CYCLES):
            first_id = (cycle + 1) * 1_000_000
            acked_before = len(read_acks(ack)[0])
            pid = server.ask(f"run {path} {ack} {rng.randrange(2**32)} {first_id}")
            # Fault injection point: let the writer get a random number of appends in (0 kills it
            # while it is still recovering), then a random sub-millisecond jitter, then SIGKILL.
            target = acked_before + rng.choice([0, 0, 1, 2, 3])
            wait_until(lambda t=target: len(read_acks(ack)[0]) >= t, timeout=30, interval=0.0005)
            threading.Event().wait(rng.uniform(0, 0.002))
            status = server.ask(f"kill {pid}")
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
                f"cycle {cycle}: writer ended by itself (status {status}) instead of being killed"
            )

            appends, commits = read_acks(ack)
            mine = sorted(a for a in appends if a >= first_id)
            in_flight.add(mine[-1] + 1 if mine else first_id)
            # Re-read everything now and then; otherwise what recovery could have touched: the
            # segment that was active at the last check, and anything newer.
            start = 0 if cycle % 25 == 0 or cycle == CYCLES - 1 else stable
            with Journal.open(path) as j:  # recovery
                records = list(j.read(start))
                head, registers, consumer = j.head, j.registers(), j.offset("c")
                stable = j.segments()[-1].base
            if start == 0:
                groups = {}

            # Offsets contiguous; nothing seen before has changed.
            assert [r.offset for r in records] == list(range(start, head)), (
                f"cycle {cycle}: offsets not contiguous"
            )
            for r in records:
                assert r.value is not None
                if r.offset in seen:
                    assert seen[r.offset] == r.value, f"cycle {cycle}: offset {r.offset} was rewritten"
                seen[r.offset] = r.value
            assert len(seen) == head, f"cycle {cycle}: records disappeared"

            # All-or-nothing, grouped by append (``start`` is always the start of an append: it is
            # a segment base, and an append never spans segments).
            i = 0
            while i < len(records):
                append_id, idx, n, _ = records[i].value.split(b":", 3)  # type: ignore[union-attr]
                aid, n_ = int(append_id), int(n)
                assert int(idx) == 0, f"cycle {cycle}: append {aid} starts mid-way"
                chunk = records[i : i + n_]
                assert [c.value.split(b":", 3)[:3] for c in chunk] == [  # type: ignore[union-attr]
                    [append_id, str(k).encode(), n] for k in range(n_)
                ], f"cycle {cycle}: append {aid} is partial"
                groups[aid] = (records[i].offset, n_)
                i += n_
            for aid, (first, n) in appends.items():
                if n:
                    assert groups.get(aid) == (first, n), f"cycle {cycle}: acknowledged append {aid} lost"
            for aid in groups:
                assert aid in appends or aid in in_flight, f"cycle {cycle}: append {aid} came from nowhere"

            # The register moved with the records.
            last = int(registers["last"]) if "last" in registers else None
            newest_records = max(groups) if groups else None
            if newest_records is not None:
                assert last is not None and last >= newest_records
            if mine or last_register is not None or last is not None:
                allowed = {str(mine[-1]) if mine else last_register, str(max(in_flight))}
                assert registers.get("last") in allowed, (
                    f"cycle {cycle}: register {registers} not in {allowed}"
                )
            last_register = registers.get("last")

            # Consumer offsets: at least the last acknowledged commit.
            if commits:
                assert consumer is not None and commits[-1] <= consumer <= head
        appends = read_acks(ack)[0]
    finally:
        server.close()
    in_doubt = len(in_flight & set(groups) - set(appends))
    print(
        f"\njournal chaos: {CYCLES} kills, {len(appends)} acknowledged appends, "
        f"{in_doubt} unacknowledged in-flight appends found committed, {len(seen)} records"
    )
    assert len(appends) > CYCLES  # the writers really did work between kills
