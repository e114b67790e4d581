"""Worker processes sharing one queue file: total throughput, and how fairly the jobs are shared.

For 1, 2 and 4 worker processes (real child processes, each a ``Pool(queue, concurrency=16)`` with a handler that
awaits ``asyncio.sleep(0)``), the parent enqueues ``--jobs`` jobs on a fresh WAL+FULL file, starts the children,
lets them open the file, and releases them at once (each waits for a line on its stdin). Every child drains
until the queue is empty (``run(burst=True)``) and reports the jobs it finished, the most leases it held at once
(jobs claimed and not yet finished: running or buffered), and when it started and ended. Throughput is the jobs
over the time from the release to the last child's end.

Per process count the table shows the median over the runs of the total jobs/s, the ratio to one process, the
least-served process's share of the most-served's (min/max jobs), and the largest number of leases any process
held against its bound (``concurrency + prefetch``). Counts alternate run by run. Target (issue 21): with 2 and 4
processes, min/max ≥ 0.5 in every run and the total within 10 % of one process.

Run ``.venv/bin/python benchmarks/processes.py`` (a minute or two; rewrites the ``processes`` section of
docs/benchmarks.md), or ``--quick`` for a smoke run (2,000 jobs, one run, writes nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _report

from asyncq import JobSpec, Pool, Queue

SECTION = "processes"
COMMAND = ".venv/bin/python benchmarks/processes.py"
COUNTS = (1, 2, 4)
TASKS = 16
TARGET_SHARE = 0.5
TARGET_TOTAL = 0.9


@dataclass(frozen=True)
class Child:
    """What one worker process reports."""

    jobs: int
    most_held: int  # the most leases it held at once
    bound: int  # concurrency + prefetch: what it may hold
    started: float  # time.time() when released
    ended: float
    commits: int


@dataclass(frozen=True)
class Run:
    processes: int
    children: list[Child]
    released: float

    @property
    def seconds(self) -> float:
        return max(child.ended for child in self.children) - self.released

    @property
    def share(self) -> float:
        jobs = [child.jobs for child in self.children]
        return min(jobs) / max(jobs)


# -- the child -------------------------------------------------------------------------------------


class HeldGauge:
    """The handler: yields once; samples how many leases its pool holds (``Pool._flights.jobs``: running, buffered)."""

    def __init__(self) -> None:
        self.pool: Pool | None = None
        self.most = 0

    async def handle(self, body: Any, context: Any) -> None:
        assert self.pool is not None
        self.most = max(self.most, len(self.pool._flights.jobs))
        await asyncio.sleep(0)


async def child(path: str, owner: str) -> Child:
    async with await Queue.open(path) as queue:
        pool, gauge = Pool(queue, concurrency=TASKS, owner=owner), HeldGauge()
        gauge.pool = pool
        pool.register("default", gauge.handle)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        started = time.time()
        await pool.run(burst=True)
        ended = time.time()
    done = pool.counters.finished.get("done", 0)
    return Child(done, gauge.most, pool.concurrency + pool.prefetch, started, ended, pool.counters.commits)


# -- the parent ------------------------------------------------------------------------------------


async def enqueue(path: str, jobs: int) -> None:
    async with await Queue.open(path) as queue:
        for first in range(0, jobs, 500):
            await queue.enqueue_many([JobSpec(f"j{n}", {"n": n}) for n in range(first, min(jobs, first + 500))])


def one_run(processes: int, jobs: int) -> Run:
    with tempfile.TemporaryDirectory(prefix="asyncq-processes-") as scratch:
        path = str(Path(scratch) / "q.db")
        asyncio.run(enqueue(path, jobs))
        argv = [sys.executable, __file__, "--child", "--file", path]
        procs = [
            subprocess.Popen([*argv, "--owner", f"w{n}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for n in range(processes)
        ]
        try:
            for proc in procs:  # every child has opened the file
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"worker {proc.pid} did not start")
            released = time.time()
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            children = [
                Child(**json.loads(proc.communicate(timeout=600)[0].strip().splitlines()[-1])) for proc in procs
            ]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
    if sum(child.jobs for child in children) != jobs:
        raise RuntimeError(f"{processes} processes finished {sum(c.jobs for c in children)} of {jobs} jobs")
    return Run(processes, children, released)


HEADERS = (
    "processes",
    "jobs/s",
    "× 1 process",
    "min/max share (median)",
    "min/max share (worst)",
    "jobs per process (median run)",
    "most leases held / bound",
    "jobs/commit",
)


def rows(runs: dict[int, list[Run]], jobs: int) -> list[list[str]]:
    alone = statistics.median(jobs / run.seconds for run in runs[1])
    table = []
    for count, found in runs.items():
        rate = statistics.median(jobs / run.seconds for run in found)
        middle = sorted(found, key=lambda run: run.share)[len(found) // 2]
        held = max(child.most_held for run in found for child in run.children)
        bound = max(child.bound for run in found for child in run.children)
        commits = statistics.median(sum(child.commits for child in run.children) for run in found)
        table.append(
            [
                str(count),
                f"{rate:,.0f}",
                f"{rate / alone:.2f}×",
                f"{statistics.median(run.share for run in found):.2f}",
                f"{min(run.share for run in found):.2f}",
                " / ".join(f"{child.jobs:,}" for child in sorted(middle.children, key=lambda c: -c.jobs)),
                f"{held} / {bound}",
                f"{jobs / commits:.0f}",
            ]
        )
    return table


def checks(runs: dict[int, list[Run]], jobs: int) -> list[list[str]]:
    alone = statistics.median(jobs / run.seconds for run in runs[1])
    found = []
    for count in (n for n in runs if n > 1):
        worst = min(run.share for run in runs[count])
        rate = statistics.median(jobs / run.seconds for run in runs[count])
        found.append(
            [
                f"{count} processes: least-served ≥ {TARGET_SHARE}× the most-served, every run",
                f"{worst:.2f}",
                _report.verdict(worst >= TARGET_SHARE),
            ]
        )
        found.append(
            [
                f"{count} processes: total within 10 % of one process",
                f"{rate / alone:.2f}×",
                _report.verdict(rate >= TARGET_TOTAL * alone),
            ]
        )
    held = all(child.most_held <= child.bound for found in runs.values() for run in found for child in run.children)
    found.append(["no process held more leases than its bound", "yes" if held else "no", _report.verdict(held)])
    return found


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2,000 jobs, one run, writes nothing")
    parser.add_argument("--jobs", type=int, help="jobs per run (default 20,000)")
    parser.add_argument("--runs", type=int, help="runs per process count (default 5)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    parser.add_argument("--owner", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(child(args.file, args.owner)).__dict__))
        return
    jobs = args.jobs or (2_000 if args.quick else 20_000)
    count = args.runs or (1 if args.quick else 5)
    before = os.getloadavg()[0]
    runs: dict[int, list[Run]] = {n: [] for n in COUNTS}
    for round_no in range(count):
        shift = round_no % len(COUNTS)
        for processes in [*COUNTS[shift:], *COUNTS[:shift]]:
            runs[processes].append(one_run(processes, jobs))
        print(f"round {round_no + 1}/{count} done", flush=True)
    load = f"load average (1 min) {before:.1f} before, {os.getloadavg()[0]:.1f} after"
    title = f"worker processes on one file ({jobs:,} jobs, {TASKS} tasks each, medians of {count}; {load})"
    intro = (
        f"`{COMMAND}`: {jobs:,} jobs a run, {count} runs a process count, a fresh WAL+FULL file a run; "
        f"{_report.environment()}; {load}."
    )
    table = (title, HEADERS, rows(runs, jobs))
    heading = "Worker processes on one file"
    _report.publish(SECTION, heading, intro, table, checks(runs, jobs), NOTES, write=not args.quick)


NOTES = """\
- Each process: `Pool(queue, concurrency=16).run(burst=True)`, a handler that awaits `asyncio.sleep(0)`; all are
  released at once after they opened the file. **jobs/s**: jobs over the time from the release to the last
  process's end. **min/max share**: the least-served process's jobs over the most-served's, the median run's
  and the worst run's. **most leases held**: the most jobs any process had claimed and not yet finished
  (running or buffered), sampled at each job's start, against its bound (`concurrency + prefetch`).
"""


if __name__ == "__main__":
    main()
