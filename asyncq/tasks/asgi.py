"""An ASGI lifespan for FastAPI or Starlette apps: the queue opened on startup, an optional worker in the same
process, a graceful stop on shutdown (``App.lifespan``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Unpack

from asyncq.core.clock import Clock
from asyncq.core.values import check_duration
from asyncq.tasks.opening import open as open_queue
from asyncq.worker.pool import Pool
from asyncq.worker.settings import PoolOptions, PoolSettings, settings_fields

if TYPE_CHECKING:
    from asyncq.tasks.app import App

log = logging.getLogger("asyncq.tasks.asgi")

Lifespan = Callable[[Any], AbstractAsyncContextManager[dict[str, Any]]]


class LifespanOptions(PoolOptions, total=False):
    """``lifespan``'s options: the pool's (``PoolOptions``) and ``Queue.open``'s."""

    durability: str | None
    clock: Clock
    busy_timeout: float
    max_body_bytes: int
    read_only: bool


def lifespan(
    app: App,
    location: str | os.PathLike[str],
    *,
    worker: bool = True,
    queues: Iterable[str] | None = None,
    grace: float = 30.0,
    **options: Unpack[LifespanOptions],
) -> Lifespan:
    """``FastAPI(lifespan=app.lifespan("app.db"))``: on startup open the queue at ``location`` (with ``Queue.open``'s
    options) and, with ``worker``, run the app's tasks in this process (with the pool's options: ``concurrency``,
    ``lease`` …); on shutdown stop claiming, give jobs in flight ``grace`` seconds (then cancel them: their leases
    expire and they run again), close the queue. The queue is the lifespan state's ``queue``
    (``request.state.queue``) and ``asgi_app.state.queue``."""
    check_duration(grace, "grace", 0.0, 86_400.0)
    open_options: dict[str, Any] = dict(options)
    settings = PoolSettings(**{key: open_options.pop(key) for key in settings_fields() if key in open_options})

    @asynccontextmanager
    async def run(asgi_app: Any) -> AsyncIterator[dict[str, Any]]:
        async with open_queue(location, **open_options) as queue:
            state = getattr(asgi_app, "state", None)
            if state is not None:
                state.queue = queue
            if not worker:
                yield {"queue": queue}
                return
            pool = app.attach(Pool(queue, settings), queues=queues)
            working = asyncio.create_task(pool.run(), name="asyncq-worker")
            try:
                yield {"queue": queue}
            finally:
                pool.stop()
                done, _pending = await asyncio.wait([working], timeout=grace)
                if not done:
                    log.warning("worker still had %d job(s) running after %.1f s: cancelled", pool.running, grace)
                    working.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await working  # a worker that failed raises here, on shutdown, not silently

    return run
