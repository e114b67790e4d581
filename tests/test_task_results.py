"""Tasks' results: stored with the job by the commit of its finish (never by a stale worker), awaited with
``job.result()`` (value, ``JobFailed``, ``TimeoutError``), kept for the task's retention and pruned, shown by
``asyncq show``; the example of the issue's point 1 and ``asyncq worker`` run as processes."""

from __future__ import annotations

import asyncio
import datetime
import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli, run_json
from drivers import DRIVERS, Driver
from pydantic import BaseModel

import asyncq
from asyncq.core.jobs import StoredResult
from asyncq.store.sqlite.migrations import SCHEMA_VERSION
from asyncq.testing import drain, queue_clock, temporary_queue

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=sorted(DRIVERS))
def driver(request: pytest.FixtureRequest) -> Driver:
    """Each driver of the registry (PostgreSQL's tests skip, or fail under CI, when the server does not answer)."""
    return DRIVERS[request.param].prepare(request)


@pytest.fixture
async def queue(driver: Driver, tmp_path: Path) -> AsyncIterator[asyncq.Queue]:
    """A temporary queue of the driver: a SQLite file, or a fresh PostgreSQL schema dropped after the test."""
    async with driver.target(tmp_path, "queue") as where, temporary_queue(where) as opened:
        yield opened


class Receipt(BaseModel):
    to: str
    at: datetime.datetime


app = asyncq.App()


@app.task(queue="emails", result_ttl=60.0)
async def send(to: str) -> Receipt:
    return Receipt(to=to, at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))


@app.task(queue="emails", max_attempts=1)
async def broken(n: int) -> int:
    raise asyncq.Permanent(f"broken {n}")


@app.task(queue="emails")
async def lies(n: int) -> int:
    return "not an int"  # type: ignore[return-value]


@app.task(queue="slow")
async def nothing() -> None:
    return None


async def result_rows(queue: asyncq.Queue, driver: Driver) -> int:
    """How many results the store keeps (its table read directly: on PostgreSQL the schema is the search path)."""
    table = "asyncq_results" if driver.kind == "sqlite" else "results"
    async with queue.transaction() as tx:
        [(count,)] = await tx.execute(f"SELECT count(*) FROM {table}")
    return int(count)


async def test_the_result_is_validated_stored_and_returned(queue: asyncq.Queue) -> None:
    job = await send.defer(queue, to="a@b.example")
    await drain(app, queue)
    receipt = await job.result(timeout=5.0)
    assert receipt == Receipt(to="a@b.example", at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    assert isinstance(receipt.at, datetime.datetime)
    stored = await job.get()
    assert stored is not None and stored.result == {"to": "a@b.example", "at": "2026-01-01T00:00:00Z"}
    none_job = await nothing.defer(queue)
    await drain(app, queue)
    assert await none_job.result(timeout=5.0) is None


async def test_result_is_woken_by_the_finish_of_a_running_worker(queue: asyncq.Queue) -> None:
    worker = asyncio.create_task(app.run_worker(queue, concurrency=2))
    try:
        jobs = [await send.defer(queue, to=f"{n}@b.example") for n in range(5)]
        results = await asyncio.wait_for(asyncio.gather(*(job.result(timeout=10.0) for job in jobs)), 15)
        assert [r.to for r in results] == [f"{n}@b.example" for n in range(5)]
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)


async def test_a_dead_job_raises_job_failed_with_its_stored_error(queue: asyncq.Queue) -> None:
    job = await broken.defer(queue, 3)
    await drain(app, queue)
    with pytest.raises(asyncq.JobFailed) as caught:
        await job.result(timeout=5.0)
    assert caught.value.reason == "permanent" and caught.value.error_message == "broken 3"
    assert caught.value.error_type == "asyncq.errors.Permanent"


async def test_a_return_value_that_does_not_fit_its_annotation_is_permanent_and_keeps_no_result(
    queue: asyncq.Queue,
) -> None:
    job = await lies.defer(queue, 1)
    await drain(app, queue)
    with pytest.raises(asyncq.JobFailed, match="does not fit its annotation"):
        await job.result(timeout=5.0)
    stored = await job.get()
    assert stored is not None and stored.attempts == 1 and stored.result_json is None


