"""``App``: the module-level registry of tasks, and the worker that runs them.

Tasks are declared at import (``@app.task``), before any queue is open; a name registered twice is an error
there. The worker sits above the ``Pool``: one pool handler per queue, which finds the task by the name in the
job's body, validates the stored arguments again and calls the function (``Dispatcher``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, Unpack, overload

from asyncq.core.jobs import DEFAULT_QUEUE
from asyncq.core.jsontext import JSON
from asyncq.core.limits import DEFAULT_MAX_ATTEMPTS
from asyncq.core.schedules import Missed, Overlap, ScheduleSpec
from asyncq.core.values import Duration, check_identifier, check_task_name
from asyncq.errors import InvalidArguments, Permanent
from asyncq.queue import Queue
from asyncq.tasks.asgi import Lifespan, LifespanOptions, lifespan
from asyncq.tasks.groups import TaskGroup
from asyncq.tasks.periodic import JobOptions, Periodic, When
from asyncq.tasks.results import stored_result
from asyncq.tasks.task import Task
from asyncq.tasks.tracing import Tracing
from asyncq.worker.context import JobContext, job_fields
from asyncq.worker.observer import PoolObserver
from asyncq.worker.pool import Pool
from asyncq.worker.results import DEFAULT_RESULT_TTL
from asyncq.worker.settings import PoolOptions

log = logging.getLogger("asyncq.tasks")

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class TaskContext:
    """What a running task can reach through ``current()``: the queue it runs on and its job."""

    queue: Queue
    job: JobContext
    task: str


_current: contextvars.ContextVar[TaskContext] = contextvars.ContextVar("asyncq_task")


def current() -> TaskContext:
    """The running task's context (``LookupError`` outside a task): e.g. ``current().queue`` to defer more."""
    return _current.get()


