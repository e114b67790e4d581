"""Task graphs (docs/dependencies.md): ``using(after=[handles])`` runs a task after the deferrals it names, in one
transaction or across several; ``app.group(name, on_complete=task)`` runs the callback once, after every member,
with the outcome as its ``group`` argument; both work from ``defer_sync`` too. Real SQLite files, real pools."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import asyncq
from asyncq.queue import Queue
from asyncq.testing import drain

pytestmark = pytest.mark.timeout(30)

app = asyncq.App()
ran: list[tuple[str, Any]] = []


@app.task(queue="graph")
async def fetch(url: str) -> int:
    ran.append(("fetch", url))
    if url == "bad":
        raise asyncq.Permanent("no such page")
    return len(url)


@app.task(queue="graph")
async def merge(key: str) -> None:
    ran.append(("merge", key))


@app.task(queue="graph")
async def import_row(row: int) -> None:
    ran.append(("import", row))
    if row == 3:
        raise asyncq.Permanent("bad row")


@app.task(queue="reports", max_attempts=5)
async def summarize(group: asyncq.GroupOutcome, title: str = "import") -> None:
    members = await asyncq.tasks.current().queue.group_members(group.name, status="dead")
    ran.append(("summarize", (group, title, [job.id for job in members])))


@pytest.fixture(autouse=True)
def fresh_record() -> None:
    ran.clear()


async def test_a_merge_after_two_fetches_runs_after_both(tmp_path: Path) -> None:
    async with await Queue.open(str(tmp_path / "q.db")) as queue:
        async with queue.transaction() as tx:
            a = await fetch.defer(tx, url="u1")
            b = await fetch.defer(tx, url="u22")
            m = await merge.using(after=[a, b], on_dependency_dead="dead").defer(tx, key="report-7")
        assert (await queue.waits_for(m.id)) is not None
        job = await m.get()
        assert job is not None and (job.status, job.waits) == ("waiting", 2)
        await drain(app, queue, queues=["graph"])
        assert ran[-1] == ("merge", "report-7") and {entry for entry in ran[:2]} == {("fetch", "u1"), ("fetch", "u22")}
        assert await a.result() == 2


async def test_a_merge_after_a_dead_fetch_ends_dead_or_runs_as_its_policy_says(tmp_path: Path) -> None:
    async with await Queue.open(str(tmp_path / "q.db")) as queue:
        bad = await fetch.defer(queue, url="bad")
        dead = await merge.using(after=[bad]).defer(queue, key="dead")
        anyway = await merge.using(after=[bad], on_dependency_dead="run").defer(queue, key="anyway")
        await drain(app, queue, queues=["graph"])
        assert ("merge", "anyway") in ran and ("merge", "dead") not in ran
        job = await dead.get()
        assert job is not None and (job.status, job.reason) == ("dead", "dependency")
        assert (await anyway.get()) is not None


async def test_a_group_runs_its_callback_once_after_every_member(tmp_path: Path) -> None:
    batch = app.group("import-2026-12-03", on_complete=summarize)
    async with await Queue.open(str(tmp_path / "q.db")) as queue:
        async with queue.transaction() as tx:
            rows = [await import_row.using(group=batch).defer(tx, row=row) for row in range(5)]
            sealed = await batch.seal(tx)
        assert (sealed.members, sealed.callback_id) == (5, "group-import-2026-12-03")
        await drain(app, queue, queues=["graph", "reports"])
        outcome = asyncq.GroupOutcome("import-2026-12-03", 5, 4, 1)
        summaries = [entry for entry in ran if entry[0] == "summarize"]
        assert summaries == [("summarize", (outcome, "import", [rows[3].id]))]  # once, with the dead member's id
        state = await batch.state(queue)
        assert state is not None and state.complete and state.callback_status == "done"


async def test_the_callback_must_take_the_outcome_as_group() -> None:
    @app.task(name="no-group")
    async def no_group(other: int) -> None:
        return None

    with pytest.raises(TypeError, match="named group"):
        app.group("g", on_complete=no_group)
    with pytest.raises(TypeError, match="task of this app"):
        asyncq.App().group("g", on_complete=summarize)
    with pytest.raises(ValueError, match="group must be"):
        app.group("bad name")
    with pytest.raises(TypeError, match="list or tuple"):
        merge.using(after="a")  # type: ignore[arg-type]


def test_defer_sync_joins_a_graph_in_the_callers_transaction(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        first = fetch.defer_sync(con, url="x")
        second = merge.using(after=[first], group="sync-group").defer_sync(con, key="k")
        con.execute("COMMIT")
        rows = con.execute("SELECT id, status, waits, group_name FROM asyncq_jobs ORDER BY seq").fetchall()
        assert rows == [(first, "pending", 0, None), (second, "waiting", 1, "sync-group")]
    finally:
        con.close()
