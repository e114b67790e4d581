"""``Queue.stats()`` against queue depth: schema v4's scans against the kept counts (v5), on the same files.

1. Depth: one file grown to 0, 100,000, 1,000,000 and 5,000,000 queued jobs, each with a history
   of 10% of the depth done and 1% dead (every reason), a few jobs leased (some expired), a retry or two behind
   the attempts of a third of the queue, and one job in fifty delayed. Rows are inserted by set-based SQL, untimed
   (the triggers count them as they land). At each depth, in alternating rounds on the same file: v4's
   statements (``COUNT … GROUP BY`` status, dead by reason, the attempts histogram and the oldest ready job over
   the ``pending`` index) on a raw connection, ``read_stats`` (what ``Queue.stats()`` runs) on a raw connection,
   ``Queue.stats()`` itself through a read-only queue, and the console's page read (``page_read``: stats, the
   newest dead jobs, the leases). Medians; every v4 figure must equal the v5 one. Targets: ``Queue.stats()`` at
   5M queued <= 50 ms, and the console's page read too.
2. The cost per job: the engine's own statements (enqueue, claim, finish ok; 128 jobs a commit, WAL+FULL) on fresh
   files: v5; v5 with the counting triggers and the new indexes dropped (= v4); and that v4 file with counts kept
   by the engine instead, as it was measured when choosing (a prototype: the deltas of each commit from the rows
   the statements return, one upsert a cell; it covers only this path, and assumes every claim takes a pending
   job). Alternating rounds of 10,000 lifecycles, CPU time (``time.process_time``) per job, 200,000 a side.
3. The v4 -> v5 migration of the deepest file (made v4 again: the counts table, triggers and indexes dropped): how
   long ``SqliteQueueStore.open`` holds the write lock to count the rows and build the indexes, and that its counts
   give the same figures.
4. EXPLAIN QUERY PLAN of every statement on the deepest file, of the old listings, and of the claim (it
   must not take the new index).

Instructions per job: ``valgrind --tool=callgrind .venv/bin/python benchmarks/stats_depth.py --one-side v5 --jobs
10000`` and the same with ``--jobs 0``, for each side (``v4``, ``v5``, ``engine``); the difference over 10,000.

Run ``.venv/bin/python benchmarks/stats_depth.py`` (two to four minutes; about 1 GB of temporary file; rewrites
its section of docs/benchmarks.md), ``--depths 0,100000`` for other depths (writes nothing), or ``--quick`` for a
smoke run (< 20 s, writes nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import _report

from asyncq.core.jobs import Finish, NewJob, Ticket
from asyncq.core.lifecycle import STATUSES
from asyncq.core.search import JobQuery
from asyncq.core.stats import OwnerLeases, Stats
from asyncq.queue import Queue
from asyncq.queue.console import OperatorConsole
from asyncq.store.sqlite import engine, stats
from asyncq.store.sqlite.admin import LIST_INDEXED
from asyncq.store.sqlite.connection import write_transaction
from asyncq.store.sqlite.queue_store import SqliteQueueStore
from asyncq.store.sqlite.schema import PRODUCT
from asyncq.store.sqlite.statements import sql

COMMAND = ".venv/bin/python benchmarks/stats_depth.py"
T0 = 1_700_000_000_000
TARGET_MS, TARGET_DEPTH = 50.0, 5_000_000
LOAD_CHUNK = 250_000
BATCH = 128

# Schema v4's statements, word for word (asyncq/store/sqlite/stats.py before the kept counts): the baseline.
V4 = {
    "COUNT_BY_STATUS": "SELECT status, count(*) FROM asyncq_jobs GROUP BY status",
    "DEAD_BY_REASON": "SELECT reason, count(*) FROM asyncq_jobs WHERE status = 'dead' GROUP BY reason",
    "OLDEST_READY": "SELECT min(available_at) FROM asyncq_jobs WHERE status = 'pending' AND available_at <= :now",
    "LEASES_BY_OWNER": "SELECT owner, count(*), min(lease_until) FROM asyncq_jobs WHERE status = 'leased'"
    " GROUP BY owner ORDER BY owner",
    "ATTEMPTS_HISTOGRAM": "SELECT attempts, count(*) FROM asyncq_jobs WHERE status IN ('pending', 'leased')"
    " GROUP BY attempts ORDER BY attempts",
    "EXPIRED_LEASES": "SELECT count(*) FROM asyncq_jobs WHERE status = 'leased' AND lease_until <= :now",
}
V5 = {name: text.format(jobs=PRODUCT.jobs, counts=PRODUCT.counts) for name, text in stats.NAMES.items()}
V7_ONLY = ("DROP INDEX asyncq_jobs_cancel_requested", "ALTER TABLE asyncq_jobs DROP COLUMN cancel_requested_at")
# (Version 5's ready-time index went in version 16: a current file has none to drop.)
V5_ONLY = ("DROP TRIGGER asyncq_jobs_count_insert", "DROP TRIGGER asyncq_jobs_count_delete",
           "DROP TRIGGER asyncq_jobs_count_leave", "DROP TRIGGER asyncq_jobs_count_enter",
           "DROP INDEX asyncq_jobs_dead")  # fmt: skip
# What version 8 (priorities, the queues' settings) added, undone, so that the file is v4 again: the migration
# timed then runs v5 to v8 (v8's part: the priority column, added in place, and its two partial indexes).
V8_ONLY = ("DROP INDEX asyncq_jobs_ranked", "DROP INDEX asyncq_jobs_prioritised", "DROP TABLE asyncq_queues",
           "DROP TABLE asyncq_queue_audit", "ALTER TABLE asyncq_jobs DROP COLUMN priority",
           "CREATE INDEX asyncq_jobs_pending ON asyncq_jobs(queue, status) WHERE status = 'pending'")  # fmt: skip
# What version 9 (unique keys) added, undone first: its partial unique index and the column.
V9_ONLY = ("DROP INDEX asyncq_jobs_unique", "ALTER TABLE asyncq_jobs DROP COLUMN unique_key")
# What versions 11, 13, 14 and 15 added (the jobs' task and retention rules; dependencies and groups; the limit key;
# the console), undone first: the console's tables, index and audit column; the keyed index and the limit key column;
# the task's index, the index of ended jobs that names it (version 10's, which v11 replaced, is made again by v10's
# step), the rules' table and the column; the graph columns, indexes and tables (the widened status check stays: v13
# finds it widened and leaves it). Version 12's schedule tables stay: its step makes them if missing; the queues'
# tables go with V8_ONLY.
V11_ONLY = (
    "DROP TABLE asyncq_operations", "DROP TABLE asyncq_samples", "DROP TABLE asyncq_workers_seen",
    "DROP INDEX asyncq_errors_type", "ALTER TABLE asyncq_audit DROP COLUMN op_seq",
    "DROP INDEX asyncq_jobs_keyed",
    "ALTER TABLE asyncq_jobs DROP COLUMN limit_key",
    "DROP INDEX asyncq_jobs_task",
    "DROP INDEX asyncq_jobs_retained",
    "DROP TABLE asyncq_retention",
    "ALTER TABLE asyncq_jobs DROP COLUMN task",
    "DROP INDEX asyncq_jobs_waits", "DROP INDEX asyncq_jobs_members", "ALTER TABLE asyncq_jobs DROP COLUMN group_name",
    "ALTER TABLE asyncq_jobs DROP COLUMN links", "ALTER TABLE asyncq_jobs DROP COLUMN waits", "DROP TABLE asyncq_edges",
    "DROP TABLE asyncq_groups",
)  # fmt: skip
ENGINE_UPSERT = "INSERT INTO asyncq_counts VALUES (?, ?, ?, ?) ON CONFLICT DO UPDATE SET jobs = jobs + excluded.jobs"

# ``:n`` rows of one kind from ``:start`` on; ``x`` numbers them. Pending rows: a third have retried, one in fifty is
# delayed past the run; dead rows cycle through the reasons.
LOAD = """
WITH RECURSIVE n(x) AS (SELECT :start UNION ALL SELECT x + 1 FROM n WHERE x < :start + :n - 1)
INSERT INTO asyncq_jobs (id, queue, body, status, attempts, max_attempts, token, available_at, deadline, reason)
SELECT :kind || x, CASE WHEN x % 4 = 0 THEN 'mail' ELSE 'default' END, '{"n":' || x || '}', :status,
  CASE :status WHEN 'pending' THEN x % 3 WHEN 'done' THEN 1 ELSE x % 4 END, 5, x % 3,
  CASE WHEN :status = 'pending' AND x % 50 = 0 THEN :now + 3600000 ELSE :now - 1 - x % 997 END, :now + 86400000,
  CASE :status WHEN 'dead' THEN CASE x % 4 WHEN 0 THEN 'deadline' WHEN 1 THEN 'exhausted'
    WHEN 2 THEN 'permanent' ELSE 'cancelled' END END
