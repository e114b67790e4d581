"""``TaskJob``: what ``defer`` returns, a handle on the job it wrote; ``result()`` waits for what the task returned.

A task's return value is validated by its return annotation and stored as JSON with the job, by the same commit
as the finish that ends it ``done`` (``StoredResult``: a worker whose lease was lost never writes one). It is
kept ``result_ttl`` seconds; then ``prune`` removes it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from asyncq.core.jobs import Job, StoredResult
from asyncq.core.lifecycle import DEAD, DONE
from asyncq.errors import JobFailed, Permanent
from asyncq.queue import Queue
from asyncq.worker.results import kept_result

R = TypeVar("R")

#: How long ``result()`` waits between reads when no finish in this process wakes it (a job run elsewhere).
POLL_MAX_SECONDS = 1.0


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

    async def result(self, timeout: float | None = None) -> R:
        """Wait for the job to end and return what the task returned (validated again by its annotation).
        ``JobFailed`` (with the stored error) if it ends dead, ``TimeoutError`` after ``timeout`` seconds,
        ``LookupError`` if the job or its result is gone (pruned). Woken by the finish when it ends in this
        process; otherwise it reads the job again every second at most."""
        loop = asyncio.get_running_loop().time
        deadline = None if timeout is None else loop() + timeout
        pause = 0.01
        while True:
            job = await self.get()
            if job is None:
                raise LookupError(f"job {self.id} does not exist (pruned, or never deferred here)")
            if job.status in (DONE, DEAD):
                return self._ended(job)
            left = POLL_MAX_SECONDS if deadline is None else deadline - loop()
            if left <= 0:
                raise TimeoutError(f"job {self.id} is still {job.status} after {timeout} s")
            await self.queue.wait_for_end(min(pause, left))
            pause = min(pause * 2, POLL_MAX_SECONDS)

    def _ended(self, job: Job) -> R:
        if job.status == DEAD:
            error = job.last_error
            raise JobFailed(job.id, job.reason, *((error.type, error.message) if error else (None, None)))
        if job.result_json is None:
            raise LookupError(f"job {self.id} is done but keeps no result (pruned after its retention, or not a task)")
        value: R = self._returns.validate_python(job.result)
        return value


def stored_result(returns: TypeAdapter[Any], value: object, keep_seconds: float) -> StoredResult:
    """A task's return value as it is kept: validated by its annotation and dumped as canonical JSON; a value that
    does not fit is ``Permanent`` (the task's effect happened: running it again cannot fix its return type)."""
    try:
        dumped = returns.dump_python(returns.validate_python(value), mode="json")
    except (ValidationError, ValueError) as error:
        raise Permanent(f"the task's return value does not fit its annotation: {error}") from error
    return kept_result(dumped, round(keep_seconds * 1000), "the task's")
