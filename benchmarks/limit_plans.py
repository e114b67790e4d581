"""A limited queue's claim at depth on both stores (docs/benchmarks.md, "Limits").

    .venv/bin/python benchmarks/limit_plans.py [--depth 1000000] [--url postgresql://postgres@127.0.0.1:5432/test]

fills a fresh SQLite file and a fresh PostgreSQL schema with ``--depth`` pending jobs of one queue over 97 limit keys
and eleven priorities (the first job of each key leased: every key at a per-key limit of 1), then prints the plans of
the limited claim's statements (the window walk and the key walk) and the time of one limited claim of 10 through the
driver's own path (its limits read, the live leases counted, both walks, in a transaction rolled back; the median of
seven). Then the case
a per-key limit must not make costly: one key at its limit whose backlog (``--ahead`` sizes) ranks ahead of another
key's job, which the claim must find. ``tests/test_claim_plans.py`` checks the plans at a smaller depth.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from asyncq.queue import Queue
from asyncq.store.postgres import limits as pg_limits
from asyncq.store.postgres.connection import parse_url
from asyncq.store.sqlite import limits as sq_limits

NOW = 10_000_000
COLUMNS = (
    "id, queue, body, status, attempts, max_attempts, token, available_at, deadline, priority, limit_key, owner,"
    " lease_until"
)
# The first 97 jobs are leased until after NOW, one of each key: every key is at a per-key limit of 1.
ROW = (
    "'j' || i, 'q1', '{}', CASE WHEN i <= 97 THEN 'leased' ELSE 'pending' END, 0, 3, 0, i, 10000000000000,"
    " i % 11 - 5, 'k' || (i % 97), CASE WHEN i <= 97 THEN 'o' END, CASE WHEN i <= 97 THEN 20000000 END"
)
# One key at its limit (a live lease) with a backlog ranked ahead of everything (priority 9), then jobs of others.
AHEAD = "'big' || i, 'q1', '{}', 'pending', 0, 3, 0, i, 10000000000000, 9, 'big', NULL, NULL"
HOLDER = "'big-holder', 'q1', '{}', 'leased', 1, 3, 1, 0, 10000000000000, 9, 'big', 'o', 20000000"
BEHIND = "'behind', 'q1', '{}', 'pending', 0, 3, 0, 1, 10000000000000, -4, 'k1', NULL, NULL"
LIMITS = "INSERT INTO {queues} (queue, limit_per_key) VALUES ('q1', 1)"


RUNS = 7


def sqlite_claim_ms(con: sqlite3.Connection) -> tuple[int, float]:
    """One limited claim of 10, the median of ``RUNS`` (each rolled back): the jobs it took and its ms."""
    params = {"now": NOW, "owner": "o", "lease_ms": 1000}
    times, taken = [], 0
    for _ in range(RUNS):
        con.execute("BEGIN IMMEDIATE")
        started = time.perf_counter()
        done = sq_limits.claim_limited(con, "q1", 10, True, params)
        times.append(time.perf_counter() - started)
        con.execute("ROLLBACK")
        assert done is not None
        taken = len(done[0])
    return taken, statistics.median(times) * 1000


def sqlite_file(rows: str, count: int) -> sqlite3.Connection:
    path = Path(tempfile.mkdtemp(prefix="asyncq-limits-")) / "deep.db"
    asyncio.run(_create(str(path)))
    con = sqlite3.connect(path, isolation_level=None)
    series = "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) SELECT i FROM n)"
    con.execute(f"INSERT INTO asyncq_jobs ({COLUMNS}) SELECT {rows} FROM {series}", (count,))
    con.execute(LIMITS.format(queues="asyncq_queues"))
    return con


async def _create(target: str) -> None:
    async with await Queue.open(target):
        pass


def sqlite_report(depth: int, ahead: list[int]) -> None:
    con = sqlite_file(ROW, depth)
    con.execute("ANALYZE")
    params = {"now": NOW, "owner": "o", "lease_ms": 1000, "limit": 10, "queue": "q1", "per_key": 1, "window": 128}
    for name in ("CLAIM_LIMITED", "CLAIM_BY_KEYS"):
        print(f"SQLite {sqlite3.sqlite_version}, {depth:,} pending jobs, 97 keys: EXPLAIN QUERY PLAN of {name}")
        for row in con.execute("EXPLAIN QUERY PLAN " + getattr(sq_limits, name), params):
            print(f"  {row[0]:>4} {row[1]:>4}  {row[3]}")
    taken, spent = sqlite_claim_ms(con)
    print(f"  one limited claim of {taken} (limits, live leases, claim): {spent:.2f} ms")
    con.close()
    for backlog in ahead:
        con = sqlite_file(AHEAD, backlog)
        con.execute(f"INSERT INTO asyncq_jobs ({COLUMNS}) VALUES ({HOLDER})")
        con.execute(f"INSERT INTO asyncq_jobs ({COLUMNS}) VALUES ({BEHIND})")
        con.execute("ANALYZE")
        taken, spent = sqlite_claim_ms(con)
        print(f"  a full key's {backlog:,} jobs ranked ahead: one limited claim of {taken}: {spent:.2f} ms")
        con.close()


async def postgres_schema(server: str, rows: str, count: int) -> tuple[asyncpg.Connection, str]:
    url = f"{server}?schema=limits_{uuid.uuid4().hex[:8]}"
    await _create(url)
    target = parse_url(url)
    conn = await asyncpg.connect(target.dsn)
    await conn.execute(
        f"INSERT INTO {target.schema}.jobs ({COLUMNS}) SELECT {rows} FROM generate_series(1, $1) i", count
    )
    await conn.execute(LIMITS.format(queues=f"{target.schema}.queues"))
    return conn, target.schema


async def postgres_claim_ms(conn: asyncpg.Connection, schema: str) -> tuple[int, float]:
    """One limited claim of 10, the median of ``RUNS`` (each rolled back; the first prepares the statements, as a
    pool's connection does once): the jobs it took and its ms."""
    times, taken = [], 0
    for _ in range(RUNS):
        tx = conn.transaction()
        await tx.start()
        started = time.perf_counter()
        done = await pg_limits.claim_limited(conn, schema, "q1", 10, True, (NOW, "o", 1000), True)
        times.append(time.perf_counter() - started)
        await tx.rollback()
        assert done is not None
        taken = len(done[0])
    return taken, statistics.median(times) * 1000


async def postgres_report(depth: int, ahead: list[int], server: str) -> None:
    conn, schema = await postgres_schema(server, ROW, depth)
    try:
        await conn.execute(f"VACUUM ANALYZE {schema}.jobs")
        for name, extra in (("CLAIM_LIMITED", (128,)), ("CLAIM_BY_KEYS", ())):
            print(f"PostgreSQL, {depth:,} pending jobs, 97 keys: EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) of {name}")
            statement = getattr(pg_limits, name).format(schema=schema)
            tx = conn.transaction()
            await tx.start()
            for row in await conn.fetch("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) " + statement,
                                        "q1", NOW, 10, "o", 1000, 1, *extra):  # fmt: skip
                print(f"  {row[0]}")
            await tx.rollback()
        taken, spent = await postgres_claim_ms(conn, schema)
        print(f"  one limited claim of {taken} (lock, live leases, claim): {spent:.2f} ms")
    finally:
        await conn.execute(f"DROP SCHEMA {schema} CASCADE")
        await conn.close()
    for backlog in ahead:
        conn, schema = await postgres_schema(server, AHEAD, backlog)
        try:
            await conn.execute(f"INSERT INTO {schema}.jobs ({COLUMNS}) VALUES ({HOLDER})")
            await conn.execute(f"INSERT INTO {schema}.jobs ({COLUMNS}) VALUES ({BEHIND})")
            await conn.execute(f"VACUUM ANALYZE {schema}.jobs")
            taken, spent = await postgres_claim_ms(conn, schema)
            print(f"  a full key's {backlog:,} jobs ranked ahead: one limited claim of {taken}: {spent:.2f} ms")
        finally:
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")
            await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=1_000_000)
    parser.add_argument("--ahead", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    sqlite_report(args.depth, args.ahead)
    asyncio.run(postgres_report(args.depth, args.ahead, args.url))


if __name__ == "__main__":
    main()