FROM n
"""
LEASE_SOME = """
UPDATE asyncq_jobs SET status = 'leased', owner = 'w' || (seq % 4), token = token + 1, attempts = attempts + 1,
  lease_until = CASE WHEN seq % 4 = 0 THEN :now - 1 ELSE :now + 60000 END
WHERE seq IN (SELECT seq FROM asyncq_jobs WHERE status = 'pending' ORDER BY seq LIMIT 16)
"""


@dataclass(frozen=True)
class Settings:
    depths: tuple[int, ...]
    samples: int  # of the kept counts and Queue.stats() per depth
    v4_samples: int  # of the v4 scans per depth (seconds each at millions)
    lifecycles: int  # per side, for the cost per job
    round_jobs: int


FULL_RUN = Settings((0, 100_000, 1_000_000, 5_000_000), 21, 5, 200_000, 10_000)
QUICK_RUN = Settings((0, 2_000, 20_000), 5, 3, 2_000, 1_000)


@dataclass
class Depth:
    depth: int
    rows: int
    v4_ms: float
    v5_ms: float
    facade_ms: float
    page_ms: float
    same: bool


def grow(con: sqlite3.Connection, loaded: dict[str, int], depth: int) -> None:
    """Add rows until ``depth`` jobs are queued, with a history of 10% done and 1% dead; 16 leased once."""
    for kind, status, wanted in (("d", "done", depth // 10), ("x", "dead", depth // 100), ("p", "pending", depth)):
        while loaded[kind] < wanted:
            n = min(LOAD_CHUNK, wanted - loaded[kind])
            with write_transaction(con):
                con.execute(LOAD, {"start": loaded[kind], "n": n, "kind": kind, "status": status, "now": T0})
            loaded[kind] += n
    if depth and not loaded["leased"]:
        with write_transaction(con):
            con.execute(LEASE_SOME, {"now": T0})
        loaded["leased"] = 16
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def v4_stats(con: sqlite3.Connection, now_ms: int) -> Stats:
    """What v4's ``read_stats`` returned: its statements in one read transaction."""

    def rows(name: str) -> list[Any]:
        return con.execute(V4[name], {"now": now_ms}).fetchall()

    con.execute("BEGIN")
    try:
        by_status = dict(rows("COUNT_BY_STATUS"))
        dead = dict(rows("DEAD_BY_REASON"))
        [(oldest,)] = rows("OLDEST_READY")
        [(expired,)] = rows("EXPIRED_LEASES")
        leases = [OwnerLeases(*row) for row in rows("LEASES_BY_OWNER")]
        attempts = dict(rows("ATTEMPTS_HISTOGRAM"))
    finally:
        con.execute("COMMIT")
    return Stats(
        now_ms,
        {status: by_status.get(status, 0) for status in STATUSES},
        dead,
        None if oldest is None else now_ms - oldest,
        expired,
        leases,
        attempts,
    )


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = call()
    return (time.perf_counter() - started) * 1000, result


