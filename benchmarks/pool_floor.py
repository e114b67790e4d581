"""The no-op pool against a raw set-based floor: asyncq's lifecycle on a plain ``sqlite3`` connection, in one run.

Every side runs in a child process of its own on a fresh WAL+FULL file, the same two phases: enqueue ``--jobs``
jobs (500 a commit, 256 a statement: ``enqueue_many``'s path), then drain them all; jobs/s counts both phases.

- **set-based floor**: asyncq's own statements (``INSERT_ROWS``, the two sweeps, ``CLAIM``, ``FINISH_ROWS``) on a
  plain ``sqlite3`` connection, 128 jobs a commit: each ``BEGIN IMMEDIATE`` finishes the jobs claimed by the
  previous one (one compare-and-set statement for the batch, each row fenced on its id, owner, token, attempt
  and lease), sweeps, claims the next 128 (counting their attempts) and commits; every body is decoded once.
  No asyncio, no validation, no thread: the least Python that asyncq's lifecycle can run with.
- **asyncq Pool**: ``Queue.enqueue_many`` in batches of 500, then ``Pool(queue, concurrency=16).run(burst=True)``
  with a handler that awaits ``asyncio.sleep(0)`` (each job yields once, so all 16 tasks are busy at once), and
  the same with a handler that returns at once (``benchmarks/ab_pool.py``'s).

Sides alternate run by run (the order rotated), so drift on a shared machine falls on all alike; the table
holds medians, CPU per job (the child's ``process_time``: every thread), and the ratio to the floor of this
invocation. Target (issue 21): the pool at 16 tasks ≥ 40,000 jobs/s end to end, or ≥ 0.6× the floor.

Run ``.venv/bin/python benchmarks/pool_floor.py`` (about a minute; rewrites the ``pool-floor`` section of
docs/benchmarks.md), or ``--quick`` for a smoke run (2,000 jobs, 2 runs, writes nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _report

from asyncq import JobSpec, Pool, Queue
from asyncq.core.jobs import decode_stored
from asyncq.store.sqlite.connection import write_transaction
from asyncq.store.sqlite.migrations import migrate_in_transaction
from asyncq.store.sqlite.schema import PRODUCT
from asyncq.store.sqlite.statements import FinishChange, finish_params, finish_rows, insert_rows, padded, sql

SECTION = "pool-floor"
COMMAND = ".venv/bin/python benchmarks/pool_floor.py"
ENQUEUE_BATCH = 500  # jobs a commit, as the pool side's enqueue_many calls
INSERT_ROWS_MAX = 256  # jobs a statement, as the engine's enqueue
CLAIM_BATCH = 128  # jobs a commit of the floor's drain, as the pool's batch at 16 tasks
TASKS = 16
TARGET_JOBS_S = 40_000
TARGET_RATIO = 0.6
FLOOR, POOL_YIELD, POOL_NOOP = "set-based floor", "asyncq Pool, handler awaits sleep(0)", "asyncq Pool, handler returns"


@dataclass(frozen=True)
class Sample:
    enqueue_s: float
    drain_s: float
    cpu_s: float  # the child's process_time over both phases (every thread)
    commits: int  # drain commits


@dataclass
class Side:
    name: str
    child: str  # the --child argument that runs it
    samples: list[Sample] = field(default_factory=list)

    def median(self, value: Callable[[Sample], float]) -> float:
        return statistics.median(value(sample) for sample in self.samples)


# -- the floor ----------------------------------------------------------------------------------------


def floor_connection(path: str) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.execute("PRAGMA temp_store=MEMORY")  # as asyncq's connections (store/sqlite/connection.py)
    with write_transaction(con):
        migrate_in_transaction(con)  # the product's tables at their current version, as Queue.open makes them
    return con


def floor_enqueue(con: sqlite3.Connection, jobs: int) -> None:
    for first in range(0, jobs, ENQUEUE_BATCH):
        now = time.time_ns() // 1_000_000
        con.execute("BEGIN IMMEDIATE")
        for start in range(first, min(first + ENQUEUE_BATCH, jobs), INSERT_ROWS_MAX):
            stop = min(start + INSERT_ROWS_MAX, first + ENQUEUE_BATCH, jobs)
            due = now + 86_400_000
            body = '{{"n":{}}}'.format
            # priority 0; no unique key, group, limit key or task
            rows = padded(
                [(f"j{n}", "default", body(n), 0, None, None, None, None, 3, now, due) for n in range(start, stop)]
            )
            con.execute(insert_rows(PRODUCT, len(rows)), [value for row in rows for value in row]).fetchall()
        con.execute("COMMIT")


def floor_drain(con: sqlite3.Connection) -> int:
    """Claim 128, finish them in the next commit with one fenced statement; the number of commits."""
    claim, sweeps = sql(PRODUCT, PRODUCT.claim), (sql(PRODUCT, "SWEEP_DEADLINE"), sql(PRODUCT, "SWEEP_EXHAUSTED"))
    held: list[tuple[Any, ...]] = []
    commits = 0
    while True:
        now = time.time_ns() // 1_000_000
        con.execute("BEGIN IMMEDIATE")
        if held:
            change = FinishChange("done", None, now, 0, "floor")
            landed = con.execute(finish_rows(PRODUCT, len(held)), finish_params(change, held)).fetchall()
            if len(landed) != len(held):
                raise RuntimeError(f"the floor's finish landed {len(landed)} of {len(held)} rows")
        for sweep in sweeps:
            con.execute(sweep, {"now": now})
        params = {"now": now, "owner": "floor", "lease_ms": 30_000, "limit": CLAIM_BATCH, "count": 1}
        rows = con.execute(claim, params | {"queue": "default"}).fetchall()
        con.execute("COMMIT")
        commits += 1
        if not rows:
            return commits
        held = []
        for seq, job_id, body, _prio, token, attempts, deadline, max_attempts, _rank in rows:  # Ticket.from_row's
            decode_stored(body)  # what a handler gets: the body, decoded once
            held.append((seq, job_id, token, attempts, min(now + 30_000, deadline), max_attempts, deadline))


def floor_run(path: str, jobs: int) -> Sample:
    con = floor_connection(path)
    try:
        cpu, start = time.process_time(), time.perf_counter()
        floor_enqueue(con, jobs)
        enqueued = time.perf_counter()
        commits = floor_drain(con)
        drained = time.perf_counter()
        done = con.execute("SELECT count(*) FROM asyncq_jobs WHERE status = 'done'").fetchone()[0]
    finally:
        con.close()
    if done != jobs:
        raise RuntimeError(f"the floor finished {done} of {jobs} jobs")
    return Sample(enqueued - start, drained - enqueued, time.process_time() - cpu, commits)


# -- the pool -----------------------------------------------------------------------------------------


async def pool_cycle(path: str, jobs: int, yields: bool) -> Sample:
    async with await Queue.open(path) as queue:
        cpu, start = time.process_time(), time.perf_counter()
        for first in range(0, jobs, ENQUEUE_BATCH):
            specs = [JobSpec(f"j{n}", {"n": n}) for n in range(first, min(jobs, first + ENQUEUE_BATCH))]
            await queue.enqueue_many(specs)
        enqueued = time.perf_counter()
        pool = Pool(queue, concurrency=TASKS)

        async def sleeps(body: Any, context: Any) -> None:
            await asyncio.sleep(0)

        async def returns(body: Any, context: Any) -> None:
            return None

        pool.register("default", sleeps if yields else returns)
        await pool.run(burst=True)
        drained = time.perf_counter()
        cpu = time.process_time() - cpu
        done = (await queue.stats()).by_status.get("done", 0)
    if done != jobs:
        raise RuntimeError(f"the pool finished {done} of {jobs} jobs")
    return Sample(enqueued - start, drained - enqueued, cpu, pool.counters.commits)


CHILDREN: dict[str, Callable[[str, int], Sample]] = {
    "floor": floor_run,
    "pool-yield": lambda path, jobs: asyncio.run(pool_cycle(path, jobs, True)),
    "pool-noop": lambda path, jobs: asyncio.run(pool_cycle(path, jobs, False)),
}


def run_child(child: str, jobs: int) -> Sample:
    """One run of one side in a fresh interpreter, on a fresh file."""
    with tempfile.TemporaryDirectory(prefix="asyncq-pool-floor-") as scratch:
        done = subprocess.run(
            [sys.executable, __file__, "--child", child, "--jobs", str(jobs), "--file", str(Path(scratch) / "q.db")],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
    return Sample(**json.loads(done.stdout.strip().splitlines()[-1]))


# -- the report ---------------------------------------------------------------------------------------


def rate(jobs: int) -> Callable[[Sample], float]:
    return lambda sample: jobs / (sample.enqueue_s + sample.drain_s)


HEADERS = ("side", "jobs/s", "range", "enqueue jobs/s", "drain jobs/s", "CPU µs/job", "jobs/commit", "× floor")


def rows(sides: Sequence[Side], jobs: int) -> list[list[str]]:
    floor = sides[0].median(rate(jobs))
    table = []
    for side in sides:
        runs = [rate(jobs)(sample) for sample in side.samples]
        table.append(
            [
                side.name,
                f"{side.median(rate(jobs)):,.0f}",
                f"{min(runs):,.0f}–{max(runs):,.0f}",
                f"{side.median(lambda s: jobs / s.enqueue_s):,.0f}",
                f"{side.median(lambda s: jobs / s.drain_s):,.0f}",
                f"{side.median(lambda s: s.cpu_s / jobs * 1e6):.1f}",
                f"{jobs / side.median(lambda s: s.commits):.0f}",
                f"{side.median(rate(jobs)) / floor:.2f}×",
            ]
        )
    return table


def checks(sides: Sequence[Side], jobs: int) -> list[list[str]]:
    floor = sides[0].median(rate(jobs))
    found = []
    for side in sides[1:]:
        mine = side.median(rate(jobs))
        ok = mine >= TARGET_JOBS_S or mine >= TARGET_RATIO * floor
        name = f"{side.name}: ≥ {TARGET_JOBS_S:,} jobs/s or ≥ {TARGET_RATIO}× the floor"
        found.append([name, f"{mine:,.0f} jobs/s, {mine / floor:.2f}×", _report.verdict(ok)])
    return found


def measure(sides: Sequence[Side], jobs: int, runs: int) -> str:
    before = os.getloadavg()[0]
    for round_no in range(runs):
        shift = round_no % len(sides)
        for side in [*sides[shift:], *sides[:shift]]:
            side.samples.append(run_child(side.child, jobs))
        print(f"round {round_no + 1}/{runs} done", flush=True)
    return f"load average (1 min) {before:.1f} before, {os.getloadavg()[0]:.1f} after"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2,000 jobs, 2 runs, writes nothing")
    parser.add_argument("--jobs", type=int, help="jobs per run (default 20,000)")
    parser.add_argument("--runs", type=int, help="runs per side (default 7)")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    jobs = args.jobs or (2_000 if args.quick else 20_000)
    if args.child:
        print(json.dumps(CHILDREN[args.child](args.file, jobs).__dict__))
        return
    runs = args.runs or (2 if args.quick else 7)
    sides = [Side(FLOOR, "floor"), Side(POOL_YIELD, "pool-yield"), Side(POOL_NOOP, "pool-noop")]
    load = measure(sides, jobs, runs)
    title = f"the pool against the set-based floor ({jobs:,} jobs, medians of {runs}; {load})"
    intro = (
        f"`{COMMAND}`: {jobs:,} jobs a run, {runs} runs a side, each a child process on a fresh WAL+FULL file, sides "
        f"alternating. {_report.environment()}; {load}."
    )
    table = (title, HEADERS, rows(sides, jobs))
    heading = "The pool against a raw set-based floor"
    _report.publish(SECTION, heading, intro, table, checks(sides, jobs), NOTES, write=not args.quick)


NOTES = """\
- **set-based floor**: asyncq's lifecycle with the least Python it can run with: asyncq's own statements on a
  plain `sqlite3` connection, one thread, no asyncio, no validation. Enqueue 500 jobs a commit (two
  `INSERT_ROWS` statements); then each commit finishes the previous 128 jobs with one `FINISH_ROWS` statement
  (every row fenced on id, owner, token, attempt, lease and the claim's snapshot), sweeps, claims 128 with
  `CLAIM` and decodes their bodies.
- **asyncq Pool**: `enqueue_many` of 500 jobs a call, then a 16-task pool until the queue is empty (`burst`).
  "awaits sleep(0)": each job yields to the loop once, so the 16 tasks run at once (the throughput benchmark's
  handler); "returns": the job never yields (`benchmarks/ab_pool.py`'s handler).
- **CPU µs/job**: the child's `process_time` over both phases (the loop's thread and the connection's), per job.
  **jobs/commit**: drain commits only.
"""


if __name__ == "__main__":
    main()
