"""A worker process for the limits tests (``tests/test_limits_processes.py``), and the log its handler writes.

    python tests/limits_children.py --store PATH|URL --log LOG.db --owner W [--concurrency N] [--lease-ms MS]
        [--handler-seconds S] [--poll-max S]

runs ``Pool.serve()`` on the queue ``limited`` of the store until SIGTERM or SIGINT, then prints its counters as
one JSON line on stdout. It prints ``ready`` on stdout once its pool runs. It works from any directory: the
repository root is put first on ``sys.path``.

The handler keeps its own log in a SQLite file of its own (not the store): one ``runs`` row per attempt with the
job's id, the worker, when the store claimed it (``claimed_ms``: its lease's end less the lease, the store's own
clock, exact to the millisecond), when the handler started and ended (``time.time()``, the same clock for every
process of the host) and the lease's end (``lease_until``). A row whose ``ended`` is NULL is an attempt whose worker
died during it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

LOG_DDL = """CREATE TABLE IF NOT EXISTS runs (id TEXT NOT NULL, owner TEXT NOT NULL, claimed_ms INTEGER NOT NULL,
  lease_until INTEGER NOT NULL, started REAL NOT NULL, ended REAL, PRIMARY KEY (id, claimed_ms))"""
START = "INSERT INTO runs (id, owner, claimed_ms, lease_until, started) VALUES (?, ?, ?, ?, ?)"
END = "UPDATE runs SET ended = ? WHERE id = ? AND claimed_ms = ?"


def open_log(path: str | Path) -> sqlite3.Connection:
    """The handlers' log, in autocommit mode, WAL, its table created."""
    con = sqlite3.connect(path, timeout=30, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute(LOG_DDL)
    return con


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="limits_children.py")
    parser.add_argument("--store", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--owner", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease-ms", type=int, default=10_000)
    parser.add_argument("--handler-seconds", type=float, default=0.0)
    parser.add_argument("--poll-max", type=float, default=0.5)
    return parser.parse_args(argv)


async def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    from asyncq.queue import Queue
    from asyncq.worker.pool import JobContext, Pool

    log = open_log(args.log)

    async def handle(body: Any, context: JobContext) -> None:
        claimed_ms = context.lease_until - args.lease_ms
        log.execute(START, (context.id, args.owner, claimed_ms, context.lease_until, time.time()))
        if args.handler_seconds:
            await asyncio.sleep(args.handler_seconds)  # the job's own work
        log.execute(END, (time.time(), context.id, claimed_ms))

    try:
        async with await Queue.open(args.store) as queue:
            pool = Pool(queue, owner=args.owner, concurrency=args.concurrency, lease=args.lease_ms / 1000,
                        poll_max=args.poll_max)  # fmt: skip
            pool.register("limited", handle)
            sys.stdout.write("ready\n")
            sys.stdout.flush()
            await pool.serve(grace=5.0)
    finally:
        log.close()
    counters = pool.counters
    return {"claimed": counters.claimed, "finished": counters.finished, "commits": counters.commits}


def main(argv: list[str]) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    counters = asyncio.run(run_worker(args))
    sys.stdout.write(json.dumps(counters) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
