"""One worker host of tests/test_many_hosts.py: an ``asyncq.Pool`` on PostgreSQL (a ``Queue`` with its own asyncpg
pool) delivering every job over HTTP to the receiver (``HttpTransport`` + ``deliver_with``).

    python tests/many_hosts_worker.py --db URL --receiver URL --owner NAME --status FILE
        [--concurrency 16] [--lease 2] [--delivery-timeout 1.5]

It runs its pool until SIGTERM (then stops claiming; jobs in flight finish), and dies with the process that
started it (PR_SET_PDEATHSIG).
Every 50 ms, and once more when it stops, it writes its pool's counters (``Pool.counters``: stale finishes, lost
leases, commits …) and how many handlers run to ``--status`` as JSON (a new file, then ``os.replace``): what it
counted survives its SIGKILL up to the last write.
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
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from asyncq import HttpTransport, Pool, Queue, RetryPolicy, deliver_with  # noqa: E402

STATUS_EVERY = 0.05
PR_SET_PDEATHSIG = 1


def write_status(path: str, pool: Pool, *, ended: bool) -> None:
    status = dataclasses.asdict(pool.counters) | {"running": pool.running, "pid": os.getpid(), "ended": ended}
    fresh = f"{path}.{os.getpid()}.tmp"
    with open(fresh, "w") as file:
        json.dump(status, file)
    os.replace(fresh, path)


async def report(path: str, pool: Pool, done: asyncio.Event) -> None:
    while not done.is_set():
        write_status(path, pool, ended=False)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), STATUS_EVERY)


async def work(args: argparse.Namespace) -> None:
    host = urlsplit(args.receiver).hostname
    transport = HttpTransport(args.receiver, allowed_hosts=[host], timeout=args.delivery_timeout)
    queue = await Queue.open(args.db)
    try:
        # Retries come back fast: a delivery cut off by the test's faults is tried again within half a second.
        pool = Pool(
            queue,
            concurrency=args.concurrency,
            owner=args.owner,
            lease=args.lease,
            poll_max=0.2,
            retry=RetryPolicy(base=0.05, cap=0.5),
        )
        pool.register("default", deliver_with(transport))
        # SIGTERM stops claiming and lets the jobs in flight finish; handled before the first status is written,
        # so a process that has written one never dies of the signal.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, pool.stop)
        done = asyncio.Event()
        reporter = asyncio.create_task(report(args.status, pool, done))
        try:
            await pool.run()
        finally:
            done.set()
            await reporter
            write_status(args.status, pool, ended=True)
    finally:
        await transport.close()
        await queue.close()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="many_hosts_worker.py")
    parser.add_argument("--db", required=True, help="the queue's postgresql:// URL")
    parser.add_argument("--receiver", required=True, help="the receiver's URL")
    parser.add_argument("--owner", required=True)
    parser.add_argument("--status", required=True, help="the JSON file the counters are written to")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--lease", type=float, default=2.0, help="seconds")
    parser.add_argument("--delivery-timeout", type=float, default=1.5, help="seconds")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # never outlive the test
    args = parse(argv)
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(work(args))


if __name__ == "__main__":
    main()
