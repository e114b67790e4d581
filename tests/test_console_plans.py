"""The console's task and waiting searches stay index walks at depth on both stores (docs/console.md, "Finding jobs
at depth"): a task's page walks the task index ``(task, seq)`` in its order and stops, whatever else the filter
checks on the rows it yields, for a task with more jobs than the scan cap as for a rare one; the waiting jobs' page
walks the index of jobs with edges not met. No scan of the jobs table, and for the task no sort at all (the waiting
index is in ``waits`` order on SQLite: its page sorts those few rows, never the table). On PostgreSQL the table is
analysed, not vacuumed: the walk is chosen without an all-visible map to make an index-only scan look cheap."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import asyncpg
import pytest

from asyncq.core.search import JobQuery, Order, SearchPlan, plan_search
from asyncq.core.search import Path as SearchPath
from asyncq.queue import Queue
from asyncq.store.postgres.connection import parse_url
from asyncq.store.postgres.search import numbered
from asyncq.store.postgres.search import page_statement as pg_page
from asyncq.store.postgres.search import parameters as pg_parameters
from asyncq.store.sqlite.search import page_statement, parameters

pytestmark = pytest.mark.timeout(120)

DEPTH = 30_000  # deep enough for the planners to prefer an index (the claim's plan test's depth)
#: Jobs of every status: two tasks with more jobs each than a page's scan cap, a rare one (one in 5,000), a fifth
#: with no task; one in a thousand waiting.
_ROWS = (
    "SELECT 'j' || i, 'q' || (i % 3), '{{}}', CASE WHEN i % 1000 = 7 THEN 'waiting' WHEN i % 4 = 0 THEN 'pending'"
    " WHEN i % 4 = 3 THEN 'dead' ELSE 'done' END, 1, 3, 1, i, 10000000000000,"
    " CASE WHEN i % 4 = 3 THEN 'permanent' END,"
    " CASE WHEN i % 5000 = 1 THEN 'rare' WHEN i % 5 = 0 THEN NULL ELSE 't' || (i % 2) END,"
    " CASE WHEN i % 1000 = 7 THEN 1 ELSE 0 END FROM {series}"
)
_COLUMNS = "(id, queue, body, status, attempts, max_attempts, token, available_at, deadline, reason, task, waits)"
#: The searches checked: a task alone (newest and oldest first), a task with filters checked on its rows, waiting.
QUERIES = [
    (JobQuery(task="t1"), Order.NEWEST),
    (JobQuery(task="t1"), Order.OLDEST),
    (JobQuery(task="t0", status="pending", queue="q1"), Order.NEWEST),
    (JobQuery(task="rare"), Order.NEWEST),
    (JobQuery(status="waiting"), Order.NEWEST),
]


def _plans() -> list[SearchPlan]:
    found = []
    for query, order in QUERIES:
        plan = plan_search(query, order)
        assert plan.path is (SearchPath.WAITING if query.status == "waiting" else SearchPath.TASK)
        found.append(plan)
    return found


async def test_the_sqlite_task_and_waiting_pages_walk_their_indexes(tmp_path: Path) -> None:
    path = tmp_path / "deep.db"
    async with await Queue.open(str(path)):
        pass
    con = sqlite3.connect(path, isolation_level=None)
    try:
        series = "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) SELECT i FROM n)"
        con.execute(f"INSERT INTO asyncq_jobs {_COLUMNS} " + _ROWS.format(series=series), (DEPTH,))
        con.execute("ANALYZE")
        plans = []
        for plan in _plans():
            statement = "EXPLAIN QUERY PLAN " + page_statement(plan)
            plans.append((plan, [row[3] for row in con.execute(statement, parameters(plan, None, 10_000, 51))]))
    finally:
        con.close()
    for plan, lines in plans:
        assert not [line for line in lines if line.startswith("SCAN asyncq_jobs") and "INDEX" not in line], lines
        if plan.path is SearchPath.TASK:
            assert any("INDEX asyncq_jobs_task (task=? AND seq" in line for line in lines), lines
            assert not [line for line in lines if "TEMP B-TREE" in line], lines
        else:
            assert any("INDEX asyncq_jobs_waits (waits>?)" in line for line in lines), lines
        assert any("USING INTEGER PRIMARY KEY (rowid=?)" in line for line in lines), lines  # each job by its key


async def test_the_sqlite_due_page_of_any_priority_merges_two_index_ranges(tmp_path: Path) -> None:
    # One queue's pending jobs by when they are due (SQLite schema version 16): the default priority's range of the
    # ranked index and the others' prioritised index, each walked in ready-time order; no scan of the jobs.
    path = tmp_path / "deep.db"
    async with await Queue.open(str(path)):
        pass
    con = sqlite3.connect(path, isolation_level=None)
    try:
        series = "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) SELECT i FROM n)"
        con.execute(f"INSERT INTO asyncq_jobs {_COLUMNS} " + _ROWS.format(series=series), (DEPTH,))
        con.execute("UPDATE asyncq_jobs SET priority = 5 WHERE status = 'pending' AND seq % 7 = 0")
        con.execute("ANALYZE")
        plan = plan_search(JobQuery(status="pending", queue="q1"), Order.DUE)
        assert plan.path is SearchPath.DUE
        statement = "EXPLAIN QUERY PLAN " + page_statement(plan)
        lines = [row[3] for row in con.execute(statement, parameters(plan, None, 10_000, 51))]
    finally:
        con.close()
    assert not [line for line in lines if line.startswith("SCAN asyncq_jobs") and "INDEX" not in line], lines
    assert any("INDEX asyncq_jobs_ranked (queue=? AND priority=?" in line for line in lines), lines
    assert any("INDEX asyncq_jobs_prioritised (queue=?" in line for line in lines), lines


async def test_the_postgresql_task_and_waiting_pages_walk_their_indexes(postgres_url: str) -> None:
    async with await Queue.open(postgres_url):
        pass
    target = parse_url(postgres_url)
    conn = await asyncpg.connect(target.dsn, timeout=5)
    try:
        rows = _ROWS.format(series="generate_series(1, $1) i").replace("{}", "{{}}").format()
        await conn.execute(f"INSERT INTO {target.schema}.jobs {_COLUMNS} {rows}", DEPTH)
        await conn.execute(f"ANALYZE {target.schema}.jobs")
        plans = []
        for plan in _plans():
            text, values = numbered(pg_page(plan, target.schema), pg_parameters(plan, None, 10_000, 51))
            found = await conn.fetch("EXPLAIN (COSTS OFF) " + text, *values)
            plans.append((plan, "\n".join(row[0] for row in found)))
    finally:
        await conn.close()
    for plan, text in plans:
        walked = "jobs_task" if plan.path is SearchPath.TASK else "jobs_waits"
        walk = re.search(rf"Index (Only )?Scan (Backward )?using {walked} on jobs\b", text)
        assert walk is not None, text  # walked in its order (no bitmap of the whole range, no sort of it)
        jobs = text.split("SubPlan", 1)[0]  # the subplan counts a shown job's redrives in its audit rows
        assert "Seq Scan" not in jobs and "Sort" not in jobs and "Bitmap" not in jobs, text
        assert "Index Scan using jobs_pkey on jobs j" in jobs, text  # each job by its key