async def test_result_times_out_while_the_job_is_pending(queue: asyncq.Queue) -> None:
    job = await send.defer(queue, to="a@b.example")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError, match="still pending"):
        await job.result(timeout=0.2)
    assert loop.time() - started >= 0.2
    stored = await job.get()
    assert stored is not None and stored.status == "pending"


async def test_the_result_is_kept_for_the_tasks_retention_then_pruned(queue: asyncq.Queue, driver: Driver) -> None:
    job = await send.defer(queue, to="a@b.example")
    await drain(app, queue)
    assert await result_rows(queue, driver) == 1
    queue_clock(queue).advance(30)  # its retention (60 s) is not over
    await queue.prune(older_than=3600)
    assert (await job.result(timeout=1.0)).to == "a@b.example"
    queue_clock(queue).advance(31)
    await queue.prune(older_than=3600)  # the result's retention is over; the job is younger than an hour
    stored = await job.get()
    assert stored is not None and stored.status == "done" and stored.result_json is None
    with pytest.raises(LookupError, match="keeps no result"):
        await job.result(timeout=1.0)
    await queue.prune(older_than=0)
    with pytest.raises(LookupError, match="does not exist"):
        await job.result(timeout=1.0)
    assert await result_rows(queue, driver) == 0


async def test_a_raw_handlers_return_value_is_kept_like_a_tasks_result(queue: asyncq.Queue, driver: Driver) -> None:
    """A ``Pool.handler`` that returns a JSON value has it stored by the commit of its finish, read back with
    ``Queue.get(id).result``, kept ``result_ttl`` and pruned like a task's; ``None`` keeps nothing; a value that is not
    JSON ends the job dead as ``permanent`` with the reason kept (its effect happened: a retry cannot fix it)."""
    pool = asyncq.Pool(queue, concurrency=2, result_ttl=60)

    @pool.handler("raw")
    async def handle(body: dict[str, Any], context: asyncq.JobContext) -> object:
        returns: dict[str, object] = {"echo": {"n": body.get("n"), "attempt": context.attempt}, "bad": {1, 2}}
        return returns.get(body["returns"])

    for job_id, returns in (("r-echo", "echo"), ("r-none", "none"), ("r-bad", "bad")):
        await queue.enqueue(job_id, {"returns": returns, "n": 7}, queue="raw")
    await pool.run(burst=True)
    echo, none, bad = [await queue.get(job_id) for job_id in ("r-echo", "r-none", "r-bad")]
    assert echo is not None and (echo.status, echo.result) == ("done", {"n": 7, "attempt": 1})
    assert echo.result_json == '{"attempt":1,"n":7}'  # canonical JSON, as a task's
    assert none is not None and (none.status, none.result_json) == ("done", None)
    assert bad is not None and (bad.status, bad.reason, bad.result_json) == ("dead", "permanent", None)
    assert bad.last_error is not None and "return value cannot be kept" in bad.last_error.message
    assert await result_rows(queue, driver) == 1
    queue_clock(queue).advance(61)
    await queue.prune(older_than=3600)  # the result's retention is over; the job is younger than an hour
    pruned = await queue.get("r-echo")
    assert pruned is not None and pruned.status == "done" and pruned.result_json is None
    assert await result_rows(queue, driver) == 0


async def test_pruning_a_job_removes_its_result_with_it(queue: asyncq.Queue, driver: Driver) -> None:
    job = await send.defer(queue, to="a@b.example")
    await drain(app, queue)
    assert await result_rows(queue, driver) == 1
    queue_clock(queue).advance(10)
    assert (await queue.prune(older_than=5))["deleted"] == 1
    assert await result_rows(queue, driver) == 0
    assert await job.get() is None


