"""``@app.periodic``: a task run on a schedule stored in the queue (``docs/schedules.md``).

The decorator registers the task (or takes one ``@app.task`` made) and declares its schedule on the app: checked at
import (a bad cron expression, zone or argument fails there), written to the store when a worker of the app starts
(``App.attach``: the schedules of the queues it works upserted, those no longer declared retired).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from asyncq.core.jobs import DEFAULT_QUEUE
from asyncq.core.limits import DEFAULT_MAX_ATTEMPTS
from asyncq.core.schedules import Missed, Overlap, ScheduleSpec
from asyncq.core.values import Duration, check_identifier
from asyncq.tasks.task import Task
from asyncq.worker.results import DEFAULT_RESULT_TTL

if TYPE_CHECKING:
    from asyncq.tasks.app import App

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class When:
    """When a periodic task runs and what its runs do on overlap and after downtime (``ScheduleSpec``'s fields)."""

    cron: str | None
    every: Duration | None
    tz: str
    overlap: Overlap
    missed: Missed


@dataclass(frozen=True)
class JobOptions:
    """The job of each tick: ``None`` takes the task's own."""

    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    ttl: Duration | None = None
    timeout: float | None = None
    result_ttl: float = DEFAULT_RESULT_TTL


class Periodic:
    """The decorator ``App.periodic`` returns (typed: the task keeps its function's signature)."""

    def __init__(self, app: App, when: When, name: str | None, kwargs: dict[str, Any] | None, job: JobOptions) -> None:
        self.app = app
        self.when = when
        self.name = name
        self.kwargs = {} if kwargs is None else kwargs
        self.job = job
        if name is not None:
            check_identifier(name, "name")
        self._spec("checked", {}).to_row()  # the schedule's own fields, before anything is registered

    @overload
    def __call__(self, target: Task[P, R]) -> Task[P, R]: ...

    @overload
    def __call__(self, target: Callable[P, Awaitable[R]]) -> Task[P, R]: ...

    def __call__(self, target: Any) -> Any:
        found = self.name or (target.name if isinstance(target, Task) else getattr(target, "__name__", ""))
        name = check_identifier(found, "the schedule's name (give name=… for a task whose name is not one)")
        if name in self.app.schedules:
            raise ValueError(f"a schedule named {name!r} is declared already")
        task = target if isinstance(target, Task) else self._register(target)
        if task.app is not self.app:
            raise ValueError(f"{task!r} belongs to another app")
        spec = self._spec(name, task.body((), self.kwargs), task)
        spec.to_row()
        self.app.schedules[name] = spec
        return task

    def _register(self, function: Callable[..., Awaitable[Any]]) -> Task[Any, Any]:
        job = self.job
        return self.app.task(
            queue=job.queue or DEFAULT_QUEUE, max_attempts=job.max_attempts or DEFAULT_MAX_ATTEMPTS,
            timeout=job.timeout, ttl=job.ttl, result_ttl=job.result_ttl, priority=job.priority or 0,
        )(function)  # fmt: skip

    def _spec(self, name: str, body: dict[str, Any], task: Task[Any, Any] | None = None) -> ScheduleSpec:
        job, when = self.job, self.when
        options = task.options if task is not None else None
        return ScheduleSpec(
            name, body, cron=when.cron, every=when.every, tz=when.tz, overlap=when.overlap, missed=when.missed,
            queue=job.queue or (options.queue if options else DEFAULT_QUEUE),
            priority=job.priority if job.priority is not None else (options.priority if options else 0),
            max_attempts=job.max_attempts or (options.max_attempts if options else DEFAULT_MAX_ATTEMPTS),
            ttl=job.ttl if job.ttl is not None else (options.ttl if options else None),
            task=None if task is None else task.name,
        )  # fmt: skip
