"""A worker process for the graph tests (``tests/test_graph_processes.py``), and the effects file its handler writes.

    python tests/graph_children.py --store TARGET --effects EFFECTS.db --owner W [--concurrency N] [--lease-ms MS]

serves a ``Pool`` on the store's ``default`` queue until SIGTERM. Each start of a handler is a row of ``started``
``(id, token, owner, early)`` in the effects file (SQLite, WAL, autocommit), written before the job's own work:

- a job whose body names ``needs`` (a dependant) reads each of those jobs: ``early`` is 1 if one has not ended done;
- a group's callback (its body carries the ``group`` outcome) reads the group and its members: ``early`` is 1 if the
  group is not complete or a member has not ended, or if the outcome in its body differs from the stored one;
- a body with ``fail`` raises ``Permanent`` after a short wait; every other job waits ``ms`` milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

EFFECTS_DDL = """CREATE TABLE IF NOT EXISTS started (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL,
  token INTEGER NOT NULL, owner TEXT NOT NULL, early INTEGER NOT NULL, at REAL NOT NULL)"""


def open_effects(path: str | Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, timeout=30, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute(EFFECTS_DDL)
    return con


async def early(queue: Any, body: dict[str, Any]) -> bool:
    """Whether this start came before what the job waits for had ended."""
    if "needs" in body:
        jobs = [await queue.get(job_id) for job_id in body["needs"]]
        return any(job is None or job.status != "done" for job in jobs)
    if "group" in body:
        outcome = body["group"]
        group = await queue.group(outcome["name"])
        members = await queue.group_members(outcome["name"], limit=1000)
        if group is None or not group.complete or any(job.status not in ("done", "dead") for job in members):
            return True
        return (group.members, group.done, group.dead) != (outcome["members"], outcome["done"], outcome["dead"])
    return False


async def serve(args: argparse.Namespace) -> None:
    from asyncq import Permanent
    from asyncq.queue import Queue
    from asyncq.worker.pool import JobContext, Pool, RetryPolicy

    effects = open_effects(args.effects)
    try:
        async with await Queue.open(args.store) as queue:

            async def handle(body: Any, context: JobContext) -> None:
                was_early = await early(queue, body)
                row = (context.id, context.token, args.owner, int(was_early), time.time())
                effects.execute("INSERT INTO started (id, token, owner, early, at) VALUES (?, ?, ?, ?, ?)", row)
                await asyncio.sleep(body.get("ms", 20) / 1000)
                if body.get("fail"):
                    raise Permanent("this job fails")

            pool = Pool(queue, owner=args.owner, concurrency=args.concurrency, lease=args.lease_ms / 1000,
                        poll_max=0.05, retry=RetryPolicy(jitter=lambda: 0.0))  # fmt: skip
            pool.register("default", handle)
            await pool.serve(grace=2.0)
    finally:
        effects.close()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="graph_children.py")
    parser.add_argument("--store", required=True)
    parser.add_argument("--effects", required=True)
    parser.add_argument("--owner", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease-ms", type=int, default=1_000)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