async def measure_depth(path: Path, con: sqlite3.Connection, depth: int, settings: Settings) -> Depth:
    """Alternating rounds at one depth: v4's scans, ``read_stats``, ``Queue.stats()``, the console's page read."""
    v4_times, v5_times, facade_times, page_times, same = [], [], [], [], True
    async with await Queue.open(path, read_only=True, clock=lambda: T0) as queue:
        for index in range(settings.samples):
            old = None
            if index < settings.v4_samples:
                spent, old = timed(lambda: v4_stats(con, T0))
                v4_times.append(spent)
            spent, new = timed(lambda: stats.read_stats(con, PRODUCT, T0))
            v5_times.append(spent)
            same = same and old in (None, new)
            started = time.perf_counter()
            assert await queue.stats() == new
            facade_times.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await page_read(queue)
            page_times.append((time.perf_counter() - started) * 1000)
    rows = sum(new.by_status.values())
    med = statistics.median
    return Depth(depth, rows, med(v4_times), med(v5_times), med(facade_times), med(page_times), same)


async def page_read(queue: Queue) -> None:
    """What the console reads on a refresh of its overview, dead and workers screens (counts, the newest dead jobs,
    the leases, the queues' settings; the samples it shows are a read of their own table)."""
    console = OperatorConsole(queue)
    await queue.stats()
    await console.search(JobQuery(status="dead"), page=50)
    await console.search(JobQuery(status="leased"), page=200)
    await queue.queue_settings()


