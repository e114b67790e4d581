"""Enqueue → handler start across processes on PostgreSQL: LISTEN/NOTIFY against the poll-only mode.

A worker process (another "host": its own pool of connections, its own listener) runs an idle ``Pool`` whose
handler prints when each job starts; this process enqueues one job at a time, with a random pause between them so
that the worker is idle and waiting each time, and takes the time from the enqueue's return (its commit) to the
handler's start (both clocks are this machine's). Nine jobs in ten come 20-60 ms after the last, the tenth after
1.6-3 s, when the idle pool's poll interval has grown to ``poll_max``. The two modes alternate, one worker each, in
one invocation:
``wakeups=listen`` (the default) and ``wakeups=poll`` (PgBouncer in transaction mode), where the idle pool's poll
(``poll_max``, 1 s by default) bounds the wait.

    python benchmarks/postgres_wakeup.py [--jobs 300] [--rounds 2] [--quick]

The server is ``$ASYNCQ_BENCH_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``); the script
makes a database of its own and drops it. ``--quick`` (a smoke run) uses schemas of its own in that server's
database instead, drops them, and writes nothing to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._report import environment, markdown_table, percentile, print_table, verdict, write_section  # noqa: E402

T = TypeVar("T")
SERVER = os.environ.get("ASYNCQ_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
TARGET_P99_MS = 50.0
#: A smoke run (``--quick``) not ended by then prints where its tasks and its workers' wait, and fails.
QUICK_BUDGET_S = 80.0
#: How long a worker has to stop after SIGTERM before its tasks are printed and it is killed.
STOP_WAIT_S = 20.0
_workers: list[asyncio.subprocess.Process] = []  # the worker processes alive now (``measure``)

#: Every tenth job comes after a pause this long (s), random, so that the pool has gone idle (its poll interval at
#: ``poll_max``) and the job lands anywhere in its wait.
IDLE_PAUSE = (1.6, 3.0)


async def worker(url: str) -> None:
    """The other host: an idle pool printing ``START <id> <epoch seconds>`` as each handler starts."""
    from asyncq import Pool, Queue

    async with await Queue.open(url) as queue:
        pool = Pool(queue, owner=f"bench-{os.getpid()}", concurrency=4)

        async def handle(body: object, context: object) -> None:
            sys.stdout.write(f"START {getattr(context, 'id', '?')} {time.time():.6f}\n")
            sys.stdout.flush()

        pool.register("default", handle)
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _print_tasks, "worker")
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        await pool.serve(grace=1)


def _print_tasks(who: str) -> None:
    """Every task of this process and where it waits, on stderr (a run that hangs says where)."""
    sys.stderr.write(f"--- {who} (pid {os.getpid()}): its tasks and where they wait\n")
    for task in asyncio.all_tasks():
        sys.stderr.write(f"{task.get_name()}:\n")
        awaited: Any = task.get_coro()
        while awaited is not None:  # the chain of awaits down to the innermost (``cr_await``)
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                sys.stderr.write(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}\n")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    sys.stderr.flush()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the worker and wait for it; one that has not stopped within ``STOP_WAIT_S`` prints its tasks, is
    killed, and the run fails."""
    proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), STOP_WAIT_S)
    except TimeoutError:
        proc.send_signal(signal.SIGUSR1)
        await asyncio.sleep(1)
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"the worker did not stop within {STOP_WAIT_S:.0f} s of SIGTERM") from None


async def measure(url: str, jobs: int, seed: int) -> list[float]:
    """Latencies (ms) of ``jobs`` enqueues, one at a time, to a worker process on ``url``."""
    from asyncq import Queue

    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--worker", url, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert proc.stdout is not None
    _workers.append(proc)
    try:
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"READY"
        print(f"{url.rsplit('=', 1)[-1]}: the worker is ready", file=sys.stderr, flush=True)
        rng = random.Random(seed)
        latencies: list[float] = []
        async with await Queue.open(url) as queue:
            await asyncio.sleep(1.5)  # the pool has gone idle: its poll interval grew to poll_max
            for n in range(jobs):
                await queue.enqueue(f"job-{seed}-{n}", {"n": n})
                committed = time.time()
                line = (await asyncio.wait_for(proc.stdout.readline(), 30)).split()
                assert line[0] == b"START", line
                latencies.append((float(line[2]) - committed) * 1000)
                print(f"job {n} started after {latencies[-1]:.1f} ms", file=sys.stderr, flush=True)
                await asyncio.sleep(rng.uniform(*IDLE_PAUSE) if n % 10 == 9 else rng.uniform(0.02, 0.06))
        return latencies
    finally:
        try:
            await _stop(proc)
        finally:
            _workers.remove(proc)


