"""Helpers for testing an app's tasks on a real temporary store, never a fake.

    async with temporary_queue() as queue:          # a fresh SQLite file in a temporary directory
        await send_email.defer(queue, to="a@b.example", subject="hi")
        await assert_enqueued(queue, send_email, to="a@b.example")
        ran = await drain(app, queue)               # every ready job, and the ones they defer
        queue_clock(queue).advance(60)              # a delayed or retried job is ready now, without sleeping

``temporary_queue`` gives its queue a ``MovableClock``: the queue reads every ``now`` from it (the store is
handed ``now`` on each call), so moving it makes delayed jobs and retry backoffs ready at once.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from asyncq.core.clock import wall_clock_ms
from asyncq.core.jobs import Job
from asyncq.core.values import check_time
from asyncq.queue import Queue
from asyncq.tasks.app import App, Ran
from asyncq.tasks.task import Task

__all__ = [
    "MovableClock",
    "Ran",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "enqueued",
    "queue_clock",
    "temporary_queue",
]


class MovableClock:
    """A clock (epoch milliseconds) that stands still until moved; starts at the wall clock's time."""

    def __init__(self, start_ms: int | None = None) -> None:
        self.now_ms = wall_clock_ms() if start_ms is None else check_time(start_ms, "start_ms")

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, seconds: float) -> int:
        """Move forward by ``seconds`` (never back: a queue's leases and deadlines assume time only grows)."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < 10**9:
            raise ValueError(f"seconds must be a number from 0, got {seconds!r}")
        self.now_ms += round(seconds * 1000)
        return self.now_ms


@asynccontextmanager
async def temporary_queue(
    location: str | None = None, *, clock: MovableClock | None = None, **options: Any
) -> AsyncIterator[Queue]:
    """A queue on a new SQLite file in a temporary directory (removed on exit), or at ``location`` (a store URL
    such as a fresh ``postgresql://`` schema, which the caller drops), its clock a ``MovableClock``
    (``queue_clock(queue)``); ``options`` are ``Queue.open``'s. Fixture-friendly: ``yield`` from it."""
    with tempfile.TemporaryDirectory(prefix="asyncq-test-") as directory:
        where = Path(directory) / "queue.db" if location is None else location
        queue = await Queue.open(where, clock=clock or MovableClock(), **options)
        async with queue:
            yield queue


def queue_clock(queue: Queue) -> MovableClock:
    """The ``MovableClock`` of a queue from ``temporary_queue`` (``TypeError`` for another queue)."""
    clock = queue._clock
    if not isinstance(clock, MovableClock):
        raise TypeError("this queue's clock is not a MovableClock (open it with temporary_queue)")
    return clock


async def drain(app: App, queue: Queue, *, queues: list[str] | None = None, concurrency: int = 1) -> list[Ran]:
    """Run every ready job of the app's queues (and the jobs those defer, when ready) until none is left ready,
    with a real worker pool; what ran, in order: one ``Ran`` per attempt (the value returned, or the error)."""
    ran: list[Ran] = []
    await app.pool(queue, queues=queues, concurrency=concurrency, record=ran).run(burst=True)
    return ran


async def enqueued(queue: Queue, task: Task[Any, Any], **args: Any) -> list[Job]:
    """The pending jobs of ``task`` whose stored arguments include ``args`` (compared in their stored form, so
    ``uuid.UUID(x)`` matches the UUID deferred)."""
    wanted = task.arguments.dump_values(args)
    found: list[Job] = []
    after = 0
    while True:
        page = await queue.list_jobs(status="pending", queue=task.queue, after=after, limit=1000)
        for job in page:
            body = job.body
            if isinstance(body, dict) and body.get("task") == task.name:
                stored = body.get("args") or {}
                matches = isinstance(stored, dict) and all(
                    name in stored and stored[name] == value for name, value in wanted.items()
                )
                if matches:
                    found.append(job)
        if len(page) < 1000:
            return found
        after = page[-1].seq


async def assert_enqueued(queue: Queue, task: Task[Any, Any], **args: Any) -> Job:
    """The one pending job of ``task`` with these arguments; ``AssertionError`` if there is none, or several."""
    found = await enqueued(queue, task, **args)
    if len(found) != 1:
        raise AssertionError(f"expected one pending job of {task.name} with {args!r}, found {len(found)}")
    return found[0]


async def assert_not_enqueued(queue: Queue, task: Task[Any, Any], **args: Any) -> None:
    """``AssertionError`` if a pending job of ``task`` has these arguments."""
    found = await enqueued(queue, task, **args)
    if found:
        raise AssertionError(f"expected no pending job of {task.name} with {args!r}, found {[j.id for j in found]}")
