"""One-at-a-time enqueues while a pool runs: this checkout against a baseline commit, side by side in one invocation.

    .venv/bin/python benchmarks/singles.py                         # against 72d33eb, 7 runs a side, 1,000 jobs
    .venv/bin/python benchmarks/singles.py --baseline HEAD~3 --runs 5 --write

A producer enqueues ``--jobs`` jobs one call at a time (each ``await queue.enqueue(…)`` returns before the next is
made), while a ``Pool`` of 16 tasks on the same WAL+FULL file runs them with a handler that does nothing but note
when it started. Two placements:

- **same process**: the producer is a task beside the pool, on the same ``Queue`` (the in-process wake-up);
- **other process**: the producer is a child process with a ``Queue`` of its own on the file (the cross-process
  wake-up, and the two processes take the write lock in turns).

Each job's body carries ``time.monotonic_ns()`` read just before its ``enqueue`` call (the clock is the machine's,
shared by processes). Per run: **end to end** is jobs/s from the first enqueue call to the last handler's start;
**enqueue→handler** its p50/p99; **enqueue call** the p50/p99 of the producer's calls. Each run is a child process
with ``PYTHONPATH`` on one tree (the baseline is checked out with ``git worktree`` into a temporary folder), using
only the API both trees share; sides alternate run by run so the disk's drift falls on both. The table holds
medians over the runs and this/baseline ratios (for latencies, baseline/this: above 1 is better here too). The
disk's speed drifts by tens of percent within a minute, so end to end is also given as the median of the paired
ratios (run k of this side over run k of the baseline, taken back to back) with their quartiles; the target's
verdict reads that median, which the drift from one pair to the next does not move.
``--write`` puts it in the ``singles`` section of docs/benchmarks.md; ``--quick`` is a smoke run (30 jobs, 1 run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from _report import environment, markdown_table, print_table, verdict, write_section

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "72d33eb"  # the last commit before the store port

# The pool's process. ``same``: the producer is a task of it; ``other``: a child process (PRODUCER) on the file.
POOL = r"""
import asyncio, json, os, subprocess, sys, tempfile, time
from asyncq import Pool, Queue

PRODUCER = sys.argv[3]

async def produce(queue, jobs):
    calls = []
    for n in range(jobs):
        started = time.monotonic_ns()
        await queue.enqueue(f"j{n}", {"t": started})
        calls.append(time.monotonic_ns() - started)
    return calls

async def main(mode, jobs):
    path = os.path.join(tempfile.mkdtemp(), "q.db")
    async with await Queue.open(path) as queue:
        starts, done = [], asyncio.Event()
        pool = Pool(queue, concurrency=16)

        async def handler(body, context):
            starts.append((body["t"], time.monotonic_ns()))
            if len(starts) == jobs:
                done.set()

        pool.register("default", handler)
        running = asyncio.ensure_future(pool.run())
        await asyncio.sleep(0.2)  # the pool idles (its poll backs off) before the first job, as in a lull
        if mode == "same":
            calls = await produce(queue, jobs)
        else:
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-c", PRODUCER, path, str(jobs), stdout=subprocess.PIPE
            )
            out, _ = await child.communicate()
            calls = json.loads(out)
        await asyncio.wait_for(done.wait(), 120)
        pool.stop()
        await running
    first = min(enq for enq, _ in starts)
    last = max(start for _, start in starts)
    print(json.dumps({"e2e": (last - first) / 1e9, "lat": [s - e for e, s in starts], "calls": calls}))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""

PRODUCER = r"""
import asyncio, json, sys, time
from asyncq import Queue

async def main(path, jobs):
    async with await Queue.open(path) as queue:
        calls = []
        for n in range(jobs):
            started = time.monotonic_ns()
            await queue.enqueue(f"j{n}", {"t": started})
            calls.append(time.monotonic_ns() - started)
    print(json.dumps(calls))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def run_once(tree: Path, mode: str, jobs: int) -> dict[str, float]:
    """One run on ``tree``: jobs/s end to end and the latencies' p50/p99 in ms."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", POOL, mode, str(jobs), PRODUCER],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    lat = [ns / 1e6 for ns in found["lat"]]
    calls = [ns / 1e6 for ns in found["calls"]]
    return {
        "rate": jobs / found["e2e"],
        "lat50": _quantile(lat, 50),
        "lat99": _quantile(lat, 99),
        "call50": _quantile(calls, 50),
        "call99": _quantile(calls, 99),
    }


