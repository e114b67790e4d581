"""HTTP delivery: the worker pool against a bare aiohttp client loop, same receiver, same concurrency.

    .venv/bin/python benchmarks/http_delivery.py            # full run; writes docs/benchmarks.md
    .venv/bin/python benchmarks/http_delivery.py --concurrency 16 --runs 7    # a part of it; prints only
    .venv/bin/python benchmarks/http_delivery.py --quick    # smoke run, prints only
    .venv/bin/python benchmarks/http_delivery.py --concurrency 16 --burn-us 40   # also the bare loop + 40 µs/job
    .venv/bin/python benchmarks/http_delivery.py --producer alongside   # enqueue while the pool delivers

Both sides post the same events to the same kind of receiver (``python -m asyncq.inbox``, a fresh file per
run, WAL+FULL, group commit) at the same concurrency, alternating run by run. The bare loop holds the events
in memory and counts a verified 200; the pool's time includes enqueueing the jobs (``enqueue_many``),
claiming, delivering through ``HttpTransport`` and finishing: the queue's whole cost. Target: pool ≥ 0.75×.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from _report import environment, markdown_table, print_table, verdict, write_section  # noqa: E402

from asyncq import JobSpec, Pool, Queue  # noqa: E402
from asyncq.core.ack import verify_ack  # noqa: E402
from asyncq.delivery.http import HttpTransport  # noqa: E402
from asyncq.inbox import spawn  # noqa: E402
from asyncq.worker.pool import deliver_with  # noqa: E402

Side = Callable[[str, Path, int, int], Coroutine[Any, Any, float]]
RUNS = 21


async def bare_loop(url: str, folder: Path, jobs: int, concurrency: int, burn_us: int = 0) -> float:
    """``concurrency`` tasks posting events from a shared list with one session; jobs/s. With ``burn_us``,
    each task first spends that much CPU per job (a probe of how sensitive the rhythm is, not a baseline)."""
    events = iter(range(jobs))
    started = time.perf_counter()
    # No cap on connections, like HttpTransport's own session: aiohttp's default of 100 left 28 of 128 tasks
    # waiting for a connection all run long, so the bare loop ran 100 requests at a time, not 128.
    async with aiohttp.ClientSession(trust_env=False, connector=aiohttp.TCPConnector(limit=0)) as session:

        async def post_all() -> None:
            for n in events:
                job_id = f"job-{n:06d}"
                burn_until = time.thread_time() + burn_us / 1e6
                while time.thread_time() < burn_until:
                    pass
                async with session.post(url, json={"qty": 1}, headers={"Idempotency-Key": job_id}) as response:
                    assert response.status == 200
                    verify_ack(job_id, await response.read())

        await asyncio.gather(*(post_all() for _ in range(concurrency)))
    return jobs / (time.perf_counter() - started)


async def enqueue_all(queue: Queue, jobs: int) -> None:
    """The same events as the bare loop's, as jobs, in batches of 1,000."""
    for start in range(0, jobs, 1000):
        await queue.enqueue_many([JobSpec(f"job-{n:06d}", {"qty": 1}) for n in range(start, min(start + 1000, jobs))])


async def pool_side(url: str, folder: Path, jobs: int, concurrency: int) -> float:
    """Enqueue, then a pool of ``concurrency`` tasks delivering through ``HttpTransport``; jobs/s."""
    started = time.perf_counter()
    async with await Queue.open(str(folder / "queue.db")) as queue:
        await enqueue_all(queue, jobs)
        transport = HttpTransport(url)
        pool = Pool(queue, concurrency=concurrency)
        pool.register("default", deliver_with(transport))
        await pool.run(burst=True)
        await transport.close()
        assert pool.counters.finished.get("done") == jobs, pool.counters
    return jobs / (time.perf_counter() - started)


