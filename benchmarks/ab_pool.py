"""A no-op pool, this checkout against a baseline commit, side by side in one invocation.

    .venv/bin/python benchmarks/ab_pool.py --baseline 72d33eb          # 16 and 64 tasks, 7 runs a side
    .venv/bin/python benchmarks/ab_pool.py --baseline HEAD~3 --tasks 16 --runs 11 --jobs 20000

The baseline is checked out (``git worktree``) into a temporary folder. Each run is a child process with
``PYTHONPATH`` on one tree: a fresh WAL+FULL file, ``enqueue_many`` of ``--jobs`` jobs in batches of 500, then
``Pool(queue, concurrency=N).run(burst=True)`` with a handler that does nothing; jobs/s counts both phases.
Sides alternate run by run, so drift on a noisy machine falls on both; the table holds medians, the ratio
this/baseline, and each side's CPU a job (the child's ``process_time``, both phases). The child uses only the API
both trees share. With ``--write`` the table goes into the
``ab-pool`` section of ``docs/benchmarks.md``. ``--instructions`` counts each side's instructions a job with
``valgrind --tool=callgrind`` instead (slow: about a minute a side for 10,000 jobs, but the count does not move with
the machine's load, so a few per cent can be seen on a busy machine; ``baseline / this`` above 1 is fewer here).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from _report import environment, markdown_table, print_table, write_section

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import asyncio, json, sys, tempfile, time, os
from asyncq import JobSpec, Pool, Queue

async def main(jobs, tasks):
    folder = tempfile.mkdtemp()
    async with await Queue.open(os.path.join(folder, "q.db")) as queue:
        started, cpu = time.perf_counter(), time.process_time()
        for start in range(0, jobs, 500):
            await queue.enqueue_many([JobSpec(f"j{n}", {"n": n}) for n in range(start, min(jobs, start + 500))])
        enqueued = time.perf_counter()
        pool = Pool(queue, concurrency=tasks)

        async def handler(body, context):
            return None

        pool.register("default", handler)
        await pool.run(burst=True)
        drained, cpu = time.perf_counter(), time.process_time() - cpu
        stats = await queue.stats()
    assert stats.by_status["done"] == jobs, stats.by_status
    print(json.dumps({"enqueue": enqueued - started, "drain": drained - enqueued, "cpu": cpu}))

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""


def run_once(tree: Path, jobs: int, tasks: int) -> tuple[float, float]:
    """One child on ``tree``: its jobs/s, enqueue and drain together, and its CPU µs a job (every thread)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(jobs), str(tasks)],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    times = json.loads(done.stdout.strip().splitlines()[-1])
    return jobs / (times["enqueue"] + times["drain"]), times["cpu"] / jobs * 1e6


def instructions(tree: Path, jobs: int, tasks: int) -> int:
    """The instructions ``valgrind --tool=callgrind`` counts in one child on ``tree`` (every thread), start to end."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", CHILD]
    done = subprocess.run(
        [*command, str(jobs), str(tasks)], env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True,
        check=True, timeout=3600,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no total: {done.stderr[-500:]}")
    return int(found.group(1))


def instructions_per_job(tree: Path, jobs: int, tasks: int) -> float:
    """Instructions a job: a run of ``jobs`` less a run of ``FEW`` (start-up, imports, opening the file), divided by
    the difference. Counted, not timed: the figure does not move with the machine's load."""
    return (instructions(tree, jobs, tasks) - instructions(tree, FEW, tasks)) / (jobs - FEW)


FEW = 10


def checkout(ref: str, folder: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), ref], check=True, capture_output=True
    )
    return folder


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="a git commit to compare with")
    parser.add_argument("--tasks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--write", action="store_true", help="write the ab-pool section of docs/benchmarks.md")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions a job with callgrind instead of timing runs"
    )
    args = parser.parse_args(argv)
    if args.instructions:
        count_instructions(args.baseline, args.tasks, args.jobs)
        return
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        baseline = checkout(args.baseline, Path(scratch) / "baseline")
        try:
            rows = []
            for tasks in args.tasks:
                sides: dict[str, list[tuple[float, float]]] = {"baseline": [], "this": []}
                for n in range(args.runs):
                    order = [("baseline", baseline), ("this", ROOT)]
                    for name, tree in order if n % 2 == 0 else order[::-1]:
                        sides[name].append(run_once(tree, args.jobs, tasks))
                base, this = (statistics.median(rate for rate, _ in sides[name]) for name in ("baseline", "this"))
                base_cpu, this_cpu = (statistics.median(cpu for _, cpu in sides[name]) for name in ("baseline", "this"))
                rows.append(
                    [tasks, f"{base:,.0f}", f"{this:,.0f}", f"{this / base:.2f}x", f"{base_cpu:.1f}", f"{this_cpu:.1f}"]
                )
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)], check=False)
    headers = ["tasks", f"baseline {args.baseline} jobs/s", "this checkout jobs/s", "this / baseline"]
    headers += ["baseline CPU µs/job", "this CPU µs/job"]
    print_table(f"no-op pool, WAL+FULL, {args.jobs:,} jobs, medians of {args.runs} alternating runs", headers, rows)
    if args.write:
        command = f"`.venv/bin/python benchmarks/ab_pool.py --baseline {args.baseline} --runs {args.runs}`"
        load = f"load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
        body = f"{command} ({environment()}; {load}):\n\n{markdown_table(headers, rows)}\n"
        write_section("ab-pool", body)


def count_instructions(ref: str, tasks_list: Sequence[int], jobs: int) -> None:
    """``--instructions``: each side's instructions a job (one count a side: a count does not vary run to run beyond
    a few hundred instructions), and the ratio."""
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        baseline = checkout(ref, Path(scratch) / "baseline")
        try:
            for tasks in tasks_list:
                base, this = (instructions_per_job(tree, jobs, tasks) for tree in (baseline, ROOT))
                rows.append([tasks, f"{base / 1000:,.1f}k", f"{this / 1000:,.1f}k", f"{base / this:.3f}x"])
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)], check=False)
    headers = ["tasks", f"baseline {ref} instructions/job", "this checkout instructions/job", "baseline / this"]
    print_table(f"no-op pool, WAL+FULL, {jobs:,} jobs less {FEW}, callgrind (every thread)", headers, rows)


if __name__ == "__main__":
    main()
