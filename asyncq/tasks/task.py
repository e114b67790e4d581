"""``Task``: an async function declared with ``@app.task``, deferred as a job whose body names it.

``defer``'s arguments are the function's own (``ParamSpec``), so ``mypy --strict`` checks a deferral like a call;
pydantic checks them again at run time (``asyncq.tasks.arguments``) before anything is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from asyncq.core.limits import MAX_ATTEMPTS
from asyncq.core.values import Duration, check_duration, check_identifier, check_int, check_priority
from asyncq.queue import Queue, Transaction
from asyncq.tasks.arguments import Arguments
from asyncq.tasks.results import TaskJob
from asyncq.worker.results import MAX_RESULT_TTL

if TYPE_CHECKING:
    import sqlite3

    from asyncq.tasks.app import App

P = ParamSpec("P")
R = TypeVar("R")

#: Where a job can be deferred: a queue (its own transaction) or an open transaction of the app's.
Target = Queue | Transaction


@dataclass(frozen=True)
class Options:
    """How a deferral is enqueued: ``key`` (the job's id: the same key and arguments again is a no-op, other
    arguments ``Conflict``; default a fresh unique id), ``delay`` and ``ttl`` in seconds."""

    queue: str
    max_attempts: int
    ttl: Duration | None = None
    delay: Duration | None = None
    key: str | None = None
    priority: int = 0

    def job_id(self) -> str:
        return uuid.uuid4().hex if self.key is None else self.key

    def enqueue_options(self) -> dict[str, Any]:
        options = {"queue": self.queue, "max_attempts": self.max_attempts, "ttl": self.ttl, "delay": self.delay}
        return options | {"priority": self.priority}


class Task(Generic[P, R]):
    """A task of an ``App``: call it to run the function here, ``defer`` it to run it in a worker."""

    def __init__(
        self,
        app: App,
        function: Callable[P, Awaitable[R]],
        *,
        name: str,
        queue: str,
        max_attempts: int,
        timeout: float | None,
        ttl: Duration | None,
        result_ttl: float,
        priority: int = 0,
    ) -> None:
        self.app = app
        self.function = function
        self.name = name
        self.options = Options(
            check_identifier(queue, "queue"),
            check_int(max_attempts, "max_attempts", 1, MAX_ATTEMPTS),
            ttl,
            priority=check_priority(priority),
        )
        self.timeout = None if timeout is None else check_duration(timeout, "timeout", 0.001, 86_400.0 * 7)
        self.result_ttl = check_duration(result_ttl, "result_ttl", 0.0, MAX_RESULT_TTL)
        self.arguments = Arguments(name, function)
        self.__doc__ = function.__doc__
        self.__wrapped__ = function

    @property
    def queue(self) -> str:
        """The queue its jobs go to (unless ``using(queue=…)`` says otherwise)."""
        return self.options.queue

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
        """Run the function here and now, as if the task were a plain function."""
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    def using(
        self,
        *,
        key: str | None = None,
        delay: Duration | None = None,
        ttl: Duration | None = None,
        max_attempts: int | None = None,
        queue: str | None = None,
        priority: int | None = None,
    ) -> Deferral[P, R]:
        """The same task with options for one deferral: ``key`` (the job id, for idempotency), ``delay``,
        ``ttl``, ``max_attempts``, ``queue``, ``priority``."""
        if key is not None:
            check_identifier(key, "key")
        if queue is not None:
            check_identifier(queue, "queue")
        if max_attempts is not None:
            check_int(max_attempts, "max_attempts", 1, MAX_ATTEMPTS)
        if priority is not None:
            check_priority(priority)
        base = self.options
        options = Options(
            base.queue if queue is None else queue,
            base.max_attempts if max_attempts is None else max_attempts,
            base.ttl if ttl is None else ttl,
            delay,
            key,
            base.priority if priority is None else priority,
        )
        return Deferral(self, options)

    async def defer(self, target: Target, /, *args: P.args, **kwargs: P.kwargs) -> TaskJob[R]:
        """Enqueue a job that calls the task with these arguments (checked first: ``InvalidArguments`` names
        each bad field and nothing is written); in ``target``'s transaction when it is one."""
        return await Deferral(self, self.options).defer(target, *args, **kwargs)

    def defer_sync(self, con: sqlite3.Connection, /, *args: P.args, **kwargs: P.kwargs) -> str:
        """``defer`` from synchronous code on a SQLite file, in ``con``'s open transaction (or its own, as
        ``enqueue_sync``); the job's id."""
        return Deferral(self, self.options).defer_sync(con, *args, **kwargs)

    def job(self, queue: Queue, job_id: str) -> TaskJob[R]:
        """A handle on a job of this task deferred earlier (by id), e.g. to await its ``result()`` elsewhere."""
        return TaskJob(check_identifier(job_id, "job_id"), self.name, queue, self.arguments.returns, False)

    def body(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The job body of a call: ``{"task": name, "args": {…}}`` (``InvalidArguments`` if it does not fit)."""
        return {"task": self.name, "args": self.arguments.dump(args, kwargs)}


class Deferral(Generic[P, R]):
    """A task with options set for one deferral (``Task.using``)."""

    def __init__(self, task: Task[P, R], options: Options) -> None:
        self.task = task
        self.options = options

    async def defer(self, target: Target, /, *args: P.args, **kwargs: P.kwargs) -> TaskJob[R]:
        """See ``Task.defer``."""
        if not isinstance(target, Queue | Transaction):
            raise TypeError(f"defer needs a Queue or a queue's Transaction, not {type(target).__name__}")
        body = self.task.body(args, kwargs)
        job_id = self.options.job_id()
        with self._traced(body, job_id):
            added = await target.enqueue(job_id, body, **self.options.enqueue_options())
        queue = target if isinstance(target, Queue) else target.queue
        return TaskJob(job_id, self.task.name, queue, self.task.arguments.returns, added)

    def defer_sync(self, con: sqlite3.Connection, /, *args: P.args, **kwargs: P.kwargs) -> str:
        """See ``Task.defer_sync``."""
        from asyncq.sqlite import enqueue_sync  # the SQLite driver, loaded only for synchronous callers

        body = self.task.body(args, kwargs)
        job_id = self.options.job_id()
        with self._traced(body, job_id):
            enqueue_sync(con, job_id, body, **self.options.enqueue_options())
        return job_id

    @contextmanager
    def _traced(self, body: dict[str, Any], job_id: str) -> Iterator[None]:
        """The deferral's span (``asyncq.tasks.tracing``); a keyed job's body carries no trace context."""
        with self.task.app.tracing.deferring(
            self.task.name, self.options.queue, body, self.options.key is None
        ) as span:
            if span is not None:
                span.set_attribute("messaging.message.id", job_id)
            yield