def plans(con: sqlite3.Connection) -> list[tuple[str, str, str]]:
    """``(side, statement, plan)`` for every statement, and the claim's plan."""
    found = []
    claim = sql(PRODUCT, PRODUCT.claim)
    claim_params = {"now": T0, "owner": "o", "lease_ms": 1, "limit": BATCH, "count": 1, "queue": "default"}
    listings = {f"LIST {status}{' newest' if newest else ''}": text for (status, newest), text in LIST_INDEXED.items()}
    listing_params = {"status": None, "queue": None, "reason": None, "after": 0, "limit": 100}
    for side, names in (("v4", V4), ("v5", V5), ("v5 listing", listings), ("claim", {"CLAIM": claim})):
        for name, text in names.items():
            params = {"claim": claim_params, "v5 listing": listing_params}.get(side, {"now": T0})
            detail = [str(row[3]) for row in con.execute("EXPLAIN QUERY PLAN " + text, params)]
            if side == "claim":
                detail = [line for line in detail if "INDEX" in line]
            found.append((side, name, "; ".join(detail)))
    return found


async def migration_seconds(path: Path, con: sqlite3.Connection, expected: Stats) -> float:
    """Make the file v4 again, then time the open that migrates it to the current version (v5's counts, v6, v7's
    cancel column, v8's priority indexes, v9's unique keys, v11's console tables: one write transaction; v6's tables
    are kept)."""
    with write_transaction(con):
        for statement in (*V11_ONLY, *V9_ONLY, *V8_ONLY, *V5_ONLY, f"DROP TABLE {PRODUCT.counts}", *V7_ONLY):
            con.execute(statement)
        con.execute("PRAGMA user_version = 4")
    started = time.perf_counter()
    store = await SqliteQueueStore.open(path)
    spent = time.perf_counter() - started
    try:
        assert await store.stats(T0) == expected, "the migrated counts differ"
    finally:
        await store.close()
    return spent


# -- the cost per job ------------------------------------------------------------------------------------------


def lifecycle_round(con: sqlite3.Connection, start: int, jobs: int, by_engine: bool) -> float:
    """CPU seconds to enqueue, claim and finish ``jobs`` jobs, 128 a commit (the engine's set-based statements);
    ``by_engine``: with the prototype's counting in each commit."""
    payload = {
        "queue": "default", "body": "{}", "priority": 0, "unique_key": None, "task": None, "group_name": None,
        "limit_key": None,
    }  # fmt: skip
    rows = [NewJob(f"j{n}", payload, 3, T0, T0 + 3_600_000) for n in range(start, start + jobs)]
    wants = [({"queue": "default"}, BATCH)]
    began = time.process_time()
    for first in range(0, jobs, BATCH):
        with write_transaction(con):
            added = engine.enqueue_rows_in_transaction(con, PRODUCT, rows[first : first + BATCH])
            if by_engine:
                con.execute(ENGINE_UPSERT, ("pending", 0, "", sum(added)))
    finishes: list[Finish] = []
    while True:
        with write_transaction(con):
            statuses, claimed, *_ = engine.settle_and_claim_in_transaction(
                con, PRODUCT, finishes, T0 + 1, "w", 60_000, wants, BATCH
            )
            if by_engine:
                count_by_engine(con, finishes, statuses, claimed)
        finishes = [Finish(ticket.id, ticket.fence, "ok", 0, ticket.held) for ticket in claimed]
        if not claimed:
            return time.process_time() - began


def count_by_engine(
    con: sqlite3.Connection, finishes: list[Finish], statuses: list[str | None], claimed: list[Ticket]
) -> None:
    """The prototype's counting of one group commit, on v5's cells (jobs not leased): each landed finish enters its
    new cell, each claimed row leaves a pending cell; one upsert a changed cell."""
    delta: Counter[tuple[str, int, str]] = Counter()
    for finish, status in zip(finishes, statuses, strict=True):
        if status is not None:
            delta[(status, finish.fence.attempt, "")] += 1
    for ticket in claimed:
        delta[("pending", ticket.attempt - 1, "")] -= 1
    con.executemany(ENGINE_UPSERT, [(*cell, n) for cell, n in delta.items() if n])


