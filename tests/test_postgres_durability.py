"""Durability on PostgreSQL, shown: what asyncq acknowledged is on the server after a SIGKILL of the server.

On a cluster the test owns (``pg_cluster_support``: ``fsync=on``, ``synchronous_commit=on``), 32 tasks enqueue (or
claim and finish) jobs one at a time through one ``Queue`` with a pool of 16 connections, so that many commits are
in flight at every moment. The task whose ``enqueue`` (or ``finish``) has just returned, once a few hundred have,
SIGKILLs the postmaster and every backend (``Cluster.kill``: no shutdown, no checkpoint, the server's shared
memory with its WAL buffers gone), before the loop runs again. The server is started again (recovery from the
WAL) and every acknowledged job is read back: enqueued ones present with their body, finished ones ``done``.
Four rounds a test, each on the data the previous rounds left. The third test finishes through a ``Pool`` (32
tasks, its group commits): a finish counts as acknowledged when the pool logs it ``done``, which it does once the
commit has returned, and the kill runs inside that log call.

A commit acknowledged before its WAL reached the kernel would be lost here: with ``synchronous_commit=off`` the
WAL writer flushes every 200 ms, and a SIGKILL of every server process loses the WAL buffers' tail. asyncq's
connections are asserted to read ``synchronous_commit`` back as ``on`` and the server to run with ``fsync=on``.
(A SIGKILL leaves the kernel's page cache, so this shows what a server crash keeps, not a power cut: that is
``fsync``'s part, which the server is asserted to have on.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from pg_cluster_support import Cluster
from waiting import eventually

from asyncq import JobContext, JobSpec, Pool, Queue
from asyncq.errors import StoreError

ROUNDS = 4
WRITERS = 32
POOL = 16

pytestmark = [pytest.mark.timeout(240)]


def url(cluster: Cluster) -> str:
    return f"{cluster.url()}?pool_size={POOL}"


async def assert_durable_settings(cluster: Cluster, queue: Queue) -> None:
    """The server runs with ``fsync`` on, and asyncq's own connection commits synchronously."""
    async with queue.transaction() as tx:
        assert [tuple(row) for row in await tx.execute("SHOW synchronous_commit")] == [("on",)]
    conn = await asyncpg.connect(cluster.url(), timeout=10)
    try:
        assert await conn.fetchval("SHOW fsync") == "on"
        assert await conn.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await conn.close()


async def hammer(write: Callable[[int], Awaitable[str | None]], kill_after: int, kill: Callable[[], None]) -> set[str]:
    """Run ``WRITERS`` tasks calling ``write(n)`` (the id it acknowledged, or ``None``) until the server is gone;
    the task whose call returned the ``kill_after``-th acknowledgment kills it at once. The acknowledged ids."""
    acknowledged: set[str] = set()
    counter = iter(range(10**9))
    killed = False

    async def writer() -> None:
        nonlocal killed
        while not killed:
            job_id = await write(next(counter))
            if job_id is not None:
                acknowledged.add(job_id)
            if len(acknowledged) >= kill_after and not killed:
                kill()  # blocks the loop: no other task runs between this return and the kill
                killed = True

    results = await asyncio.gather(*(writer() for _ in range(WRITERS)), return_exceptions=True)
    # Every writer ended: the killer (and any that returned between its call and the kill) by returning, the
    # others, whose calls the kill caught in flight, by the error of their lost connection.
    in_flight = [result for result in results if isinstance(result, BaseException)]
    assert killed and len(in_flight) >= WRITERS // 2, results
    assert all(isinstance(error, StoreError) for error in in_flight), in_flight
    return acknowledged


async def stored(cluster: Cluster, sql: str) -> dict[str, str]:
    conn = await asyncpg.connect(cluster.url(), timeout=30)
    try:
        return {str(job_id): str(value) for job_id, value in await conn.fetch(sql)}
    finally:
        await conn.close()


async def close(queue: Queue) -> None:
    with contextlib.suppress(Exception):  # its connections died with the server
        await asyncio.wait_for(queue.close(), 30)


async def test_every_acknowledged_enqueue_survives_a_sigkill_of_the_server(cluster: Cluster) -> None:
    rng = random.Random(5)
    every: set[str] = set()
    for round_ in range(ROUNDS):
        queue = await Queue.open(url(cluster))
        await assert_durable_settings(cluster, queue)

        async def enqueue(n: int, queue: Queue = queue, round_: int = round_) -> str:
            job_id = f"r{round_}-{n:06d}"
            await queue.enqueue(job_id, {"n": n})
            return job_id

        acknowledged = await hammer(enqueue, rng.randint(200, 800), cluster.kill)
        await close(queue)
        cluster.start()
        rows = await stored(cluster, "SELECT id, body FROM asyncq.jobs")
        missing = acknowledged - set(rows)
        assert not missing, f"round {round_}: {len(missing)} acknowledged enqueues lost: {sorted(missing)[:10]}"
        assert all(json.loads(rows[job_id]) == {"n": int(job_id.split("-")[1])} for job_id in acknowledged)
        every |= acknowledged
    assert len(every) >= ROUNDS * 200