@dataclass(frozen=True)
class Ran:
    """One attempt a worker made: the job, its task, and the value returned or the exception raised."""

    job_id: str
    task: str
    attempt: int
    value: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class App:
    """A registry of tasks by name; ``run_worker`` works their queues."""

    def __init__(self, *, tracer_provider: Any = None) -> None:
        """``tracer_provider``: the OpenTelemetry provider for its spans (default the global one; extra
        ``asyncq[otel]``, see ``asyncq.tasks.tracing``)."""
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.tracing = Tracing(tracer_provider)
        #: The schedules ``periodic`` declared, by name: written to the store when a worker of the app starts.
        self.schedules: dict[str, ScheduleSpec] = {}

    @overload
    def task(self, function: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        queue: str = DEFAULT_QUEUE,
        name: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
        ttl: Duration | None = None,
        result_ttl: float = DEFAULT_RESULT_TTL,
        priority: int = 0,
        unique: bool = False,
        limit_key: str | None = None,
    ) -> Callable[[Callable[P, Awaitable[R]]], Task[P, R]]: ...

    def task(
        self,
        function: Callable[..., Awaitable[Any]] | None = None,
        *,
        queue: str = DEFAULT_QUEUE,
        name: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
        ttl: Duration | None = None,
        result_ttl: float = DEFAULT_RESULT_TTL,
        priority: int = 0,
        unique: bool = False,
        limit_key: str | None = None,
    ) -> Any:
        """Declare an async function as a task (``@app.task`` or ``@app.task(queue=…, …)``): its jobs go to
        ``queue``, get ``max_attempts`` attempts within ``ttl`` seconds (default a day), each cut after ``timeout``
        seconds; its result is kept ``result_ttl`` seconds; ``priority`` (-100 … 100, higher claimed first) is its
        jobs' default (``using(priority=…)`` overrides it for one deferral); ``unique``: one active job per task and
        arguments (its unique key derived from both; ``using(unique_key=…)`` names another); ``limit_key``: its jobs'
        default limit key (a queue's per-key concurrency limit bounds the jobs of one key together;
        ``using(limit_key=…)`` names a deferral's own, a tenant's). ``name`` (default the function's ``__name__``) is
        how jobs find it: registering a name twice is a ``ValueError``."""

        def declare(fn: Callable[..., Awaitable[Any]]) -> Task[Any, Any]:
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(f"a task must be an async function, not {fn!r}")
            task_name = check_task_name(fn.__name__ if name is None else name, "a task's name")
            if task_name in self.tasks:
                raise ValueError(f"a task named {task_name!r} is registered already ({self.tasks[task_name]!r})")
            declared: Task[Any, Any] = Task(
                self, fn, name=task_name, queue=queue, max_attempts=max_attempts, timeout=timeout, ttl=ttl,
                result_ttl=result_ttl, priority=priority, unique=unique, limit_key=limit_key,
            )  # fmt: skip
            self.tasks[task_name] = declared
            return declared

        return declare if function is None else declare(function)

    def periodic(
        self, *, cron: str | None = None, every: Duration | None = None, tz: str = "UTC", overlap: Overlap = "skip",
        missed: Missed = "latest", name: str | None = None, kwargs: dict[str, Any] | None = None,
        queue: str | None = None, priority: int | None = None, max_attempts: int | None = None,
        ttl: Duration | None = None, timeout: float | None = None, result_ttl: float = DEFAULT_RESULT_TTL,
    ) -> Periodic:  # fmt: skip
        """Run a task on a schedule stored in the queue (``docs/schedules.md``): ``cron`` (five fields, read in the
        IANA zone ``tz``) or ``every`` seconds; ``overlap`` (``skip``, ``queue_one``, ``allow``) while the previous
        run is pending or running; ``missed`` (``latest``, ``skip``, ``all``) after downtime. On a function it
        registers the task (``queue``, ``priority``, ``max_attempts``, ``ttl``, ``timeout``, ``result_ttl`` as
        ``task`` takes them); on a ``@app.task`` it schedules that task. Each tick enqueues the task with ``kwargs``
        (checked now); ``name`` (default the task's) names the schedule. Written to the store when a worker
        starts; any worker process then runs its ticks, one job per tick."""
        when = When(cron, every, tz, overlap, missed)
        return Periodic(self, when, name, kwargs, JobOptions(queue, priority, max_attempts, ttl, timeout, result_ttl))

    def group(self, name: str, *, on_complete: Task[..., Any] | None = None) -> TaskGroup:
        """A group of task jobs (``docs/dependencies.md``): defer members with ``task.using(group=batch)``, then
        ``await batch.seal(queue_or_tx)``; once every member has ended, ``on_complete`` (a task of this app taking
        the outcome as ``group: asyncq.GroupOutcome``) runs once. The same name in every process is the same
        group."""
        return TaskGroup(self, name, on_complete)

    @property
    def queues(self) -> list[str]:
        """The queues its tasks use, in declaration order."""
        return list(dict.fromkeys(task.queue for task in self.tasks.values()))

    def pool(
        self,
        queue: Queue,
        *,
        queues: Iterable[str] | None = None,
        record: list[Ran] | None = None,
        observer: PoolObserver | None = None,
        **options: Unpack[PoolOptions],
    ) -> Pool:
        """A ``Pool`` on ``queue`` working ``queues`` (default: every queue the tasks use) with this app's tasks;
        ``record`` collects a ``Ran`` per attempt; ``options`` are the pool's (``concurrency``, ``lease``, ``retry``,
        ``owner`` …: ``asyncq.worker.settings.PoolSettings``)."""
        return self.attach(Pool(queue, observer=observer, **options), queues=queues, record=record)

    def attach(self, pool: Pool, *, queues: Iterable[str] | None = None, record: list[Ran] | None = None) -> Pool:
        """Register this app's tasks on ``pool`` for ``queues`` (default: every queue the tasks use); the pool."""
        names = [check_identifier(name, "queue") for name in (self.queues if queues is None else queues)]
        dispatcher = Dispatcher(self, pool.queue, record)
        for name in names:
            pool.register(name, dispatcher)
        # The pool declares the app's schedules of these queues when it starts, and retires theirs no longer declared.
        pool.schedules.declare([spec for spec in self.schedules.values() if spec.queue in names], names)
        return pool

    def lifespan(
        self, location: str | os.PathLike[str], *, worker: bool = True, queues: Iterable[str] | None = None,
        grace: float = 30.0, **options: Unpack[LifespanOptions],
    ) -> Lifespan:  # fmt: skip
        """An ASGI lifespan (FastAPI, Starlette) that opens the queue and runs a worker: see
        ``asyncq.tasks.asgi.lifespan``."""
        return lifespan(self, location, worker=worker, queues=queues, grace=grace, **options)

    async def run_worker(
        self, queue: Queue, *, queues: Iterable[str] | None = None, burst: bool = False,
        observer: PoolObserver | None = None, **options: Unpack[PoolOptions],
    ) -> None:  # fmt: skip
        """Work the tasks' queues until cancelled (or, with ``burst``, until nothing is ready and nothing runs);
        ``options`` are the pool's, as for ``pool``."""
        await self.pool(queue, queues=queues, observer=observer, **options).run(burst=burst)


