"""Task graphs: ``using(after=[…])`` with task handles, and ``app.group(name, on_complete=task)`` (``TaskGroup``), whose
callback task receives the group's outcome as its ``group`` argument (``docs/dependencies.md``)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from asyncq.core.dependencies import Dependency
from asyncq.core.groups import Group, check_group_name, group_callback_id
from asyncq.core.jobs import Job, JobSpec
from asyncq.queue import Queue, Transaction
from asyncq.tasks.results import TaskJob

if TYPE_CHECKING:
    from asyncq.tasks.app import App
    from asyncq.tasks.task import Task

#: What ``after=[…]`` takes in a task's ``using``: a deferral's handle, a job id, or a ``Dependency``.
After = TaskJob[Any] | str | Dependency


def after_items(after: object) -> tuple[str | Dependency, ...]:
    """``after`` with each task handle as its job's id (the job that stands for the deferral); checked when the job
    is built (``JobSpec``): ``TypeError`` here only for a container that is not a list or tuple."""
    if type(after) not in (list, tuple):
        raise TypeError(f"after must be a list or tuple of task handles or job ids, not {type(after).__name__}")
    assert isinstance(after, list | tuple)
    return tuple(item.id if isinstance(item, TaskJob) else item for item in after)


def group_name(group: object) -> str:
    """The name a ``using(group=…)`` names: a ``TaskGroup``'s, or a group's name as a ``str``."""
    return group.name if isinstance(group, TaskGroup) else check_group_name(group)


class TaskGroup:
    """A group of task jobs (``app.group(name, on_complete=task)``): defer members with ``using(group=batch)``,
    then ``seal`` it; once every member has ended, ``on_complete`` runs once, its ``group`` argument the outcome
    (``asyncq.GroupOutcome``: members, done, dead). Its member ids: ``Queue.group_members(name)``."""

    def __init__(self, app: App, name: str, on_complete: Task[..., Any] | None = None) -> None:
        self.app = app
        self.name = check_group_name(name)
        self.on_complete = on_complete
        if on_complete is not None:
            _check_callback(app, on_complete)

    def __repr__(self) -> str:
        return f"<TaskGroup {self.name} on_complete={getattr(self.on_complete, 'name', None)}>"

    @property
    def callback_id(self) -> str:
        """The id of its callback job (the same in every process)."""
        return group_callback_id(self.name)

    def callback(self) -> JobSpec | None:
        """The callback job the seal stores (``None`` without ``on_complete``): the task's own queue, attempts, ttl
        and priority; its ``group`` argument is filled in when the group completes."""
        task = self.on_complete
        if task is None:
            return None
        options = task.options
        body: dict[str, Any] = {"task": task.name, "args": {}}
        return JobSpec(
            self.callback_id, body, options.queue, options.max_attempts, ttl=options.ttl, priority=options.priority
        )

    async def seal(self, target: Queue | Transaction) -> Group:
        """Seal the group, in ``target``'s transaction when it is one: no member joins after; the group as stored."""
        if not isinstance(target, Queue | Transaction):
            raise TypeError(f"seal needs a Queue or a queue's Transaction, not {type(target).__name__}")
        return await target.seal_group(self.name, callback=self.callback())

    async def state(self, queue: Queue) -> Group | None:
        """The group as stored now (``None`` if no member joined and it is not sealed)."""
        return await queue.group(self.name)

    async def members(self, queue: Queue, *, status: str | None = None, limit: int = 100) -> Sequence[Job]:
        """Its members (in ``status`` if named), oldest first."""
        return await queue.group_members(self.name, status=status, limit=limit)


def _check_callback(app: App, task: Task[..., Any]) -> None:
    """The callback must be one of the app's tasks and take the outcome as ``group`` (its other parameters with
    defaults): ``TypeError`` at declaration, not when the group completes."""
    if app.tasks.get(task.name) is not task:
        raise TypeError(f"on_complete must be a task of this app, not {task!r}")
    parameters = task.arguments.signature.parameters
    if "group" not in parameters:
        raise TypeError(f"task {task.name}: a group's callback takes the outcome as a parameter named group")
    required = [p.name for p in parameters.values() if p.default is inspect.Parameter.empty and p.name != "group"]
    if required:
        raise TypeError(f"task {task.name}: a group's callback may have no other parameter without a default")