async def fresh_file(path: Path, drop: tuple[str, ...]) -> sqlite3.Connection:
    await (await SqliteQueueStore.open(path)).close()  # v5, WAL+FULL
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA synchronous=FULL")
    con.execute("PRAGMA temp_store=MEMORY")
    for statement in drop:
        con.execute(statement)
    return con


V4_SIDE = "v4: no counts"
V5_SIDE = "v5: counting triggers + dead index (what ships)"
ENGINE_SIDE = "v4 + counts kept by the engine (prototype, this path only)"


SIDES = {"v4": V4_SIDE, "v5": V5_SIDE, "engine": ENGINE_SIDE}


def one_side(side: str, jobs: int) -> None:
    """``jobs`` lifecycles of one side after 1,000 warm ones, synchronous=OFF: run it with 0 and with N jobs under
    ``valgrind --tool=callgrind`` and divide the difference by N for instructions per job."""
    with tempfile.TemporaryDirectory(prefix="asyncq-stats-") as tmp:
        con = asyncio.run(fresh_file(Path(tmp) / "side.db", () if side == "v5" else V5_ONLY))
        con.execute("PRAGMA synchronous=OFF")
        lifecycle_round(con, 0, 1_000, side == "engine")
        if jobs:
            lifecycle_round(con, 1_000, jobs, side == "engine")
        con.close()


