"""A task's priority: ``@app.task(priority=…)`` is its jobs' default, ``using(priority=…)`` overrides it for one
deferral (``defer`` and ``defer_sync``), and a bad value is refused before anything is written."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import asyncq
from asyncq.queue import Queue
from asyncq.sqlite import enqueue_sync

pytestmark = pytest.mark.timeout(30)

app = asyncq.App()


@app.task(queue="mail", priority=5)
async def send(to: str) -> None:
    return None


@app.task(queue="mail")
async def digest(to: str) -> None:
    return None


async def test_a_tasks_priority_is_its_default_and_using_overrides_it(tmp_path: Path) -> None:
    async with await Queue.open(str(tmp_path / "q.db")) as queue:
        urgent = await send.defer(queue, to="a@b")
        slow = await send.using(priority=-10).defer(queue, to="c@d")
        plain = await digest.defer(queue, to="e@f")
        async with queue.transaction() as tx:
            top = await digest.using(priority=100, key="digest-42").defer(tx, to="g@h")
        priorities = {job.id: job.priority for job in await queue.list_jobs()}
        assert priorities == {urgent.id: 5, slow.id: -10, plain.id: 0, top.id: 100}
        claimed = await queue.claim("w1", queue="mail", limit=4)
        assert [t.id for t in claimed] == [top.id, urgent.id, plain.id, slow.id]


def test_defer_sync_and_enqueue_sync_take_the_priority(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    try:
        job_id = send.using(priority=-3).defer_sync(con, to="a@b")
        assert enqueue_sync(con, "plain", {"n": 1}, queue="mail", priority=7) is True
        rows = dict(con.execute("SELECT id, priority FROM asyncq_jobs").fetchall())
        assert rows == {job_id: -3, "plain": 7}
        with pytest.raises(TypeError, match="priority"):
            enqueue_sync(con, "bad", {}, priority=True)
        assert con.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (2,) and not con.in_transaction
    finally:
        con.close()


def test_a_bad_task_priority_is_refused_where_it_is_written() -> None:
    other = asyncq.App()
    with pytest.raises(ValueError, match="priority"):
        other.task(priority=101)(digest.function)
    with pytest.raises(TypeError, match="priority"):
        send.using(priority=1.5)  # type: ignore[arg-type]
    assert "digest" not in other.tasks
