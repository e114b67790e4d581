"""A worker process for tests/test_postgres_faults.py: an ``asyncq.Pool`` on PostgreSQL whose handler appends
``<job id> <token>`` to ``--starts`` (one ``os.write`` per line, before it returns) and sleeps ``--work`` seconds.

    python tests/pg_fault_worker.py --db URL --starts FILE --status FILE [--concurrency 8] [--lease 2]

It runs its pool until SIGTERM and dies with the process that started it (PR_SET_PDEATHSIG). Every 50 ms it writes
its pool's counters (``Pool.counters``) to ``--status`` as JSON (a new file, then ``os.replace``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from asyncq import JobContext, Pool, Queue, RetryPolicy  # noqa: E402
from asyncq.worker.pool import PoolSettings  # noqa: E402

PR_SET_PDEATHSIG = 1


def write_status(path: str, pool: Pool) -> None:
    fresh = f"{path}.{os.getpid()}.tmp"
    with open(fresh, "w") as file:
        json.dump(dataclasses.asdict(pool.counters) | {"pid": os.getpid()}, file)
    os.replace(fresh, path)


async def work(args: argparse.Namespace) -> None:
    starts = os.open(args.starts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    # The server may be down when the worker starts: the pool's open waits for it (Pool.open).
    settings = PoolSettings(
        concurrency=args.concurrency, lease=args.lease, poll_max=0.2, retry=RetryPolicy(base=0.05, cap=0.2)
    )
    pool = await Pool.open(lambda: Queue.open(args.db), settings)

    @pool.handler()
    async def handle(body: Any, context: JobContext) -> None:
        os.write(starts, f"{context.id} {context.token}\n".encode())
        await asyncio.sleep(args.work)

    done = asyncio.Event()

    async def report() -> None:
        while not done.is_set():
            write_status(args.status, pool)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.05)

    reporter = asyncio.ensure_future(report())
    try:
        await pool.serve(grace=5.0)
    finally:
        done.set()
        await reporter
        write_status(args.status, pool)
        await pool.queue.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--starts", required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--work", type=float, default=0.002)
    args = parser.parse_args()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(work(args))


if __name__ == "__main__":
    main()
