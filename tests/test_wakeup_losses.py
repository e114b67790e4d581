"""A pool counts the wake-ups its store lost (issue 30: each reconnect logged, counted and a metric): a PostgreSQL
listener whose backend is ended, a SQLite file watcher whose file left its path. Each loss shows once in
``PoolCounters.wakeups_lost`` and ``asyncq_wakeups_lost_total``, and the pool goes on working by its poll."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from postgres_support import execute
from waiting import eventually

from asyncq import Queue
from asyncq.store.postgres.connection import parse_url
from asyncq.store.postgres.queue_store import PostgresQueueStore
from asyncq.web.metrics import PoolMetrics
from asyncq.worker.context import JobContext
from asyncq.worker.pool import Pool

pytestmark = pytest.mark.timeout(60)


def lost_total(metrics: PoolMetrics) -> float | None:
    return metrics.registry.get_sample_value("asyncq_wakeups_lost_total")


def pool_on(queue: Queue, ran: list[str]) -> tuple[Pool, PoolMetrics]:
    async def handle(body: Any, context: JobContext) -> None:
        ran.append(context.id)

    metrics = PoolMetrics()
    pool = Pool(queue, observer=metrics, poll_min=0.01, poll_max=0.05)
    pool.register("default", handle)
    return pool, metrics


@pytest.mark.usefixtures("postgres_database")
async def test_a_pool_counts_its_lost_listener_and_still_runs_jobs(postgres_url: str) -> None:
    async with await Queue.open(postgres_url) as queue:
        store = queue.store
        assert isinstance(store, PostgresQueueStore)
        ran: list[str] = []
        pool, metrics = pool_on(queue, ran)
        running = asyncio.create_task(pool.run())
        try:
            await eventually(lambda: store.wakeups.listening, "the pool's store listening", timeout=5)
            assert (pool.counters.wakeups_lost, lost_total(metrics)) == (0, 0.0)
            await execute(  # only this store's listener: its database, its channel
                parse_url(postgres_url).dsn,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query = $1 AND pid <> pg_backend_pid()",
                f'LISTEN "{store.wakeups.channel}"',
            )
            await eventually(lambda: pool.counters.wakeups_lost == 1, "the pool to count the lost listener")
            assert lost_total(metrics) == 1.0
            await queue.enqueue("after", {})
            await eventually(lambda: ran == ["after"], "a job enqueued after the loss to run")
        finally:
            pool.stop()
            await running
    assert pool.counters.wakeups_lost == 1  # counted once, however many waits followed


async def test_a_pool_counts_a_file_watcher_that_failed_and_still_runs_jobs(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    async with await Queue.open(path) as queue, await Queue.open(path) as producer:
        ran: list[str] = []
        pool, metrics = pool_on(queue, ran)
        running = asyncio.create_task(pool.run())
        try:
            await eventually(lambda: pool.counters.commits > 0, "the pool's first claim")
            assert (pool.counters.wakeups_lost, lost_total(metrics)) == (0, 0.0)
            os.link(path, tmp_path / "kept.db")  # the file stays; its name goes: the watcher cannot follow it
            os.unlink(path)
            await eventually(lambda: pool.counters.wakeups_lost == 1, "the pool to count the failed watcher")
            assert lost_total(metrics) == 1.0
            os.link(tmp_path / "kept.db", path)
            await producer.enqueue("after", {})
            await eventually(lambda: ran == ["after"], "a job enqueued after the loss to run (by the poll)")
        finally:
            pool.stop()
            await running
