"""Misuse refused at once, before any change: a transaction handle outside its block, a call that would wait for
the caller's own transaction, a block that tries to commit itself, and arguments that would break a pool."""

from __future__ import annotations

import asyncio
import math
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from asyncq import JobSpec, Pool, Queue, RetryPolicy

pytestmark = pytest.mark.timeout(30)


def dump(path: Path) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT * FROM asyncq_jobs ORDER BY seq").fetchall()
    finally:
        con.close()


def no_transaction_open(queue: Queue) -> bool:
    return not queue.store._file.conn._conn.in_transaction  # type: ignore[attr-defined]


async def test_a_transaction_handle_is_refused_after_its_block(queue: Queue, path: Path) -> None:
    async with queue.transaction() as tx:
        pass
    with pytest.raises(RuntimeError, match="block has ended"):
        await tx.enqueue("late", {})
    with pytest.raises(RuntimeError, match="block has ended"):
        await tx.execute("SELECT 1")
    async with queue.transaction() as other:
        with pytest.raises(RuntimeError, match="block has ended"):  # not even inside another task's block
            await tx.enqueue("late", {})
        assert await other.enqueue("inside", {}) is True
    assert [row[1] for row in dump(path)] == ["inside"]


@pytest.mark.parametrize("inner", ["enqueue", "transaction", "stats", "get"])
async def test_calling_the_queue_inside_its_own_transaction_fails_at_once(queue: Queue, path: Path, inner: str) -> None:
    async with asyncio.timeout(5):  # it used to wait for itself forever
        with pytest.raises(RuntimeError, match="holds an open transaction"):
            async with queue.transaction() as tx:
                await tx.enqueue("outer", {})
                if inner == "enqueue":
                    await queue.enqueue("inner", {})
                elif inner == "transaction":
                    async with queue.transaction():
                        pass
                else:
                    await getattr(queue, inner)(*(["outer"] if inner == "get" else []))
    assert dump(path) == [] and no_transaction_open(queue)  # the block raised: its job rolled back
    assert await queue.enqueue("after", {}) is True


async def test_another_task_waits_for_the_block_instead(queue: Queue, path: Path) -> None:
    async with queue.transaction() as tx:
        waiting = asyncio.create_task(queue.enqueue("other-task", {}))
        lock = queue.store._file._lock  # type: ignore[attr-defined]  # the SQLite store's write lock
        async with asyncio.timeout(5):
            while not lock._waiters:  # the other task queues on the lock the block holds (no sleep: a yield)
                await asyncio.sleep(0)
        assert not waiting.done()
        await tx.enqueue("block", {})
    assert await waiting is True
    assert [row[1] for row in dump(path)] == ["block", "other-task"]


@pytest.mark.parametrize("statement", ["COMMIT", "  commit;", "END", "ROLLBACK", "rollback transaction", "BEGIN"])
async def test_a_block_cannot_end_its_own_transaction(queue: Queue, path: Path, statement: str) -> None:
    with pytest.raises(RuntimeError, match="cannot begin, commit or roll it back"):
        async with queue.transaction() as tx:
            await tx.enqueue("job", {})
            await tx.execute(statement)
    assert dump(path) == [] and no_transaction_open(queue)


async def test_a_savepoint_rollback_stays_inside_the_block(queue: Queue, path: Path) -> None:
    async with queue.transaction() as tx:
        await tx.enqueue("kept", {})
        await tx.execute("SAVEPOINT s")
        await tx.enqueue("undone", {})
        await tx.execute("ROLLBACK TO s")
        await tx.execute("RELEASE s")
    assert [row[1] for row in dump(path)] == ["kept"]


BAD_POOL_ARGUMENTS = [
    ({"poll_min": 0}, ValueError),
    ({"poll_min": -1.0}, ValueError),
    ({"poll_min": math.nan}, ValueError),
    ({"poll_max": 0.0001}, ValueError),
    ({"poll_min": 0.5, "poll_max": 0.1}, ValueError),
    ({"job_timeout": -1}, ValueError),
    ({"job_timeout": 0}, ValueError),
    ({"job_timeout": math.inf}, ValueError),
    ({"job_timeout": True}, ValueError),
    ({"concurrency": 0}, ValueError),
    ({"concurrency": True}, ValueError),
    ({"lease": 0.003}, ValueError),
    ({"retry": "fast"}, TypeError),
]


