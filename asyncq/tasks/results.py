"""``TaskJob``: what ``defer`` returns, a handle on the job it wrote."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import TypeAdapter

from asyncq.core.jobs import Job
from asyncq.queue import Queue

R = TypeVar("R")


class TaskJob(Generic[R]):
    """A deferred task's job: its ``id``, the ``task``'s name, and whether this deferral ``added`` it (``False``:
    the same key and arguments were deferred before)."""

    def __init__(self, job_id: str, task: str, queue: Queue, returns: TypeAdapter[Any], added: bool) -> None:
        self.id = job_id
        self.task = task
        self.queue = queue
        self.added = added
        self._returns = returns

    def __repr__(self) -> str:
        return f"<TaskJob {self.id} task={self.task} added={self.added}>"

    async def get(self) -> Job | None:
        """The job's stored record now (``None`` once pruned)."""
        return await self.queue.get(self.id)
