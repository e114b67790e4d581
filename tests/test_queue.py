"""The ``Queue`` facade on real SQLite files: what it adds over its store (canonical bodies, rows built from its
clock, ``reconcile``). The store's own rules are tested for every driver in ``tests/conformance/``.

Time is the injected clock ``t[0]`` (milliseconds); no test sleeps to let time pass. Every file is read
back through an independent ``sqlite3`` connection, so the checks see what is on disk, not what the
queue's connection believes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conformance.sqlite_files import job_row, snapshot
from conftest import T0

from asyncq.queue import Queue

pytestmark = pytest.mark.timeout(20)


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
    await queue.enqueue("job-1", {"n": 1}, queue="mail", max_attempts=5, ttl=60, delay=2)
    row = job_row(path, "job-1")
    assert row["queue"] == "mail"
    assert row["body"] == '{"n":1}'
    assert (row["status"], row["attempts"], row["max_attempts"], row["token"]) == ("pending", 0, 5, 0)
    assert (row["available_at"], row["deadline"]) == (T0 + 2_000, T0 + 60_000)
    assert (row["owner"], row["lease_until"], row["reason"]) == (None, None, None)


# --- cancellation --------------------------------------------------------------------------------------


async def test_reconcile_reports_a_lost_lease_as_not_landed(queue: Queue, clock: list[int]) -> None:
    await queue.enqueue("job", {})
    [ticket] = await queue.claim("w1", lease=1)
    clock[0] += 1_000
    [taken] = await queue.claim("w2", lease=1)
    assert await queue.finish(ticket, "ok") is None
    assert await queue.reconcile(ticket) is None
    assert await queue.reconcile(replace(taken, fence=taken.fence._replace(token=99))) is None
