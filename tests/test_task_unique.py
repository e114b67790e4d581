"""A task's unique jobs: ``@app.task(unique=True)`` derives the key from the task's name and its canonical
arguments (one active job per call), ``using(unique_key=…)`` names one, ``on_conflict="raise"`` raises; the
handle of a deferral that found its key held is the active job's (``added`` False). Once the job ran, the same call
is a new job."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import asyncq
from asyncq.queue import Queue
from asyncq.tasks.task import derived_unique_key
from asyncq.testing import drain

pytestmark = pytest.mark.timeout(30)

app = asyncq.App()


@app.task(queue="mail", unique=True)
async def send(to: str, copies: int = 1) -> None:
    return None


@app.task(queue="mail")
async def digest(to: str) -> None:
    return None


async def test_the_same_call_while_one_is_active_is_that_job(tmp_path: Path) -> None:
    async with await Queue.open(str(tmp_path / "q.db")) as queue:
        first = await send.defer(queue, to="a@b")
        again = await send.defer(queue, copies=1, to="a@b")  # the same arguments, canonically
        other = await send.defer(queue, to="c@d")
        assert (first.added, again.added, again.id, other.added) == (True, False, first.id, True)
        job = await first.get()
        assert job is not None and job.unique_key == derived_unique_key(
            {"task": "send", "args": {"to": "a@b", "copies": 1}}
        )
        assert job.unique_key is not None and job.unique_key.startswith("send:")
        with pytest.raises(asyncq.UniqueConflict) as raised:
            await send.using(on_conflict="raise").defer(queue, to="a@b")
        assert raised.value.existing_id == first.id
        await drain(app, queue, queues=["mail"])
        after = await send.defer(queue, to="a@b")  # the first ended done: its key is free
        assert after.added and after.id != first.id


async def test_using_names_a_key_for_any_task(tmp_path: Path) -> None:
    async with await Queue.open(str(tmp_path / "q.db")) as queue:
        first = await digest.using(unique_key="digest:42").defer(queue, to="a@b")
        async with queue.transaction() as tx:
            second = await digest.using(unique_key="digest:42").defer(tx, to="someone@else")
        plain = await digest.defer(queue, to="a@b")  # not unique: another job
        assert (second.id, second.added, plain.added) == (first.id, False, True)
        with pytest.raises(ValueError, match="unique_key"):
            digest.using(unique_key=" padded")


def test_defer_sync_answers_with_the_active_jobs_id(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    try:
        first = send.defer_sync(con, to="a@b")
        assert send.defer_sync(con, to="a@b") == first
        assert asyncq.enqueue_sync(con, "k1", {}, unique_key="k") is True
        assert asyncq.enqueue_sync(con, "k2", {}, unique_key="k") == "k1"
        with pytest.raises(asyncq.UniqueConflict):
            asyncq.enqueue_sync(con, "k3", {}, unique_key="k", on_conflict="raise")
        with pytest.raises(TypeError, match="unique_key"):
            asyncq.enqueue_sync(con, "k4", {}, unique_key=7)  # type: ignore[arg-type]
        assert con.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (2,) and not con.in_transaction
    finally:
        con.close()


def test_unique_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="unique"):
        asyncq.App().task(unique=1)(digest.function)  # type: ignore[call-overload]
