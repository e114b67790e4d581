"""Reading a SQLite queue file through a fresh, independent ``sqlite3`` connection: the SQLite driver's own tests
check what is on disk, not what the store's connection believes."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any


def read(path: Path, statement: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of ``statement`` read through a fresh, independent connection."""
    con = sqlite3.connect(path, timeout=5)
    try:
        return con.execute(statement, parameters).fetchall()
    finally:
        con.close()


#: The job counts the triggers keep (``schema.JOB_COUNTS``: jobs not leased), and the same cells counted from the rows.
KEPT_COUNTS = "SELECT status, attempts, reason, jobs FROM asyncq_counts WHERE jobs <> 0 ORDER BY 1, 2, 3"
COUNTED_ROWS = (
    "SELECT status, attempts, ifnull(reason, ''), count(*) FROM asyncq_jobs WHERE status <> 'leased'"
    " GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
)


def snapshot(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of asyncq's two tables and its kept counts, to prove a refused call changed nothing."""
    return {
        "jobs": read(path, "SELECT * FROM asyncq_jobs ORDER BY seq"),
        "audit": read(path, "SELECT * FROM asyncq_audit ORDER BY seq"),
        "counts": read(path, KEPT_COUNTS),
    }


def assert_counts_kept(path: Path | str) -> None:
    """The kept job counts are what a full count of the rows says."""
    con = sqlite3.connect(path, timeout=5)
    try:
        assert con.execute(KEPT_COUNTS).fetchall() == con.execute(COUNTED_ROWS).fetchall()
    finally:
        con.close()


def job_row(path: Path, job_id: str) -> dict[str, Any]:
    """One job's row by column name."""
    con = sqlite3.connect(path, timeout=5)
    con.row_factory = sqlite3.Row
    try:
        row = con.execute("SELECT * FROM asyncq_jobs WHERE id = ?", (job_id,)).fetchone()
    finally:
        con.close()
    assert row is not None, job_id
    return dict(row)
