"""The product's claim stays an index seek at depth on both stores (docs/benchmarks.md, "The claim with
priorities"): each branch of the claim seeks its own index in its own order, with no scan of the jobs and no sort
of them (the only sorts are of the few rows the branches found: the expired leases, and the branches' union)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from asyncq.queue import Queue
from asyncq.store.postgres.connection import parse_url
from asyncq.store.postgres.statements import sql as pg_sql
from asyncq.store.sqlite.schema import PRODUCT
from asyncq.store.sqlite.statements import sql

pytestmark = pytest.mark.timeout(120)

DEPTH = 30_000  # deep enough for the planners to prefer an index; the plans at 1M are in docs/benchmarks.md
NOW = 10_000_000


# The late jobs (``max_wait``) in ready-time order: the default priority's range of the ranked index, the others'
# in the prioritised one (SQLite schema version 16).
LATE_SEEKS = (
    "USING INDEX asyncq_jobs_ranked (queue=? AND priority=? AND available_at<?)",
    "USING INDEX asyncq_jobs_prioritised (queue=? AND available_at<?)",
)


def sqlite_plan(con: sqlite3.Connection) -> list[tuple[int, int, str]]:
    params = {"now": NOW, "owner": "o", "lease_ms": 1000, "limit": 10, "count": 1, "queue": "q1"}
    return [
        (row[0], row[1], row[3]) for row in con.execute("EXPLAIN QUERY PLAN " + sql(PRODUCT, PRODUCT.claim), params)
    ]


def children(plan: list[tuple[int, int, str]], parent: int) -> list[str]:
    return [detail for _id, up, detail in plan if up == parent]


async def test_the_sqlite_claim_seeks_the_ranked_and_prioritised_indexes_without_sorting_jobs(tmp_path: Path) -> None:
    path = tmp_path / "deep.db"
    async with await Queue.open(str(path)):
        pass
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
            " INSERT INTO asyncq_jobs (id, queue, body, status, attempts, max_attempts, token, available_at, deadline,"
            " priority) SELECT 'j' || i, 'q' || (i % 3), '{}', 'pending', 0, 3, 0, i, 10000000000000, i % 11 - 5"
            " FROM n",
            (DEPTH,),
        )
        con.execute("ANALYZE")
        plan = sqlite_plan(con)
    finally:
        con.close()
    lines = [detail for _id, _up, detail in plan]
    assert not [line for line in lines if line.startswith("SCAN asyncq_jobs")], lines
    ranked = [node for node, _up, detail in plan if "USING INDEX asyncq_jobs_ranked (queue=?)" in detail]
    late = [node for node, _up, detail in plan if any(seek in detail for seek in LATE_SEEKS)]
    assert len(ranked) == 1 and len(late) == 2, lines
    for node in ranked + late:  # the branch's co-routine sorts nothing: the index is in the branch's order
        parent = next(up for id_, up, _d in plan if id_ == node)
        assert not [line for line in children(plan, parent) if "TEMP B-TREE" in line], lines


def _pg_plan_text(rows: list[Any]) -> str:
    return "\n".join(row[0] for row in rows)


async def test_the_postgresql_claim_seeks_the_ranked_and_waiting_indexes_without_sorting_jobs(
    postgres_url: str,
) -> None:
    async with await Queue.open(postgres_url):
        pass
    target = parse_url(postgres_url)
    conn = await asyncpg.connect(target.dsn, timeout=5)
    try:
        await conn.execute(
            f"INSERT INTO {target.schema}.jobs (id, queue, body, status, attempts, max_attempts, token, available_at,"
            " deadline, priority) SELECT 'j' || i, 'q' || (i % 3), '{}', 'pending', 0, 3, 0, i, 10000000000000,"
            " i % 11 - 5 FROM generate_series(1, $1) i",
            DEPTH,
        )
        await conn.execute(f"ANALYZE {target.schema}.jobs")
        plan = _pg_plan_text(
            await conn.fetch("EXPLAIN (COSTS OFF) " + pg_sql(target.schema, "CLAIM"), "q1", NOW, 10, "o", 1000, 1)
        )
    finally:
        await conn.close()
    assert "Seq Scan on jobs" not in plan, plan
    assert "Index Scan using jobs_ranked on jobs" in plan and "Index Scan using jobs_waiting on jobs" in plan, plan
    # The sorts are of the branches' few rows (the expired leases, the union), never of the pending jobs: no sort
    # sits under the pending branch's LockRows.
    pending = plan.split("CTE pending", 1)[1].split("CTE expired", 1)[0]
    assert "Sort" not in pending and "jobs_ranked" in pending, plan
    late = plan.split("CTE late", 1)[1].split("CTE pending", 1)[0]
    assert "Sort" not in late and "jobs_waiting" in late, plan


# A retention step is one seek of the ended jobs' index too, at depth (docs/flow-control.md, "Retention"): the
# deep table holds pending jobs, done jobs of three queues, and dead ones, most of them of one of three tasks and a
# fifth of none; a step's plan walks one queue's one task's (or no task's) one state and stops at its batch, and the
# groups are found by skipping through the same index (one seek per queue and per task).
_FINISHED = (
    "SELECT 'j' || i, 'q' || (i % 3), '{{}}', CASE WHEN i % 4 = 0 THEN 'pending' WHEN i % 4 = 3 THEN 'dead'"
    " ELSE 'done' END, 1, 3, 1, i, 10000000000000, CASE WHEN i % 4 = 3 THEN 'permanent' END,"
    " CASE WHEN i % 5 = 0 THEN NULL ELSE 't' || (i % 7 % 3) END FROM {series}"
)
CUTOFF = DEPTH // 10  # a tenth of the finished jobs has expired: the pool's steady state, a step's batch or two
_FINISHED_COLUMNS = "(id, queue, body, status, attempts, max_attempts, token, available_at, deadline, reason, task)"
#: The cells and groups whose step plans are checked: (status, reason, task).
_CELLS = [("done", None, "t1"), ("dead", "permanent", "t1"), ("done", None, None), ("dead", "permanent", None)]


async def test_the_sqlite_retention_step_seeks_the_retained_index(tmp_path: Path) -> None:
    from asyncq.store.sqlite.retention import EXPIRED_SEQS, QUEUES_ENDED, TASKS_ENDED, UNTASKED_ENDED

    path = tmp_path / "deep.db"
    async with await Queue.open(str(path)):
        pass
    con = sqlite3.connect(path, isolation_level=None)
    try:
        series = "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) SELECT i FROM n)"
        con.execute(f"INSERT INTO asyncq_jobs {_FINISHED_COLUMNS} " + _FINISHED.format(series=series), (DEPTH,))
        con.execute("ANALYZE")
        plans = []
        for status, reason, task in _CELLS:
            params = {"queue": "q1", "status": status, "reason": reason, "task": task, "cutoff": CUTOFF}
            params |= {"now": NOW, "limit": 500}
            plans.append([row[3] for row in con.execute("EXPLAIN QUERY PLAN " + EXPIRED_SEQS, params)])
        groups = [
            [row[3] for row in con.execute("EXPLAIN QUERY PLAN " + statement, {"queue": "q1"})]
            for statement in (QUEUES_ENDED, TASKS_ENDED, UNTASKED_ENDED)
        ]
    finally:
        con.close()
    for lines in plans:
        seek = "USING INDEX asyncq_jobs_retained (queue=? AND task=? AND status=? AND reason=? AND available_at<?)"
        assert any(seek in line for line in lines), lines
        assert not [line for line in lines if line.startswith("SCAN") or "TEMP B-TREE" in line], lines
    for lines in groups:  # every read of the jobs is of the index (the first queue: its first entry, in index order
        # under LIMIT 1; every other step a seek), never of the table, never a sort
        reads = [line for line in lines if "asyncq_jobs" in line]
        assert reads and all("COVERING INDEX asyncq_jobs_retained" in line for line in reads), lines
        assert [line for line in reads if line.startswith("SCAN")] in ([], [reads[0]]), lines
        assert "TEMP B-TREE" not in str(lines) and "SEARCH" in reads[-1], lines


async def test_the_postgresql_retention_step_seeks_the_retained_index(postgres_url: str) -> None:
    from asyncq.store.postgres.admin import q
    from asyncq.store.postgres.retention import EXPIRED_BATCH, QUEUES_ENDED, TASKS_ENDED, UNTASKED_ENDED

    async with await Queue.open(postgres_url):
        pass
    target = parse_url(postgres_url)
    conn = await asyncpg.connect(target.dsn, timeout=5)
    try:
        rows = _FINISHED.format(series="generate_series(1, $1) i").replace("{}", "{{}}").format()
        await conn.execute(f"INSERT INTO {target.schema}.jobs {_FINISHED_COLUMNS} {rows}", DEPTH)
        await conn.execute(f"ANALYZE {target.schema}.jobs")
        plans = []
        for status, reason, task in _CELLS:
            statement = "EXPLAIN (COSTS OFF) " + q(EXPIRED_BATCH[reason is None, task is None], target.schema)
            plans.append(_pg_plan_text(await conn.fetch(statement, "q1", status, CUTOFF, NOW, 500, reason, task)))
        groups = [_pg_plan_text(await conn.fetch("EXPLAIN (COSTS OFF) " + q(QUEUES_ENDED, target.schema)))]
        for statement in (TASKS_ENDED, UNTASKED_ENDED):
            groups.append(_pg_plan_text(await conn.fetch("EXPLAIN (COSTS OFF) " + q(statement, target.schema), "q1")))
    finally:
        await conn.close()
    for plan in plans:
        _check_retention_plan(plan)
    for plan in groups:  # each read of the jobs is a seek of the index (an index-only scan), never the table
        assert "jobs_retained" in plan and "Seq Scan" not in plan and "Sort" not in plan, plan


def _check_retention_plan(plan: str) -> None:
    doomed = plan.split("CTE doomed", 1)[1].split("CTE ", 1)[0]
    # A plain or bitmap scan of the range of jobs_retained that holds the expired rows (the planner picks by their
    # number), never the table; each result looked up by its key; nothing sorted.
    assert "Index Scan on jobs_retained" in doomed or "Index Scan using jobs_retained on jobs" in doomed, plan
    assert "Seq Scan on jobs" not in doomed and "Sort" not in doomed, plan
    assert "Seq Scan on results" not in doomed and "results_pkey" in doomed, plan


# A limited queue's claim (docs/flow-control.md, "Limits") keeps the plain claim's seeks, under the per-key limit:
# each branch steps over a full key's jobs in its own index, and the live leases it counts (of the queue, per key)
# are one range of the leased index. The deep table holds pending jobs of 97 keys and some live leases.
_LIMITED_ROWS = (
    "SELECT 'j' || i, 'q' || (i % 3), '{{}}', CASE WHEN i % 50 = 0 THEN 'leased' ELSE 'pending' END, 0, 3, 0, i,"
    " 10000000000000, i % 11 - 5, 'k' || (i % 97), CASE WHEN i % 50 = 0 THEN 'o' END,"
    " CASE WHEN i % 50 = 0 THEN 20000000 END FROM {series}"
)
_LIMITED_COLUMNS = (
    "(id, queue, body, status, attempts, max_attempts, token, available_at, deadline, priority, limit_key, owner,"
    " lease_until)"
)


async def test_the_sqlite_limited_claim_seeks_the_same_indexes_and_one_range_of_live_leases(tmp_path: Path) -> None:
    from asyncq.store.sqlite.limits import CLAIM_BY_KEYS, CLAIM_LIMITED, LIVE_LEASES

    path = tmp_path / "deep.db"
    async with await Queue.open(str(path)):
        pass
    con = sqlite3.connect(path, isolation_level=None)
    try:
        series = "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) SELECT i FROM n)"
        con.execute(f"INSERT INTO asyncq_jobs {_LIMITED_COLUMNS} " + _LIMITED_ROWS.format(series=series), (DEPTH,))
        con.execute("ANALYZE")
        params = {"now": NOW, "owner": "o", "lease_ms": 1000, "limit": 10, "queue": "q1", "per_key": 1, "window": 128}
        plan = [(row[0], row[1], row[3]) for row in con.execute("EXPLAIN QUERY PLAN " + CLAIM_LIMITED, params)]
        live = [row[3] for row in con.execute("EXPLAIN QUERY PLAN " + LIVE_LEASES, params)]
        by_keys = [row[3] for row in con.execute("EXPLAIN QUERY PLAN " + CLAIM_BY_KEYS, params)]
    finally:
        con.close()
    lines = [detail for _id, _up, detail in plan]
    assert not [line for line in lines if line.startswith("SCAN asyncq_jobs")], lines
    ranked = [node for node, _up, detail in plan if "USING INDEX asyncq_jobs_ranked (queue=?)" in detail]
    late = [node for node, _up, detail in plan if any(seek in detail for seek in LATE_SEEKS)]
    assert len(ranked) == 1 and len(late) == 2, lines
    for node in ranked + late:  # each branch still walks its index in its own order: no sort of the jobs
        parent = next(up for id_, up, _d in plan if id_ == node)
        assert not [line for line in children(plan, parent) if "TEMP B-TREE" in line], lines
    leases = "USING INDEX asyncq_jobs_leased (queue=? AND status=? AND lease_until>?)"
    assert any(leases in line for line in lines), lines  # the live leases per key: one range
    assert live == ["SEARCH asyncq_jobs USING COVERING INDEX " + leases.removeprefix("USING INDEX ")], live
    # The key walk: one seek of the keyed index per key (the next key, then that key's best jobs), never a scan.
    assert not [line for line in by_keys if line.startswith("SCAN asyncq_jobs")], by_keys
    assert any("USING INDEX asyncq_jobs_keyed (queue=? AND limit_key>?)" in line for line in by_keys), by_keys
    assert any("USING INDEX asyncq_jobs_keyed (queue=? AND limit_key=?)" in line for line in by_keys), by_keys


async def test_the_postgresql_limited_claim_seeks_the_same_indexes_and_one_range_of_live_leases(
    postgres_url: str,
) -> None:
    from asyncq.store.postgres.limits import CLAIM_BY_KEYS, CLAIM_LIMITED, LIVE_LEASES

    async with await Queue.open(postgres_url):
        pass
    target = parse_url(postgres_url)
    conn = await asyncpg.connect(target.dsn, timeout=5)
    try:
        rows = _LIMITED_ROWS.format(series="generate_series(1, $1) i").replace("{}", "{{}}").format()
        await conn.execute(f"INSERT INTO {target.schema}.jobs {_LIMITED_COLUMNS} {rows}", DEPTH)
        await conn.execute(f"ANALYZE {target.schema}.jobs")
        claim = CLAIM_LIMITED.format(schema=target.schema)
        plan = _pg_plan_text(await conn.fetch("EXPLAIN (COSTS OFF) " + claim, "q1", NOW, 10, "o", 1000, 1, 128))
        keyed = CLAIM_BY_KEYS.format(schema=target.schema)
        by_keys = _pg_plan_text(await conn.fetch("EXPLAIN (COSTS OFF) " + keyed, "q1", NOW, 10, "o", 1000, 1))
        live = _pg_plan_text(
            await conn.fetch("EXPLAIN (COSTS OFF) " + LIVE_LEASES.format(schema=target.schema), "q1", NOW)
        )
    finally:
        await conn.close()
    assert "Seq Scan on jobs" not in plan and "Seq Scan on jobs" not in live, plan
    pending = plan.split("CTE pending", 1)[1].split("CTE expired", 1)[0]
    assert "Sort" not in pending and "jobs_ranked" in pending, plan
    late = plan.split("CTE late", 1)[1].split("CTE pending", 1)[0]
    assert "Sort" not in late and "jobs_waiting" in late, plan
    counted = plan.split("CTE live", 1)[1].split("CTE full_keys", 1)[0]
    assert "jobs_leased" in counted and "lease_until >" in counted, plan  # the live leases: one range
    assert "jobs_leased" in live, live
    # The key walk: one seek of the keyed index per key (the next key, then that key's best jobs), never a scan.
    assert "Seq Scan on jobs" not in by_keys, by_keys
    walk = by_keys.split("CTE keys", 1)[1].split("CTE room", 1)[0]
    assert "jobs_keyed" in walk and "Sort" not in walk, by_keys
    best = by_keys.split("CTE candidates", 1)[1].split("CTE chosen", 1)[0]
    assert "Index Scan using jobs_keyed" in best and "jobs_ranked" not in best, by_keys


async def test_the_postgresql_key_walk_seeks_the_keyed_index_behind_one_keys_deep_backlog(postgres_url: str) -> None:
    """The case the key walk is for: one key's backlog at the top of the queue, one other key behind it. Ordered by
    priority alone, the planner took the ranked index for each key's best jobs and walked the backlog to find the
    other key (43 ms at 300,000 jobs); ordered by key first, it seeks the keyed index."""
    from asyncq.store.postgres.limits import CLAIM_BY_KEYS

    async with await Queue.open(postgres_url):
        pass
    target = parse_url(postgres_url)
    conn = await asyncpg.connect(target.dsn, timeout=5)
    try:
        await conn.execute(
            f"INSERT INTO {target.schema}.jobs {_LIMITED_COLUMNS} SELECT 'j' || i, 'q1', '{{}}', 'pending', 0, 3, 0,"
            " i, 10000000000000, CASE WHEN i = 1 THEN -4 ELSE 9 END, CASE WHEN i = 1 THEN 'small' ELSE 'big' END,"
            " NULL, NULL FROM generate_series(1, $1) i",
            10 * DEPTH,
        )
        await conn.execute(f"ANALYZE {target.schema}.jobs")
        keyed = CLAIM_BY_KEYS.format(schema=target.schema)
        plan = _pg_plan_text(await conn.fetch("EXPLAIN (COSTS OFF) " + keyed, "q1", NOW, 10, "o", 1000, 1))
    finally:
        await conn.close()
    best = plan.split("CTE candidates", 1)[1].split("CTE chosen", 1)[0]
    assert "Index Scan using jobs_keyed" in best and "jobs_ranked" not in best, plan
