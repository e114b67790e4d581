"""No worker task dies silently, and a failure explains itself.

The regression of the issue "One lifecycle, any store": a product retry policy (a cap of 300 s) with a handler that
raises used to make the lab's bounds raise ``ValueError`` inside the pool's except block; the worker died, ``run``
returned, and the job stayed leased. Also here: the pool's own machinery failing around a job (an observer, a
retry policy's jitter), a store locked by another connection past its busy timeout, and each failed attempt's error
kept with the job.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import T0
from waiting import eventually

from asyncq import JobSpec, Permanent, Pool, Queue, RetryPolicy
from asyncq.errors import StoreBusy

pytestmark = pytest.mark.timeout(60)


async def boom(body: Any, context: Any) -> None:
    raise ValueError(f"boom on attempt {context.attempt}")


async def burst(pool: Pool, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        await pool.run(burst=True)


def rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(path)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


async def test_a_product_retry_cap_of_300_s_retries_then_ends_exhausted(path: Path) -> None:
    clock = [T0]
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        await queue.enqueue("job", {}, max_attempts=3)
        pool = Pool(queue, concurrency=2, retry=RetryPolicy(cap=300.0, jitter=lambda: 1.0))
        pool.register("default", boom)

        await burst(pool)  # attempt 1 fails; the retry waits 1 s (base), so burst ends with the job pending
        job = await queue.get("job")
        assert job is not None
        assert (job.status, job.reason, job.attempts, job.available_at) == ("pending", "retry", 1, T0 + 1_000)
        assert pool.counters.handler_errors == 1 and pool.counters.internal_errors == 0

        for attempt, delay in ((2, 2_000), (3, None)):
            clock[0] = job.available_at
            await burst(pool)
            job = await queue.get("job")
            assert job is not None and job.attempts == attempt
            if delay is not None:
                assert (job.status, job.available_at) == ("pending", clock[0] + delay)
        assert (job.status, job.reason) == ("dead", "exhausted")
        assert [(e.attempt, e.type, e.message) for e in job.errors] == [
            (n, "ValueError", f"boom on attempt {n}") for n in (1, 2, 3)
        ]
        assert "boom on attempt 3" in job.errors[-1].traceback and job.last_error == job.errors[-1]
    assert rows(path, "SELECT count(*) FROM asyncq_jobs WHERE status = 'leased'") == [(0,)]


async def test_burst_returns_only_once_the_queue_is_drained(path: Path) -> None:
    async with await Queue.open(path) as queue:
        for n in range(20):
            await queue.enqueue(f"j{n}", {}, max_attempts=4)
        pool = Pool(queue, concurrency=3, retry=RetryPolicy(cap=300, jitter=lambda: 0.0))
        pool.register("default", boom)
        await burst(pool)
        stats = await queue.stats()
    assert stats.by_status == {"pending": 0, "leased": 0, "done": 0, "dead": 20, "waiting": 0}
    assert stats.dead_by_reason == {"exhausted": 20}


class FailingObserver:
    """An observer that breaks its promise never to raise, on every delivery."""

    def on_claimed(self, count: int) -> None:
        pass

    def on_finished(self, outcome: str, status: str | None) -> None:
        pass

    def on_delivery(self, seconds: float, outcome: str) -> None:
        raise RuntimeError("observer bug")

    def on_lease_lost(self) -> None:
        pass

    def on_store_busy(self) -> None:
        pass


async def test_a_failing_observer_is_logged_counted_and_survived(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    async def ok(body: Any, context: Any) -> None:
        return None

    for n in range(5):
        await queue.enqueue(f"j{n}", {})
    pool = Pool(queue, concurrency=2, observer=FailingObserver())
    pool.register("default", ok)
    with caplog.at_level(logging.ERROR, logger="asyncq.worker.pool"):
        await burst(pool)
    assert (await queue.stats()).by_status["done"] == 5
    assert pool.counters.internal_errors == 5
    assert sum("observer failed" in record.message for record in caplog.records) == 5


async def test_a_retry_policy_whose_jitter_is_out_of_range_does_not_strand_the_job(path: Path) -> None:
    clock = [T0]
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        await queue.enqueue("job", {}, max_attempts=2)
        pool = Pool(queue, retry=RetryPolicy(jitter=lambda: 2.0))  # a ratio above 1: the policy refuses it
        pool.register("default", boom)
        await burst(pool)
        job = await queue.get("job")
    assert job is not None and (job.status, job.reason, job.attempts) == ("pending", "retry", 1)
    assert job.available_at == T0 + RetryPolicy().base_ms  # the policy's base delay, not a stranded lease
    assert pool.counters.internal_errors == 1 and job.errors[0].type == "ValueError"


async def test_a_permanent_failure_keeps_its_error_and_a_success_keeps_none(queue: Queue) -> None:
    async def handler(body: Any, context: Any) -> None:
        if body["fail"]:
            raise Permanent("no such customer")

    await queue.enqueue("bad", {"fail": True})
    await queue.enqueue("good", {"fail": False})
    pool = Pool(queue)
    pool.register("default", handler)
    await burst(pool)
    bad, good = await queue.get("bad"), await queue.get("good")
    assert bad is not None and good is not None
    assert (bad.status, bad.reason) == ("dead", "permanent")
    assert [(e.attempt, e.type, e.message) for e in bad.errors] == [(1, "asyncq.errors.Permanent", "no such customer")]
    assert good.errors == () and good.last_error is None
    [listed] = await queue.list_jobs(status="dead", errors=True)
    assert listed.last_error == bad.errors[0] and listed.errors == (bad.errors[0],)


async def test_pruning_a_job_removes_its_errors_and_a_new_job_of_the_same_id_starts_clean(
    path: Path,
) -> None:
    clock = [T0]
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        await queue.enqueue("job", {}, max_attempts=1)
        pool = Pool(queue)
        pool.register("default", boom)
        await burst(pool)
        assert len((await queue.get("job")).errors) == 1  # type: ignore[union-attr]
        clock[0] += 2 * 86_400_000  # an exhausted job is dated by its deadline (a day after enqueue) for prune
        assert (await queue.prune(1_000))["deleted"] == 1
        assert rows(path, "SELECT count(*) FROM asyncq_errors") == [(0,)]
        await queue.enqueue("job", {})
        job = await queue.get("job")
    assert job is not None and job.errors == () and job.status == "pending"


async def test_a_store_locked_elsewhere_past_the_busy_timeout_is_waited_out(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with await Queue.open(path, busy_timeout=0.05) as queue:
        for n in range(50):
            await queue.enqueue(f"j{n}", {})
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")  # another process's writer, stopped while it holds the lock

        async def handler(body: Any, context: Any) -> None:
            return None

        pool = Pool(queue, concurrency=4, poll_min=0.01, poll_max=0.05)
        pool.register("default", handler)
        with caplog.at_level(logging.WARNING, logger="asyncq.worker.pool"):
            running = asyncio.create_task(burst(pool))
            # the pool keeps trying while the lock is held
            await eventually(lambda: pool.counters.store_busy >= 3, "three busy tries of the pool", timeout=4)
            assert not running.done()
            blocker.execute("COMMIT")
            blocker.close()
            await running
        assert (await queue.stats()).by_status["done"] == 50
    assert any("store busy" in record.message for record in caplog.records)


async def test_a_group_commit_waits_for_a_lock_held_elsewhere_on_the_loop_and_lands_when_it_is_free(path: Path) -> None:
    """Within the busy timeout, a group commit whose BEGIN finds the lock held tries again in turn from the loop:
    other tasks run meanwhile, no busy error is raised, and the commit lands once the holder lets go."""
    async with await Queue.open(path, busy_timeout=30) as queue:
        await queue.enqueue_many([JobSpec(f"j{n}", {}) for n in range(5)])
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")  # another process's writer, in the middle of its commit
        committing = asyncio.create_task(queue.commit_cycle([], "w1", [("default", 5)], 30_000, 5))
        ticks = 0
        async with asyncio.timeout(20):
            while ticks < 50:  # the loop keeps running other tasks while the commit waits for the lock
                await asyncio.sleep(0.001)
                ticks += 1
        assert not committing.done()
        blocker.execute("COMMIT")
        blocker.close()
        async with asyncio.timeout(20):
            settled = await committing
    assert sorted(ticket.id for ticket in settled.tickets) == [f"j{n}" for n in range(5)]


async def test_a_busy_store_is_also_a_sqlite_operational_error(path: Path) -> None:
    async with await Queue.open(path, busy_timeout=0.05) as queue:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreBusy) as raised:
                await queue.enqueue("job", {})
            assert isinstance(raised.value, sqlite3.OperationalError) and "locked" in str(raised.value)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert await queue.enqueue("job", {}) is True