class Dispatcher:
    """The pool handler of every queue of an app: the task named in the body, called with its stored arguments
    validated again. A body that names no task of this app, or arguments that no longer fit the function (a job
    written by another version of it), is refused as ``permanent`` with the reason stored: no retry can help."""

    def __init__(self, app: App, queue: Queue, ran: list[Ran] | None = None) -> None:
        self.app = app
        self.queue = queue
        self.ran = ran

    async def __call__(self, job_body: JSON, context: JobContext) -> Any:
        task, body = self._task(job_body, context)
        token = _current.set(TaskContext(self.queue, context, task.name))
        try:
            with self.app.tracing.attempt(task.name, body, context.id, context.queue, context.attempt):
                value = await self._call(task, body)
                stored = stored_result(task.arguments.returns, value, task.result_ttl)
        except Exception as error:
            self._record(context, task.name, error)
            raise
        finally:
            _current.reset(token)
        if self.ran is not None:
            self.ran.append(Ran(context.id, task.name, context.attempt, value))
        log.debug("task %s ran job %s", task.name, context.id, extra=fields(context, task.name, "ok"))
        return stored  # the pool keeps it with the job, in the commit of the finish

    async def _call(self, task: Task[Any, Any], body: dict[str, Any]) -> Any:
        try:
            args, kwargs = task.arguments.load(body.get("args"))
        except InvalidArguments as error:
            raise Permanent(f"job does not fit task {error}") from error
        if task.timeout is None:
            return await task.function(*args, **kwargs)
        async with asyncio.timeout(task.timeout):
            return await task.function(*args, **kwargs)

    def _task(self, body: JSON, context: JobContext) -> tuple[Task[Any, Any], dict[str, JSON]]:
        """The task a job's body names, and the body as the task's job (an object)."""
        name = body.get("task") if isinstance(body, dict) else None
        task = self.app.tasks.get(name) if isinstance(name, str) else None
        if task is None or not isinstance(body, dict):
            error = Permanent(f"no task named {name!r} in this app (the body is not a task's job, or the task is gone)")
            self._record(context, str(name), error)
            raise error
        return task, body

    def _record(self, context: JobContext, task: str, error: Exception) -> None:
        if self.ran is not None:
            self.ran.append(Ran(context.id, task, context.attempt, error=error))
        outcome = "permanent" if isinstance(error, Permanent) else "error"
        log.info("task %s failed job %s: %r", task, context.id, error, extra=fields(context, task, outcome))


def fields(context: JobContext, task: str, outcome: str | None) -> dict[str, Any]:
    """The structured fields of a task's log records (``extra=``): a JSON formatter shows them."""
    return job_fields(context.id, context.queue, context.attempt, outcome) | {"task": task}


class TaskLogFilter(logging.Filter):
    """Add ``job_id``, ``task``, ``queue``, ``attempt`` (and ``outcome``: ``None`` while running) to every record
    logged while a task runs, the task's own included: ``handler.addFilter(TaskLogFilter())``. Records outside a
    task get ``None`` for each, so a format string may name them."""

    def filter(self, record: logging.LogRecord) -> bool:
        running = _current.get(None)
        found = fields(running.job, running.task, None) if running is not None else dict.fromkeys(FIELDS)
        for name, value in found.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


FIELDS = ("job_id", "task", "queue", "attempt", "outcome")