async def test_a_stale_worker_writes_no_result(queue: asyncq.Queue) -> None:
    """A worker whose lease ran out and whose job another worker now holds: its finish, and its result, are refused
    in the same statement; the live worker's result is the one kept."""
    await queue.enqueue("j", {"task": "send", "args": {"to": "x"}}, queue="emails")
    (old,) = await queue.claim("w1", queue="emails", lease=1.0)
    queue_clock(queue).advance(2)
    (new,) = await queue.claim("w2", queue="emails", lease=30.0)
    stale = (old, "ok", 0, None, StoredResult('"stale"', 60_000))
    assert await queue.finish_many([stale]) == [None]
    assert (await queue.get("j")).result_json is None  # type: ignore[union-attr]
    assert await queue.finish_many([(new, "ok", 0, None, StoredResult('"live"', 60_000))]) == ["done"]
    assert (await queue.get("j")).result == "live"  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="StoredResult"):
        await queue.finish_many([(new, "ok", 0, None, '"raw"')])  # type: ignore[list-item]


async def test_a_result_is_not_kept_for_a_retry(queue: asyncq.Queue) -> None:
    await queue.enqueue("j", {}, max_attempts=3)
    (ticket,) = await queue.claim("w1")
    assert await queue.finish_many([(ticket, "retry", 0, None, StoredResult("1", 1000))]) == ["pending"]
    assert (await queue.get("j")).result_json is None  # type: ignore[union-attr]


def test_a_version_5_file_migrates_to_keep_results(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as con:
        from asyncq.store.sqlite.migrations import MIGRATIONS

        for step in MIGRATIONS[:5]:
            for statement in step:
                con.execute(statement)
        con.execute("PRAGMA user_version = 5")
    assert SCHEMA_VERSION == 7

    async def use() -> str:
        async with asyncq.open(path) as queue:
            job = await send.defer(queue, to="old@b.example")
            await drain(app, queue)
            return (await job.result(timeout=5.0)).to

    assert asyncio.run(use()) == "old@b.example"
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA user_version").fetchone() == (7,)


async def test_asyncq_show_prints_the_result(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    async with asyncq.open(path) as queue:
        job = await send.using(key="shown").defer(queue, to="a@b.example")
        await drain(app, queue)
    shown = run_json("show", "shown", "--db", str(path), "--json", cwd=tmp_path)
    assert shown["job"]["result"] == {"to": "a@b.example", "at": "2026-01-01T00:00:00Z"}
    text = run_cli("show", job.id, "--db", str(path), cwd=tmp_path)
    assert text.returncode == 0 and "result:" in text.stdout and '"to": "a@b.example"' in text.stdout


def test_the_issue_example_runs_as_written(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "tasks.py"), str(tmp_path / "app.db")],
        capture_output=True,
        text=True,
        timeout=50,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "receipt: to='a@b.example' subject='hi' urgent=False" in done.stdout
    assert "welcome: to='c@d.example' subject='welcome' urgent=False" in done.stdout
    assert "sending 'thanks' to e@f.example (urgent)" in done.stdout
    with sqlite3.connect(tmp_path / "app.db") as con:
        assert con.execute("SELECT email FROM signups").fetchall() == [("e@f.example",)]
        assert con.execute("SELECT count(*), min(status) FROM asyncq_jobs").fetchone() == (3, "done")


def test_asyncq_worker_runs_an_apps_tasks(tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text(
        textwrap.dedent(
            """
            import asyncq

            app = asyncq.App()

            @app.task(queue="mail")
            async def greet(name: str) -> str:
                return f"hello {name}"
            """
        )
    )
    path = tmp_path / "app.db"
    seed = f"""
import asyncio, asyncq, myapp
async def main():
    async with asyncq.open({str(path)!r}) as queue:
        await myapp.greet.using(key="g1").defer(queue, name="ada")
asyncio.run(main())
"""
    env = {"PYTHONPATH": f"{ROOT}:{tmp_path}", "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", seed], check=True, cwd=tmp_path, env=env, timeout=30)
    worked = run_cli("worker", "myapp:app", "--db", str(path), "--burst", "--json", cwd=tmp_path)
    assert worked.returncode == 0, worked.stderr
    assert json.loads(worked.stdout)["finished"] == {"done": 1}
    assert run_json("show", "g1", "--db", str(path), "--json", cwd=tmp_path)["job"]["result"] == "hello ada"
    bad = run_cli("worker", "myapp", "--db", str(path), cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "module:attribute" in bad.stderr
    missing = run_cli("worker", "nosuchmodule:app", "--db", str(path), cwd=tmp_path)
    assert missing.returncode == 1 and "cannot load the app" in missing.stderr