@pytest.mark.parametrize(("kwargs", "error"), BAD_POOL_ARGUMENTS, ids=lambda v: repr(v)[:40])
async def test_bad_pool_arguments_are_refused(queue: Queue, kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        Pool(queue, **kwargs)


async def test_a_pool_needs_a_queue_and_callable_handlers(queue: Queue, path: Path) -> None:
    with pytest.raises(TypeError, match="needs a Queue"):
        Pool(str(path))  # type: ignore[arg-type]
    pool = Pool(queue)
    with pytest.raises(TypeError, match="callable"):
        pool.register("default", "not a function")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"busy_timeout": math.nan},
        {"busy_timeout": -1},
        {"busy_timeout": "5"},
        {"max_body_bytes": True},
        {"max_body_bytes": 0},
        {"clock": 5},
        {"read_only": 1},
    ],
    ids=lambda v: repr(v),
)
async def test_bad_open_arguments_are_refused_before_the_file_is_made(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError)):
        await Queue.open(tmp_path / "q.db", **kwargs)
    assert not (tmp_path / "q.db").exists()


@pytest.mark.parametrize("not_a_ticket", [None, "job", {"id": "job"}, ("job", 1)], ids=repr)
async def test_a_value_that_is_not_a_ticket_is_a_type_error(queue: Queue, path: Path, not_a_ticket: Any) -> None:
    await queue.enqueue("job", {})
    await queue.claim("w1")
    before = dump(path)
    with pytest.raises(TypeError, match="Ticket"):
        await queue.finish(not_a_ticket, "ok")
    with pytest.raises(TypeError, match="Ticket"):
        await queue.extend(not_a_ticket)
    with pytest.raises(TypeError, match="Ticket"):
        await queue.release_many([not_a_ticket])
    with pytest.raises(TypeError, match="Ticket"):
        await queue.reconcile(not_a_ticket)
    assert dump(path) == before and no_transaction_open(queue)


async def test_enqueue_many_takes_job_specs_only(queue: Queue, path: Path) -> None:
    with pytest.raises(TypeError, match="JobSpec"):
        await queue.enqueue_many([JobSpec("a", {}), ("b", {})])  # type: ignore[list-item]
    assert dump(path) == []


@pytest.mark.parametrize(
    "kwargs",
    [{"base": 0}, {"base": True}, {"cap": 0.01, "base": 0.02}, {"cap": 8 * 86_400}, {"jitter": 0.5}],
    ids=repr,
)
def test_a_bad_retry_policy_is_refused_when_built(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_a_retry_policy_takes_the_products_ranges() -> None:
    policy = RetryPolicy(base=1, cap=timedelta(days=1), jitter=lambda: 1.0)
    assert policy.delay_ms(1) == 1_000 and policy.delay_ms(10) == 512_000
    assert policy.delay_ms(1000) == 86_400_000  # the product's maximum attempts, capped at a day


@pytest.mark.parametrize("now_ms", [-1, 1.5, True, 10**16, 10**30, math.nan, "0"], ids=repr)
def test_enqueue_sync_checks_its_time_before_any_change(tmp_path: Path, now_ms: Any) -> None:
    from asyncq import enqueue_sync

    con = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
    try:
        with pytest.raises(ValueError, match="now_ms"):
            enqueue_sync(con, "job", {}, now_ms=now_ms)
        assert not con.in_transaction
        assert con.execute("SELECT name FROM sqlite_master").fetchall() == []  # not even the tables
    finally:
        con.close()


def test_durations_are_seconds_and_the_old_millisecond_names_are_gone() -> None:
    assert RetryPolicy(base=0.25, cap=2).cap_ms == 2_000 and RetryPolicy(base=0.25).base_ms == 250
    spec = JobSpec("a", {}, ttl=60, delay=timedelta(seconds=5))
    row = spec.to_row(1_000)
    assert (row.available_at, row.deadline) == (6_000, 61_000)
    with pytest.raises(TypeError, match="cap_ms"):
        RetryPolicy(cap_ms=300_000)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="ttl_ms"):
        JobSpec("a", {}, ttl_ms=60_000)  # type: ignore[call-arg]


async def test_the_queue_takes_seconds(queue: Queue, path: Path) -> None:
    await queue.enqueue("job", {}, ttl=120.0, delay=0)
    [ticket] = await queue.claim("w1", lease=2.5)
    assert ticket.lease_until - ticket.deadline + 120_000 == 2_500  # the lease ran from the same clock reading
    renewed = await queue.extend(ticket, lease=5)
    assert renewed is not None
    for call in (
        lambda: queue.extend(renewed, lease_ms=1_000),  # type: ignore[call-arg]
        lambda: queue.claim("w1", lease_ms=1_000),  # type: ignore[call-arg]
        lambda: queue.enqueue("j2", {}, ttl_ms=1_000),  # type: ignore[call-arg]
        lambda: queue.finish(renewed, "retry", delay_ms=1_000),  # type: ignore[call-arg]
        lambda: queue.redrive("job", "note", ttl_ms=1_000),  # type: ignore[call-arg]
    ):
        with pytest.raises(TypeError, match="_ms"):
            await call()
