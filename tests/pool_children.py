"""A worker process for the pool tests, and the effects table its handler writes.

    python tests/pool_children.py worker --db QUEUE.db --effects EFFECTS.db [--owner W] [--concurrency N]
        [--lease-ms MS] [--handler-seconds S] [--grace S] [--poll-max S]

runs ``Pool.serve(grace=…)`` on the queue file until SIGTERM or SIGINT, then prints its counters as one JSON
line on stdout. It works from any directory: the repository root (``Path(__file__).resolve().parents[1]``)
is put first on ``sys.path``.

The handler is the job's "effect", kept in a SQLite file of its own (not the queue's):

- ``started``: one row each time a handler starts, ``(id, token, owner)``;
- a job whose body is ``{"poison": true}`` SIGKILLs the worker process as soon as its start is recorded;
- ``applied``: one row per job id (the primary key) with a ``count`` of applications. The handler waits
  ``--handler-seconds``, then upserts ``count = count + 1``. A job applied twice (its effect committed, its
  finish lost with the process) shows ``count = 2`` instead of a second row: the duplicate is absorbed and
  counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

EFFECTS_DDL = (
    """CREATE TABLE IF NOT EXISTS started (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL,
  token INTEGER NOT NULL, owner TEXT NOT NULL, at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS applied (id TEXT PRIMARY KEY, token INTEGER NOT NULL, owner TEXT NOT NULL,
  count INTEGER NOT NULL, at REAL NOT NULL)""",
)
RECORD_START = "INSERT INTO started (id, token, owner, at) VALUES (?, ?, ?, ?)"
RECORD_APPLIED = """INSERT INTO applied (id, token, owner, count, at) VALUES (?, ?, ?, 1, ?)
ON CONFLICT (id) DO UPDATE SET count = count + 1"""


def open_effects(path: str | Path) -> sqlite3.Connection:
    """The effects file, in autocommit mode (each statement is its own transaction), WAL, tables created."""
    con = sqlite3.connect(path, timeout=30, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    for statement in EFFECTS_DDL:
        con.execute(statement)
    return con


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pool_children.py")
    modes = parser.add_subparsers(dest="mode", required=True)
    worker = modes.add_parser("worker", help="serve a pool on the queue file until SIGTERM")
    worker.add_argument("--db", required=True)
    worker.add_argument("--effects", required=True)
    worker.add_argument("--owner", default="worker")
    worker.add_argument("--concurrency", type=int, default=8)
    worker.add_argument("--lease-ms", type=int, default=5_000)
    worker.add_argument("--handler-seconds", type=float, default=0.0)
    worker.add_argument("--grace", type=float, default=5.0)
    worker.add_argument("--poll-max", type=float, default=0.2)
    return parser.parse_args(argv)


async def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    from asyncq.queue import Queue
    from asyncq.worker.pool import JobContext, Pool, RetryPolicy

    effects = open_effects(args.effects)

    async def apply(body: Any, context: JobContext) -> None:
        effects.execute(RECORD_START, (context.id, context.token, args.owner, time.time()))
        if isinstance(body, dict) and body.get("poison"):  # a job that kills its worker every time it runs
            os.kill(os.getpid(), signal.SIGKILL)
        if args.handler_seconds:
            await asyncio.sleep(args.handler_seconds)  # the job's own work
        effects.execute(RECORD_APPLIED, (context.id, context.token, args.owner, time.time()))

    try:
        async with await Queue.open(args.db) as queue:
            pool = Pool(
                queue,
                owner=args.owner,
                concurrency=args.concurrency,
                lease=args.lease_ms / 1000,
                poll_max=args.poll_max,
                retry=RetryPolicy(jitter=lambda: 0.0),
            )
            pool.register("default", apply)
            await pool.serve(grace=args.grace)
    finally:
        effects.close()
    counters = pool.counters
    return {
        "claimed": counters.claimed,
        "finished": counters.finished,
        "stale_finishes": counters.stale_finishes,
        "leases_lost": counters.leases_lost,
        "handler_errors": counters.handler_errors,
        "cancels_requested": counters.cancels_requested,
        "cancelled": counters.cancelled,
    }


def main(argv: list[str]) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    counters = asyncio.run(run_worker(args))
    sys.stdout.write(json.dumps(counters) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