def _quantile(values: Sequence[float], percent: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def checkout(ref: str, folder: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), ref], check=True, capture_output=True
    )
    return folder


def measure(baseline: Path, mode: str, jobs: int, runs: int) -> tuple[dict[str, dict[str, float]], list[float]]:
    """Medians of each figure per side, the sides alternating run by run, and each pair's end-to-end ratio."""
    sides: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
    for n in range(runs):
        order = [("baseline", baseline), ("this", ROOT)]
        for name, tree in order if n % 2 == 0 else order[::-1]:
            sides[name].append(run_once(tree, mode, jobs))
    medians = {
        name: {key: statistics.median(run[key] for run in found) for key in found[0]} for name, found in sides.items()
    }
    paired = [this["rate"] / base["rate"] for base, this in zip(sides["baseline"], sides["this"], strict=True)]
    return medians, paired


def rows_of(
    mode: str, medians: dict[str, dict[str, float]], paired: Sequence[float]
) -> tuple[list[list[str]], list[list[str]]]:
    base, this = medians["baseline"], medians["this"]
    ratio = statistics.median(paired)
    low, high = (_quantile(paired, 25), _quantile(paired, 75)) if len(paired) > 1 else (ratio, ratio)
    rows = [
        [
            f"{mode}: end to end jobs/s",
            f"{base['rate']:,.0f}",
            f"{this['rate']:,.0f}",
            f"{this['rate'] / base['rate']:.2f}x",
        ],
        [f"{mode}: end to end, paired ratios", "", "", f"{ratio:.2f}x ({low:.2f}-{high:.2f})"],
    ]
    for key, label in (("lat50", "enqueue→handler p50"), ("lat99", "enqueue→handler p99")):
        rows.append([f"{mode}: {label} ms", f"{base[key]:.2f}", f"{this[key]:.2f}", f"{base[key] / this[key]:.2f}x"])
    for key, label in (("call50", "enqueue call p50"), ("call99", "enqueue call p99")):
        rows.append([f"{mode}: {label} ms", f"{base[key]:.2f}", f"{this[key]:.2f}", f"{base[key] / this[key]:.2f}x"])
    checks = [
        [
            f"{mode}: end to end ≥ 1.0x baseline (paired)",
            f"{ratio:.2f}x",
            verdict(ratio >= 1.0),
        ],
        [
            f"{mode}: p99 no worse",
            f"{this['lat99']:.2f} vs {base['lat99']:.2f} ms",
            verdict(this["lat99"] <= base["lat99"]),
        ],
    ]
    return rows, checks


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="a git commit to compare with")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--modes", nargs="+", choices=("same", "other"), default=["same", "other"])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 30 jobs, 1 run a side, writes nothing")
    parser.add_argument("--write", action="store_true", help="write the singles section of docs/benchmarks.md")
    args = parser.parse_args(argv)
    jobs, runs = (30, 1) if args.quick else (args.jobs, args.runs)
    load_before = os.getloadavg()[0]
    rows: list[list[str]] = []
    checks: list[list[str]] = []
    with tempfile.TemporaryDirectory() as scratch:
        baseline = checkout(args.baseline, Path(scratch) / "baseline")
        try:
            for mode in args.modes:
                mode_rows, mode_checks = rows_of(mode, *measure(baseline, mode, jobs, runs))
                rows += mode_rows
                checks += mode_checks
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)], check=False)
    headers = ["figure (medians)", f"baseline {args.baseline}", "this checkout", "ratio (>1: this better)"]
    title = f"one-at-a-time enqueues while the pool runs, WAL+FULL, {jobs:,} jobs, {runs} alternating runs a side"
    print_table(title, headers, rows)
    print_table("targets", ["target", "measured", "verdict"], checks)
    if args.write and not args.quick:
        command = f"`.venv/bin/python benchmarks/singles.py --baseline {args.baseline} --runs {runs} --jobs {jobs}`"
        load = f"load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
        body = "\n\n".join(
            [
                "## One-at-a-time enqueues while the pool runs",
                f"{command} ({environment()}; {load}):",
                markdown_table(headers, rows),
                markdown_table(["target", "measured", "verdict"], checks),
            ]
        )
        print(f"wrote {write_section('singles', body)}")


if __name__ == "__main__":
    main()
