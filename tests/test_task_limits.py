"""A task's limit key (docs/flow-control.md, "Limits"): ``@app.task(limit_key=…)`` is its jobs' default (every job of
the task bound together by a queue's per-key limit), ``using(limit_key=…)`` names a deferral's own (a tenant's), in a
queue's transaction and from synchronous code alike; a bad key is refused before anything is written."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import asyncq
from asyncq.queue import Queue

pytestmark = pytest.mark.timeout(30)

app = asyncq.App()


@app.task(queue="mail", limit_key="smtp")
async def send(to: str) -> None:
    return None


@app.task(queue="mail")
async def report(tenant: str) -> None:
    return None


async def test_the_task_default_and_a_deferrals_own_limit_key(tmp_path: Path) -> None:
    path = str(tmp_path / "q.db")
    async with await Queue.open(path) as queue:
        sent = await send.defer(queue, to="a@b")
        own = await report.using(limit_key="tenant-7").defer(queue, tenant="7")
        async with queue.transaction() as tx:
            other = await send.using(limit_key="smtp-eu").defer(tx, to="c@d")
        plain = await report.defer(queue, tenant="8")
        keys = {job.id: job.limit_key for job in await queue.list_jobs()}
    assert keys == {sent.id: "smtp", own.id: "tenant-7", other.id: "smtp-eu", plain.id: None}
    con = sqlite3.connect(path)
    try:
        job_id = report.using(limit_key="tenant-9").defer_sync(con, tenant="9")
        con.commit()
        assert con.execute("SELECT limit_key FROM asyncq_jobs WHERE id = ?", (job_id,)).fetchone() == ("tenant-9",)
    finally:
        con.close()


def test_a_bad_limit_key_is_refused_when_declared_or_used() -> None:
    with pytest.raises(ValueError, match="limit_key"):
        report.using(limit_key=" padded")
    with pytest.raises(TypeError, match="limit_key"):
        report.using(limit_key=7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit_key"):
        asyncq.App().task(limit_key="")(report.function)