class _StopWhenDone:
    """Pool observer that stops the pool once ``jobs`` jobs are done."""

    def __init__(self, jobs: int) -> None:
        self.jobs, self.done = jobs, 0
        self.pool: Pool | None = None

    def on_claimed(self, count: int) -> None:
        pass

    def on_finished(self, outcome: str, status: str | None) -> None:
        if status == "done":
            self.done += 1
        if self.done == self.jobs and self.pool is not None:
            self.pool.stop()

    def on_delivery(self, seconds: float, outcome: str) -> None:
        pass

    def on_lease_lost(self) -> None:
        pass

    def on_store_busy(self) -> None:
        pass


async def pool_alongside(url: str, folder: Path, jobs: int, concurrency: int) -> float:
    """``pool_side`` with the producer enqueueing its batches while the pool already delivers (as an app's
    producer does); jobs/s from the first enqueue to the last finish."""
    started = time.perf_counter()
    async with await Queue.open(str(folder / "queue.db")) as queue:
        transport = HttpTransport(url)
        observer = _StopWhenDone(jobs)
        pool = observer.pool = Pool(queue, concurrency=concurrency, observer=observer)
        pool.register("default", deliver_with(transport))
        producer = asyncio.create_task(enqueue_all(queue, jobs))
        await pool.run()
        await producer
        await transport.close()
        assert pool.counters.finished.get("done") == jobs, pool.counters
    return jobs / (time.perf_counter() - started)


