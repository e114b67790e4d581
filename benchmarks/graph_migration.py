"""How long the dependencies-and-groups migration (SQLite v12 -> v13) takes on a large file, against the table
rebuild it avoids.

    .venv/bin/python benchmarks/graph_migration.py --jobs 1000000 [--write]

Builds a file of the version before the graphs' (v12) with ``--jobs`` jobs (99 % done, the rest pending, as a
long-lived queue holds them), then times, each on a fresh copy of it: the migrations as ``Queue.open`` runs them
(v13: the status check widened in place, three columns added, the indexes it changes or adds built; then every
later version: the limits' column, index and audit, the console's tables), and for comparison a rebuild of
``asyncq_jobs`` (copy every row into a new table with the wider check, swap, indexes and triggers created again), the
route SQLite's documentation gives for a change ``ALTER TABLE`` cannot make. ``--write`` puts the table in
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _report import environment, markdown_table, print_table, write_section  # noqa: E402

from asyncq.queue import Queue  # noqa: E402
from asyncq.store.sqlite.graph_schema import GRAPHS  # noqa: E402
from asyncq.store.sqlite.migrations import MIGRATIONS, SCHEMA_VERSION  # noqa: E402

T0 = 1_700_000_000_000
BEFORE = MIGRATIONS.index(GRAPHS)  # the version before the graphs' (its step's index is the version it starts from)
COLUMNS = "id, queue, body, status, attempts, max_attempts, token, available_at, deadline"


def build(path: Path, jobs: int) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode = WAL")
    con.execute("BEGIN")
    for step in MIGRATIONS[:BEFORE]:
        for statement in step:
            assert isinstance(statement, str)
            con.execute(statement)
    pending = jobs // 100
    rows = (
        (f"job-{n:08d}", "default", '{"n":1}', "pending" if n < pending else "done", 0, 3, 0, T0 + n, T0 + 10**9)
        for n in range(jobs)
    )
    con.executemany(f"INSERT INTO asyncq_jobs ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    con.execute(f"PRAGMA user_version = {BEFORE}")
    con.execute("COMMIT")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()


def timed_migration(path: Path) -> float:
    async def open_once() -> None:
        async with await Queue.open(path):
            pass

    started = time.perf_counter()
    asyncio.run(open_once())
    return time.perf_counter() - started


def timed_rebuild(path: Path) -> float:
    """The jobs table rebuilt with the wider check, its indexes and triggers made again (the 12-step route)."""
    con = sqlite3.connect(path, isolation_level=None)
    started = time.perf_counter()
    con.execute("BEGIN IMMEDIATE")
    (table,) = con.execute("SELECT sql FROM sqlite_master WHERE name = 'asyncq_jobs'").fetchone()
    found = "SELECT sql FROM sqlite_master WHERE tbl_name = 'asyncq_jobs' AND type IN ('index', 'trigger')"
    others = [sql for (sql,) in con.execute(found + " AND sql IS NOT NULL")]
    wider = table.replace("'dead'))", "'dead','waiting'))").replace("asyncq_jobs", "asyncq_jobs_v11", 1)
    con.execute(wider)
    con.execute("INSERT INTO asyncq_jobs_v11 SELECT * FROM asyncq_jobs")
    con.execute("DROP TABLE asyncq_jobs")
    con.execute("ALTER TABLE asyncq_jobs_v11 RENAME TO asyncq_jobs")
    for sql in others:
        con.execute(sql)
    con.execute("COMMIT")
    elapsed = time.perf_counter() - started
    con.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder) / f"v{BEFORE}.db"
        build(base, args.jobs)
        size = base.stat().st_size
        results = []
        for name, step in (
            (f"v{BEFORE} to v{SCHEMA_VERSION} (v{BEFORE + 1}: the check widened in place)", timed_migration),
            ("table rebuild", timed_rebuild),
        ):
            copy = Path(folder) / "copy.db"
            shutil.copy(base, copy)
            results.append((name, f"{step(copy):.2f} s"))
            for side in ("", "-wal", "-shm"):
                Path(str(copy) + side).unlink(missing_ok=True)
    headers = [f"on a v{BEFORE} file of " + f"{args.jobs:,} jobs ({size / 2**20:.0f} MiB)", "time"]
    print_table(f"SQLite v{BEFORE} -> v{SCHEMA_VERSION}", headers, results)
    if args.write:
        command = f"`benchmarks/graph_migration.py --jobs {args.jobs}`"
        write_section("graph-migration", f"{command} ({environment()}):\n\n{markdown_table(headers, results)}\n")


if __name__ == "__main__":
    main()
