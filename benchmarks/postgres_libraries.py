"""The three queues of ``benchmarks/postgres.py``, behind the same four steps, each through its documented API:

- ``install(url)``: the library's schema in a fresh database;
- ``enqueue(url, jobs, batch)``: ``jobs`` jobs in batches of ``batch``, one call per batch; the seconds it took;
- ``drain(url, tasks, ready, drained)``: in a worker process, set up, ``await ready()`` (the conductor's go), run
  the library's worker with ``tasks`` concurrent handlers of a no-op ``async`` handler until nothing is left, then
  ``await drained(jobs its handler ran)`` before closing its connections (the conductor reads their backends' CPU);
- ``unfinished(url)``: jobs not finished (0 after a drain, or the run is refused).

asyncq: ``Queue.enqueue_many``; ``Pool(queue, concurrency=tasks).run(burst=True)`` (its defaults: a group commit
of up to 128 finishes, the claim of the next batch in the same transaction, LISTEN/NOTIFY wake-ups).
pgqueuer: ``Queries.enqueue`` with lists (its batch insert); ``PgQueuer.from_asyncpg_connection`` (the asyncpg
driver its benchmark tool defaults to, and its docs call the faster) ``.run(mode=drain)``, dequeuing ``tasks``
jobs a query, its running jobs uncapped (its default: the cap, ``max_concurrent_tasks``, made it slower).
procrastinate: ``Task.batch_defer_async``; ``App.run_worker_async(concurrency=tasks, wait=False)`` on its
``PsycopgConnector`` (a psycopg pool of ``tasks`` connections: each running job holds one to fetch and finish).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Protocol

Ready = Callable[[], Awaitable[None]]
Drained = Callable[[int], Awaitable[None]]


class Library(Protocol):
    name: str

    async def install(self, url: str) -> None: ...

    async def enqueue(self, url: str, jobs: int, batch: int) -> float: ...

    async def drain(self, url: str, tasks: int, ready: Ready, drained: Drained) -> None: ...

    async def unfinished(self, url: str) -> int: ...


def version(distribution: str) -> str:
    return importlib.metadata.version(distribution)


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


async def _fetchval(url: str, statement: str) -> Any:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(statement)
    finally:
        await conn.close()


# -- asyncq -------------------------------------------------------------------------------------------------


class Asyncq:
    name = "asyncq"

    async def install(self, url: str) -> None:
        from asyncq import Queue

        queue = await Queue.open(url)  # creates and migrates the schema
        await queue.close()

    async def enqueue(self, url: str, jobs: int, batch: int) -> float:
        from asyncq import JobSpec, Queue

        queue = await Queue.open(url)
        try:
            started = time.perf_counter()
            for first in range(0, jobs, batch):
                await queue.enqueue_many(JobSpec(f"j{n}", {"n": n}) for n in range(first, min(first + batch, jobs)))
            return time.perf_counter() - started
        finally:
            await queue.close()

    async def drain(self, url: str, tasks: int, ready: Ready, drained: Drained) -> None:
        from asyncq import Pool, Queue

        handled = 0

        async def noop(body: object, context: object) -> None:
            nonlocal handled
            handled += 1

        queue = await Queue.open(url)
        try:
            pool = Pool(queue, concurrency=tasks)
            pool.register("default", noop)
            await ready()
            await pool.run(burst=True)
            await drained(handled)
        finally:
            await queue.close()

    async def unfinished(self, url: str) -> int:
        return int(await _fetchval(url, "SELECT count(*) FROM asyncq.jobs WHERE status <> 'done'"))


# -- pgqueuer -----------------------------------------------------------------------------------------------


class Pgqueuer:
    name = "pgqueuer"
    entrypoint = "noop"

    async def install(self, url: str) -> None:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        conn = await asyncpg.connect(url)
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()

    async def enqueue(self, url: str, jobs: int, batch: int) -> float:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        conn = await asyncpg.connect(url)
        try:
            queries = Queries(AsyncpgDriver(conn))
            started = time.perf_counter()
            for first in range(0, jobs, batch):
                count = min(first + batch, jobs) - first
                payloads: list[bytes | None] = [b'{"n": %d}' % n for n in range(first, first + count)]
                await queries.enqueue([self.entrypoint] * count, payloads, [0] * count)
            return time.perf_counter() - started
        finally:
            await conn.close()

    async def drain(self, url: str, tasks: int, ready: Ready, drained: Drained) -> None:
        import asyncpg
        from pgqueuer import PgQueuer
        from pgqueuer.types import QueueExecutionMode

        handled = 0
        conn = await asyncpg.connect(url)
        try:
            pgq = PgQueuer.from_asyncpg_connection(conn)

            @pgq.entrypoint(self.entrypoint)
            async def noop(job: object) -> None:
                nonlocal handled
                handled += 1

            await ready()
            # No max_concurrent_tasks (its default): capped at 16 (in batches of 8, as the cap must be two batches)
            # it drained 30-40 % slower here.
            await pgq.run(batch_size=tasks, mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1))
            await drained(handled)
        finally:
            await conn.close()

    async def unfinished(self, url: str) -> int:
        return int(await _fetchval(url, "SELECT count(*) FROM pgqueuer"))


# -- procrastinate ------------------------------------------------------------------------------------------


def _procrastinate_app(url: str, pool_size: int) -> Any:
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=pool_size),
    )

    @app.task(name="noop")
    async def noop(n: int) -> None:
        app.handled += 1  # type: ignore[attr-defined]

    app.handled = 0  # type: ignore[attr-defined]
    app.noop = noop  # type: ignore[attr-defined]
    return app


class Procrastinate:
    name = "procrastinate"

    async def install(self, url: str) -> None:
        app = _procrastinate_app(url, 1)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def enqueue(self, url: str, jobs: int, batch: int) -> float:
        app = _procrastinate_app(url, 1)
        async with app.open_async():
            started = time.perf_counter()
            for first in range(0, jobs, batch):
                await app.noop.batch_defer_async(*({"n": n} for n in range(first, min(first + batch, jobs))))
            return time.perf_counter() - started

    async def drain(self, url: str, tasks: int, ready: Ready, drained: Drained) -> None:
        app = _procrastinate_app(url, tasks)
        async with app.open_async():
            await ready()
            await app.run_worker_async(concurrency=tasks, wait=False, install_signal_handlers=False)
            await drained(int(app.handled))

    async def unfinished(self, url: str) -> int:
        return int(await _fetchval(url, "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"))


LIBRARIES: dict[str, tuple[str, Callable[[], Library]]] = {
    # name: (the module that must be importable, the factory)
    "asyncq": ("asyncpg", Asyncq),
    "pgqueuer": ("pgqueuer", Pgqueuer),
    "procrastinate": ("procrastinate", Procrastinate),
}
DISTRIBUTIONS = {"asyncq": "asyncpg", "pgqueuer": "pgqueuer", "procrastinate": "procrastinate"}