async def run(jobs: int, rounds: int, *, quick: bool = False) -> dict[str, list[float]]:
    """Each mode's latencies over ``rounds``, in a database made for the run and dropped after it; a ``quick`` run
    uses schemas of its own in ``SERVER``'s database instead and drops them: PostgreSQL's ``DROP DATABASE`` waits
    for an immediate checkpoint of the whole server, which took over 50 s once while other tests wrote to it."""
    import asyncpg

    admin = await asyncpg.connect(SERVER)
    run_id = uuid.uuid4().hex[:8]
    database = f"asyncq_bench_{run_id}"
    if quick:
        base = SERVER
    else:
        await admin.execute(f"CREATE DATABASE {database}")
        base = SERVER.rsplit("/", 1)[0] + "/" + database
    found: dict[str, list[float]] = {"listen": [], "poll": []}
    schemas: list[str] = []
    try:
        for round_ in range(rounds):
            for mode in ("listen", "poll") if round_ % 2 == 0 else ("poll", "listen"):
                schemas.append(f"bench_{mode}_{round_}_{run_id}" if quick else f"bench_{mode}_{round_}")
                url = f"{base}{'&' if '?' in base else '?'}schema={schemas[-1]}&wakeups={mode}"
                found[mode] += await measure(url, jobs, seed=round_ * 2 + (mode == "poll"))
    finally:
        print("dropping what the run made", file=sys.stderr, flush=True)
        if quick:
            for schema in schemas:
                await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        else:
            await admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        await admin.close()
    return found


async def _within(work: Coroutine[Any, Any, T], seconds: float | None) -> T:
    """``work``, which fails after ``seconds`` (``None``: no limit) once this process's tasks and its live workers'
    have been printed (on stderr) with where they wait."""
    if seconds is None:
        return await work
    try:
        return await asyncio.wait_for(work, seconds)
    except TimeoutError:
        _print_tasks("the benchmark")
        for proc in _workers:
            proc.send_signal(signal.SIGUSR1)
        await asyncio.sleep(1)
        raise RuntimeError(f"the run did not end within {seconds:.0f} s (where it waited: above)") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="jobs per mode and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 9 jobs (no long pause), one round, no docs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.worker))
        return
    jobs, rounds = (9, 1) if args.quick else (args.jobs, args.rounds)
    found = asyncio.run(_within(run(jobs, rounds, quick=args.quick), QUICK_BUDGET_S if args.quick else None))
    rows = [
        (mode, len(values), f"{percentile(values, 50):.1f}", f"{percentile(values, 99):.1f}", f"{max(values):.1f}")
        for mode, values in found.items()
    ]
    ok = percentile(found["listen"], 99) <= TARGET_P99_MS
    headers = ["wakeups", "jobs", "p50 ms", "p99 ms", "max ms"]
    title = "enqueue commit -> handler start in another process (PostgreSQL)"
    print_table(title, headers, rows)
    print(f"target: listen p99 <= {TARGET_P99_MS:.0f} ms: {verdict(ok)}")
    if args.quick:
        return
    command = f"python benchmarks/postgres_wakeup.py --jobs {jobs} --rounds {rounds}"
    body = f"""## PostgreSQL wake-ups: enqueue → handler start in another process (`postgres_wakeup`)

`{command}` ({environment()}; PostgreSQL on 127.0.0.1). One job at a time, a worker process
idle and waiting each time: nine in ten 20-60 ms after the last, the tenth after {IDLE_PAUSE[0]}-{IDLE_PAUSE[1]} s
(the pool idle); the modes alternate by round in one invocation. `listen`: LISTEN/NOTIFY (one NOTIFY
per enqueue transaction); `poll`: no LISTEN (PgBouncer in transaction mode), the idle pool polls every
`poll_max` (1 s) once idle, sooner just after a job (its poll interval doubles from `poll_min`).

{markdown_table(headers, rows)}

Target: `listen` p99 ≤ {TARGET_P99_MS:.0f} ms: **{verdict(ok)}**.
"""
    write_section("postgres_wakeup", body)


if __name__ == "__main__":
    main()