async def test_every_acknowledged_finish_survives_a_sigkill_of_the_server(cluster: Cluster) -> None:
    rng = random.Random(7)
    async with await Queue.open(url(cluster)) as queue:
        for start in range(0, ROUNDS * 1000, 500):
            await queue.enqueue_many([JobSpec(f"job-{n:06d}", {"n": n}) for n in range(start, start + 500)])
    finished_all: set[str] = set()
    for round_ in range(ROUNDS):
        queue = await Queue.open(url(cluster))
        await assert_durable_settings(cluster, queue)

        async def claim_and_finish(_n: int, queue: Queue = queue, round_: int = round_) -> str | None:
            tickets = await queue.claim(f"owner-{round_}", lease=300)
            if not tickets:
                return None
            status = await queue.finish(tickets[0], "ok")
            assert status == "done"
            return tickets[0].id

        finished = await hammer(claim_and_finish, rng.randint(100, 400), cluster.kill)
        await close(queue)
        cluster.start()
        rows = await stored(cluster, "SELECT id, status FROM asyncq.jobs")
        not_done = {job_id: rows.get(job_id) for job_id in finished if rows.get(job_id) != "done"}
        assert not not_done, f"round {round_}: {len(not_done)} finishes lost: {list(not_done.items())[:10]}"
        finished_all |= finished
    assert len(finished_all) >= ROUNDS * 100


class AcknowledgedFinishes(logging.Handler):
    """The pool's own acknowledgment of each finish: its ``job %s token %d -> %s`` debug line, written once the
    group commit returned; after the ``kill_after``-th ``done`` one, ``kill`` runs at once, in that same call."""

    def __init__(self, kill_after: int, kill: Callable[[], None]) -> None:
        super().__init__(logging.DEBUG)
        self.done: set[str] = set()
        self.kill_after, self.kill, self.killed = kill_after, kill, asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if record.msg == "job %s token %d -> %s" and isinstance(args, tuple) and args[2] == "done":
            if self.killed.is_set():
                return
            self.done.add(str(args[0]))
            if len(self.done) >= self.kill_after:
                self.kill()
                self.killed.set()


async def test_every_finish_a_pool_acknowledged_survives_a_sigkill_of_the_server(cluster: Cluster) -> None:
    """The same through ``Pool``'s group commits (32 tasks, claims and finishes batched): every job whose finish the
    pool logged as ``done`` is ``done`` after the server's SIGKILL and recovery."""
    rng = random.Random(11)
    async with await Queue.open(url(cluster)) as queue:
        for start in range(0, ROUNDS * 1500, 500):
            await queue.enqueue_many([JobSpec(f"job-{n:06d}", {"n": n}) for n in range(start, start + 500)])
    pool_log = logging.getLogger("asyncq.worker.pool")
    for round_ in range(ROUNDS):
        acknowledged = AcknowledgedFinishes(rng.randint(200, 600), cluster.kill)
        pool_log.addHandler(acknowledged)
        # setLevel, not the attribute: a logger caches isEnabledFor's answers, and an earlier test of the run may
        # have asked it at INFO (the pool logs each finish at DEBUG only when enabled: the acks are read from it).
        level = pool_log.level
        pool_log.setLevel(logging.DEBUG)
        queue = await Queue.open(url(cluster))
        try:
            await assert_durable_settings(cluster, queue)
            pool = Pool(queue, concurrency=WRITERS, owner=f"pool-{round_}", lease=300)

            @pool.handler()
            async def handle(body: Any, context: JobContext) -> None:
                pass

            serving = asyncio.ensure_future(pool.run())

            def ended(serving: asyncio.Future[None] = serving) -> str | None:
                return "the pool ended" if serving.done() else None

            await eventually(acknowledged.killed.is_set, "the kill after the acks", timeout=60, stop=ended)
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await serving
        finally:
            pool_log.removeHandler(acknowledged)
            pool_log.setLevel(level)
            await close(queue)
        cluster.start()
        rows = await stored(cluster, "SELECT id, status FROM asyncq.jobs")
        not_done = {job_id: rows.get(job_id) for job_id in acknowledged.done if rows.get(job_id) != "done"}
        assert not not_done, f"round {round_}: {len(not_done)} finishes lost: {list(not_done.items())[:10]}"
        assert len(acknowledged.done) >= acknowledged.kill_after
        print(f"round {round_}: {len(acknowledged.done)} finishes acknowledged, all done after the restart")