def cost_per_job(folder: Path, settings: Settings) -> dict[str, float]:
    """CPU µs per job lifecycle on v5 and on v5 without its counting (= v4), alternating rounds."""
    sides = {
        V4_SIDE: asyncio.run(fresh_file(folder / "cost-v4.db", V5_ONLY)),
        V5_SIDE: asyncio.run(fresh_file(folder / "cost-v5.db", ())),
        ENGINE_SIDE: asyncio.run(fresh_file(folder / "cost-engine.db", V5_ONLY)),
    }
    spent = dict.fromkeys(sides, 0.0)
    names = list(sides)
    for index in range(settings.lifecycles // settings.round_jobs):
        for name in names if index % 2 == 0 else reversed(names):
            start = index * settings.round_jobs
            spent[name] += lifecycle_round(sides[name], start, settings.round_jobs, name == ENGINE_SIDE)
    for con in sides.values():
        con.close()
    return {name: seconds / settings.lifecycles * 1e6 for name, seconds in spent.items()}


# -- the report ------------------------------------------------------------------------------------------------


def depth_rows(results: list[Depth]) -> list[list[str]]:
    return [
        [
            f"{r.depth:,}",
            f"{r.rows:,}",
            f"{r.v4_ms:.1f}",
            f"{r.v5_ms:.2f}",
            f"{r.v4_ms / r.v5_ms:,.0f}x",
            f"{r.facade_ms:.2f}",
            f"{r.page_ms:.1f}",
            "yes" if r.same else "NO",
        ]
        for r in results
    ]


DEPTH_HEADERS = ["queued", "jobs in file", "v4 scans ms", "v5 read_stats ms", "v4/v5", "Queue.stats() ms",
                 "console page read ms", "same figures"]  # fmt: skip


def verdicts(results: list[Depth]) -> list[list[str]]:
    deepest = results[-1]
    label = f"Queue.stats() at {deepest.depth:,} queued <= {TARGET_MS:.0f} ms"
    rows = [[label, f"{deepest.facade_ms:.2f} ms", _report.verdict(deepest.facade_ms <= TARGET_MS)]]
    page = f"the console's page read at {deepest.depth:,} queued <= {TARGET_MS:.0f} ms"
    rows.append([page, f"{deepest.page_ms:.1f} ms", _report.verdict(deepest.page_ms <= TARGET_MS)])
    rows.append(["every v4 figure equals v5's, at every depth", "", _report.verdict(all(r.same for r in results))])
    if deepest.depth < TARGET_DEPTH:
        rows.append([f"the target's depth ({TARGET_DEPTH:,}) was not built", "", "NOT met"])
    return rows


def markdown(
    results: list[Depth],
    cost: dict[str, float],
    found: list[tuple[str, str, str]],
    settings: Settings,
    migration: float,
) -> str:
    base, kept = cost[V4_SIDE], cost[V5_SIDE]
    parts = [
        "## Stats at depth (`benchmarks/stats_depth.py`)",
        f"`{COMMAND}` on {_report.environment()}. One file grown through the depths "
        "(10% of the depth done, 1% dead, 16 leased, 1 in 50 delayed); medians of alternating rounds on the same "
        "file: v4's scans and v5's `read_stats` on a raw connection, `Queue.stats()` through a read-only queue, "
        "and the console's page read (`page_read`: stats, the newest dead jobs, the leases, the queues' settings).",
        _report.markdown_table(DEPTH_HEADERS, depth_rows(results)),
        _report.markdown_table(["target", "measured", "verdict"], verdicts(results)),
        "v4's dead-by-reason statement runs here on the v5 file, so it seeks the dead-only index that v4 files lack "
        "(there it scanned): the v4 column is, if anything, low. Migrating the "
        f"{results[-1].depth:,}-job file from v4 (the counts table, its triggers and the two indexes dropped again) "
        f"took {migration:.1f} s in `SqliteQueueStore.open`, under the write lock, once; its counts gave the same "
        "figures.",
        "What the counting costs a job: enqueue + claim + finish(ok) with the engine's statements, 128 jobs a "
        f"commit, WAL+FULL, CPU time per job over {settings.lifecycles:,} lifecycles a side in alternating rounds of "
        f"{settings.round_jobs:,}:",
        _report.markdown_table(
            ["schema", "CPU µs per job lifecycle"], [[name, f"{us:.2f}"] for name, us in cost.items()]
        ),
        f"The triggers and indexes add {kept - base:+.2f} µs of CPU per job lifecycle ({(kept - base) / base:+.0%}); "
        f"counts kept by the engine would add {cost[ENGINE_SIDE] - base:+.2f} µs on this path (docs/benchmarks.md, "
        '"Why triggers, not counts kept by the engine").',
        "Plans on the deepest file:",
        _report.markdown_table(["side", "statement", "EXPLAIN QUERY PLAN"], [list(row) for row in found]),
    ]
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny depths, few samples; docs are not written")
    parser.add_argument("--depths", help="comma-separated depths instead of the default ones (writes no docs)")
    parser.add_argument("--one-side", choices=SIDES, help="only run --jobs lifecycles of one side (for callgrind)")
    parser.add_argument("--jobs", type=int, default=10_000, help="lifecycles for --one-side, after 1,000 warm ones")
    args = parser.parse_args()
    if args.one_side:
        one_side(args.one_side, args.jobs)
        return
    settings = QUICK_RUN if args.quick else FULL_RUN
    if args.depths:
        settings = replace(settings, depths=tuple(sorted(int(depth) for depth in args.depths.split(","))))
    with tempfile.TemporaryDirectory(prefix="asyncq-stats-") as tmp:
        folder = Path(tmp)
        path = folder / "depth.db"
        asyncio.run(fresh_file(path, ())).close()
        results: list[Depth] = []
        loaded = {"d": 0, "x": 0, "p": 0, "leased": 0}
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as con:
            con.execute("PRAGMA synchronous=OFF")  # loading only: the fixture is rebuilt on every run
            for depth in settings.depths:
                grow(con, loaded, depth)
                results.append(asyncio.run(measure_depth(path, con, depth, settings)))
                print(f"measured at {depth:,} queued", flush=True)
            found = plans(con)
            expected = stats.read_stats(con, PRODUCT, T0)
            migration = asyncio.run(migration_seconds(path, con, expected))
        cost = cost_per_job(folder, settings)
    _report.print_table("Queue.stats() at depth (ms, medians)", DEPTH_HEADERS, depth_rows(results))
    _report.print_table("targets", ["target", "measured", "verdict"], verdicts(results))
    print(f"v4 -> v5 migration at {results[-1].depth:,} queued: {migration:.1f} s under the write lock\n")
    _report.print_table("CPU per job lifecycle", ["schema", "µs"], [[n, f"{us:.2f}"] for n, us in cost.items()])
    _report.print_table("plans", ["side", "statement", "plan"], found)
    if not args.quick and not args.depths:
        print(f"wrote {_report.write_section('stats_depth', markdown(results, cost, found, settings, migration))}")


if __name__ == "__main__":
    main()
