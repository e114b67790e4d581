"""The ``Queue`` facade on real SQLite files: what it adds over its store (canonical bodies, rows built from its
clock, ``reconcile``). The store's own rules are tested for every driver in ``tests/conformance/``.

Time is the injected clock ``t[0]`` (milliseconds); no test sleeps to let time pass. Every file is read
back through an independent ``sqlite3`` connection, so the checks see what is on disk, not what the
queue's connection believes.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import T0

from asyncq.queue import Queue

pytestmark = pytest.mark.timeout(20)


# --- helpers -----------------------------------------------------------------------------------------


def read(path: Path, statement: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of ``statement`` read through a fresh, independent connection."""
    con = sqlite3.connect(path, timeout=5)
    try:
        return con.execute(statement, parameters).fetchall()
    finally:
        con.close()


def snapshot(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of asyncq's two tables, to prove a refused call changed nothing."""
    return {
        "jobs": read(path, "SELECT * FROM asyncq_jobs ORDER BY seq"),
        "audit": read(path, "SELECT * FROM asyncq_audit ORDER BY seq"),
    }


def job_row(path: Path, job_id: str) -> dict[str, Any]:
    con = sqlite3.connect(path, timeout=5)
    con.row_factory = sqlite3.Row
    try:
        row = con.execute("SELECT * FROM asyncq_jobs WHERE id = ?", (job_id,)).fetchone()
    finally:
        con.close()
    assert row is not None, job_id
    return dict(row)


# --- enqueue -----------------------------------------------------------------------------------------


async def test_enqueue_same_id_same_body_is_a_no_op_even_with_keys_in_another_order(
    queue: Queue, path: Path, clock: list[int]
) -> None:
    assert await queue.enqueue("job-1", {"a": 1, "b": [1, 2], "c": {"x": 1, "y": 2}}) is True
    before = snapshot(path)
    clock[0] += 5_000  # a no-op must not touch available_at or deadline either
    assert await queue.enqueue("job-1", {"c": {"y": 2, "x": 1}, "b": [1, 2], "a": 1}) is False
    assert snapshot(path) == before


async def test_enqueue_stores_the_row_the_lifecycle_starts_from(queue: Queue, path: Path) -> None:
    await queue.enqueue("job-1", {"n": 1}, queue="mail", max_attempts=5, ttl_ms=60_000, delay_ms=2_000)
    row = job_row(path, "job-1")
    assert row["queue"] == "mail"
    assert row["body"] == '{"n":1}'
    assert (row["status"], row["attempts"], row["max_attempts"], row["token"]) == ("pending", 0, 5, 0)
    assert (row["available_at"], row["deadline"]) == (T0 + 2_000, T0 + 60_000)
    assert (row["owner"], row["lease_until"], row["reason"]) == (None, None, None)


# --- cancellation --------------------------------------------------------------------------------------


async def test_reconcile_reports_a_lost_lease_as_not_landed(queue: Queue, clock: list[int]) -> None:
    await queue.enqueue("job", {})
    [ticket] = await queue.claim("w1", lease_ms=1_000)
    clock[0] += 1_000
    [taken] = await queue.claim("w2", lease_ms=1_000)
    assert await queue.finish(ticket, "ok") is None
    assert await queue.reconcile(ticket) is None
    assert await queue.reconcile(replace(taken, fence=taken.fence._replace(token=99))) is None