def measure(side: Side, jobs: int, concurrency: int) -> float:
    with tempfile.TemporaryDirectory(prefix="asyncq-http-bench-") as name:
        folder = Path(name)
        receiver, url = spawn(folder / "inbox.db", effect="stock", env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            return asyncio.run(side(url, folder, jobs, concurrency))
        finally:
            receiver.terminate()
            receiver.wait(timeout=30)


def run(jobs: int, runs: int, concurrencies: list[int], burn_us: int = 0, pool: Side = pool_side) -> list[list[object]]:
    rows: list[list[object]] = []
    for concurrency in concurrencies:
        bare: list[float] = []
        pooled: list[float] = []
        burned: list[float] = []
        for _ in range(runs):  # alternate, so drift in the machine hits both sides alike
            bare.append(measure(bare_loop, jobs, concurrency))
            if burn_us:
                burned.append(measure(functools.partial(bare_loop, burn_us=burn_us), jobs, concurrency))
            pooled.append(measure(pool, jobs, concurrency))
        ratio = statistics.median(pooled) / statistics.median(bare)
        paired = sorted(p / b for p, b in zip(pooled, bare, strict=True))  # each pool run / the bare run before it
        rows.append(
            [
                concurrency,
                f"{statistics.median(bare):,.0f}",
                f"{min(bare):,.0f}-{max(bare):,.0f}",
                f"{statistics.median(pooled):,.0f}",
                f"{min(pooled):,.0f}-{max(pooled):,.0f}",
                f"{ratio:.2f}x",
                f"{statistics.median(paired):.2f}x ({paired[0]:.2f}-{paired[-1]:.2f})",
                verdict(ratio >= 0.75),
            ]
        )
        if burned:
            probe = statistics.median(burned)
            rows[-1] += [
                f"{probe:,.0f} ({min(burned):,.0f}-{max(burned):,.0f})",
                f"{probe / statistics.median(bare):.2f}x",
            ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run; does not write docs")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (default 20,000)")
    # Twenty-one: one run moves by up to ±30 % on this shared VM (the bare loop's most: 3.5-5.7k jobs/s in one
    # invocation), and a median of seven moved the verdict by ±0.05 from one invocation to the next, of eleven
    # still by ±0.04-0.05 (the same code at 32 tasks: 0.73 and 0.75x in two full invocations, 0.85x in a
    # scratch set of ten).
    parser.add_argument("--runs", type=int, default=RUNS, help=f"alternating runs a side (default {RUNS})")
    parser.add_argument("--concurrency", type=int, action="append", help="tasks a side (default 16, 32, 64, 128)")
    parser.add_argument(
        "--burn-us",
        type=int,
        default=0,
        help="also run the bare loop spending this much CPU per job (a sensitivity probe); does not write docs",
    )
    parser.add_argument(
        "--producer",
        choices=("before", "alongside"),
        default="before",
        help="enqueue every job before the pool starts (default, the verdict's method) or while it runs "
        "(informational; does not write docs)",
    )
    args = parser.parse_args()
    concurrencies = args.concurrency or [16, 32, 64, 128]
    jobs, runs, concurrencies = (500, 1, [16]) if args.quick else (args.jobs, args.runs, concurrencies)
    headers = [
        "tasks",
        "bare loop jobs/s",
        "range",
        "asyncq pool jobs/s",
        "range",
        "pool / bare",
        "run by run",
        "target ≥ 0.75x",
    ]
    if args.burn_us:
        headers += [f"bare loop + {args.burn_us} µs CPU/job", "burned / bare"]
    alongside = args.producer == "alongside"
    rows = run(jobs, runs, concurrencies, args.burn_us, pool_alongside if alongside else pool_side)
    title = f"HTTP delivery to the inbox receiver, {jobs} jobs a run, medians of {runs} alternating runs"
    if alongside:
        title += "; the pool's producer enqueues while it delivers"
    print_table(title, headers, rows)
    # Only the whole default invocation is the recorded result: a part of it (one concurrency, fewer runs) prints.
    whole = (args.concurrency, args.runs, args.jobs) == (None, RUNS, 20_000)
    if whole and not (args.quick or args.burn_us or alongside):
        body = "\n".join(
            [
                "## HTTP delivery: the pool against a bare aiohttp loop (`http_delivery`)",
                "",
                f"{title}. {environment()}",
                "",
                "Command: `.venv/bin/python benchmarks/http_delivery.py`. Receiver: `python -m asyncq.inbox`",
                "(WAL+FULL, group commit), a fresh file per run. The pool's time includes `enqueue_many` of every job,",
                "the claims, the deliveries through `HttpTransport` (verified ACKs) and the finishes, on a WAL+FULL",
                "queue file. Both sides' sessions open a connection for every request in flight (aiohttp's default",
                "cap of 100 held 28 of 128 tasks back all run long, and made the pool's held-back deliveries miss",
                "their deadline).",
                "",
                markdown_table(headers, rows),
                "",
                'The verdict is on the ratio of the medians; "run by run" divides each pool run by the bare run just',
                "before it (median, lowest-highest). The ranges show how much one run can move on this shared 2-core",
                "VM (the bare loop at 16 tasks most: the receiver's group commits fall into different rhythms, and",
                "runs of 4,000 jobs, as this benchmark first used, mostly end before the fast one sets in).",
                "",
                'Where the rest goes (docs/benchmarks.md, "What a job costs", "16 tasks is the weak point" and',
                '"Commits of 128 jobs"): throughput follows the CPU both processes spend on a job, so only the',
                "queue's own part counts. A cycle costs more than its CPU: its statements block the loop in one piece,",
                "the hop to the connection's thread for the `COMMIT` costs the whole pipeline 1-2 ms, and its fsync",
                "shares the disk with the receiver's. All three are paid per commit, so a commit waits for 128 results",
                "(a round of the slots above 128): at 16 tasks a commit per 17 jobs gave 0.65-0.72x, one per 128",
                "0.84x in scratch sets. Enqueueing the 20,000 jobs first costs 4-6 % of a run, and the bare loop's",
                "runs move by a fifth between invocations while the pool's stay within a few per cent. What was tried",
                'and measured but not kept is in docs/benchmarks.md ("The pool: group commit, still fenced per job").',
            ]
        )
        write_section("http_delivery", body)


if __name__ == "__main__":
    main()
