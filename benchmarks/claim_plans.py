"""The product's claim plan at depth on both stores (docs/benchmarks.md, "The claim with priorities").

    .venv/bin/python benchmarks/claim_plans.py [--depth 1000000] [--url postgresql://postgres@127.0.0.1:5432/test]

fills a fresh SQLite file and a fresh PostgreSQL schema with ``--depth`` pending jobs over three queues and eleven
priorities, then prints ``EXPLAIN QUERY PLAN`` (SQLite) and ``EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF)``
(PostgreSQL: it runs the claim, on a schema dropped after) of one claim of 10 jobs, and the SQLite claim's time
(in a transaction rolled back). ``tests/test_claim_plans.py`` checks the same plans at a smaller depth.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from asyncq.queue import Queue
from asyncq.store.postgres.connection import parse_url
from asyncq.store.postgres.statements import sql as pg_sql
from asyncq.store.sqlite.schema import PRODUCT
from asyncq.store.sqlite.statements import sql

NOW = 10_000_000
COLUMNS = "id, queue, body, status, attempts, max_attempts, token, available_at, deadline, priority"
ROW = "'j' || i, 'q' || (i % 3), '{}', 'pending', 0, 3, 0, i, 10000000000000, i % 11 - 5"


async def sqlite_plan(depth: int) -> None:
    path = Path(tempfile.mkdtemp(prefix="asyncq-plans-")) / "deep.db"
    async with await Queue.open(str(path)):
        pass
    con = sqlite3.connect(path, isolation_level=None)
    con.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
        f" INSERT INTO asyncq_jobs ({COLUMNS}) SELECT {ROW} FROM n",
        (depth,),
    )
    con.execute("ANALYZE")
    params = {"now": NOW, "owner": "o", "lease_ms": 1000, "limit": 10, "count": 1, "queue": "q1"}
    print(f"SQLite {sqlite3.sqlite_version}, {depth:,} pending jobs: EXPLAIN QUERY PLAN of one claim of 10")
    for row in con.execute("EXPLAIN QUERY PLAN " + sql(PRODUCT, PRODUCT.claim), params):
        print(f"  {row[0]:>4} {row[1]:>4}  {row[3]}")
    con.execute("BEGIN IMMEDIATE")
    started = time.perf_counter()
    claimed = con.execute(sql(PRODUCT, PRODUCT.claim), params).fetchall()
    spent = time.perf_counter() - started
    con.execute("ROLLBACK")
    print(f"  one claim of {len(claimed)}: {spent * 1000:.2f} ms")
    con.close()


async def postgres_plan(depth: int, server: str) -> None:
    url = f"{server}?schema=plans_{uuid.uuid4().hex[:8]}"
    async with await Queue.open(url):
        pass
    target = parse_url(url)
    conn = await asyncpg.connect(target.dsn)
    try:
        await conn.execute(
            f"INSERT INTO {target.schema}.jobs ({COLUMNS}) SELECT {ROW} FROM generate_series(1, $1) i", depth
        )
        await conn.execute(f"VACUUM ANALYZE {target.schema}.jobs")
        print(f"PostgreSQL, {depth:,} pending jobs: EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) of one claim of 10")
        async with conn.transaction():
            explain = "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) " + pg_sql(target.schema, "CLAIM")
            for row in await conn.fetch(explain, "q1", NOW, 10, "o", 1000, 1):
                print(f"  {row[0]}")
    finally:
        await conn.execute(f"DROP SCHEMA {target.schema} CASCADE")
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=1_000_000)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    asyncio.run(sqlite_plan(args.depth))
    asyncio.run(postgres_plan(args.depth, args.url))


if __name__ == "__main__":
    main()
