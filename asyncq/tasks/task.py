"""``Task``: an async function declared with ``@app.task``, deferred as a job whose body names it.

``defer``'s arguments are the function's own (``ParamSpec``), so ``mypy --strict`` checks a deferral like a call;
pydantic checks them again at run time (``asyncq.tasks.arguments``) before anything is written.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from asyncq.core.dependencies import Dependency
from asyncq.core.jobs import Enqueued, OnConflict, OnDependencyDeadName
from asyncq.core.jsontext import canonical_json
from asyncq.core.limits import MAX_ATTEMPTS
from asyncq.core.values import (
    Duration,
    check_duration,
    check_flag,
    check_identifier,
    check_int,
    check_limit_key,
    check_on_conflict,
    check_priority,
    check_unique_key,
)
from asyncq.queue import Queue, Transaction
from asyncq.tasks.arguments import Arguments
from asyncq.tasks.groups import After, TaskGroup, after_items, group_name
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
    arguments ``Conflict``; default a fresh unique id), ``delay`` and ``ttl`` in seconds; ``unique_key`` (one
    active job of the queue with it at a time), or ``unique`` (the key derived from the task and its arguments);
    ``limit_key`` (the jobs a queue's per-key concurrency limit bounds together)."""

    queue: str
    max_attempts: int
    ttl: Duration | None = None
    delay: Duration | None = None
    key: str | None = None
    priority: int = 0
    unique: bool = False
    unique_key: str | None = None
    on_conflict: OnConflict = "return"
    limit_key: str | None = None
    #: Dependencies and group of one deferral (``docs/dependencies.md``): job ids or ``Dependency`` values.
    after: tuple[str | Dependency, ...] = ()
    on_dependency_dead: OnDependencyDeadName = "dead"
    group: str | None = None

    def job_id(self) -> str:
        return uuid.uuid4().hex if self.key is None else self.key

    def enqueue_options(self, body: dict[str, Any]) -> dict[str, Any]:
        options = {"queue": self.queue, "max_attempts": self.max_attempts, "ttl": self.ttl, "delay": self.delay}
        unique_key = self.unique_key if self.unique_key is not None or not self.unique else derived_unique_key(body)
        options |= {"priority": self.priority, "unique_key": unique_key, "on_conflict": self.on_conflict}
        options["limit_key"] = self.limit_key
        if self.after or self.group is not None or self.on_dependency_dead != "dead":
            options |= {"after": self.after, "on_dependency_dead": self.on_dependency_dead, "group": self.group}
        return options


def derived_unique_key(body: dict[str, Any]) -> str:
    """The unique key of ``unique=True``: the task's name and a hash of its canonical arguments
    (``send:5f1c…``), so that the same call while one is active is one job. A name too long for a key (or not
    printable) leaves only the hash."""
    digest = hashlib.sha256(canonical_json({"task": body["task"], "args": body["args"]}).encode()).hexdigest()[:32]
    name = body["task"]
    return f"{name}:{digest}" if len(name) <= 150 and name.isprintable() and name.strip() == name else digest


def _standing(job_id: str, enqueued: Enqueued) -> str:
    """The id of the job that stands for a deferral: its own, or the active one holding its unique key."""
    return enqueued if isinstance(enqueued, str) else job_id


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
        unique: bool = False,
        limit_key: str | None = None,
    ) -> None:
        self.app = app
        self.function = function
        self.name = name
        self.options = Options(
            check_identifier(queue, "queue"),
            check_int(max_attempts, "max_attempts", 1, MAX_ATTEMPTS),
            ttl,
            priority=check_priority(priority),
            unique=check_flag(unique, "unique"),
            limit_key=check_limit_key(limit_key),
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
        unique_key: str | None = None,
        on_conflict: OnConflict = "return",
        limit_key: str | None = None,
        after: Sequence[After] = (),
        on_dependency_dead: OnDependencyDeadName = "dead",
        group: TaskGroup | str | None = None,
    ) -> Deferral[P, R]:
        """The same task with options for one deferral: ``key`` (the job id, for idempotency), ``delay``,
        ``ttl``, ``max_attempts``, ``queue``, ``priority``, ``unique_key`` (instead of the task's derived one, if it
        is ``unique``), ``on_conflict`` (``raise``: ``UniqueConflict`` instead of the active job's handle) and
        ``limit_key`` (instead of the task's default: a tenant whose jobs a per-key limit bounds together).
        ``after``: the deferrals' handles (or job ids, or ``Dependency`` values) it waits for, each ended done
        first (``on_dependency_dead``: ``dead``, ``run`` or ``wait`` for one that ends dead); ``group``: the
        ``app.group`` it is a member of (``docs/dependencies.md``)."""
        check_unique_key(unique_key)
        check_limit_key(limit_key)
        check_on_conflict(on_conflict)
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
            base.unique,
            unique_key,
            on_conflict,
            base.limit_key if limit_key is None else limit_key,
            after_items(after),
            on_dependency_dead,
            None if group is None else group_name(group),
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
        options = self.options.enqueue_options(body)
        with self._traced(body, job_id):
            added = await target.enqueue(job_id, body, **options)
        queue = target if isinstance(target, Queue) else target.queue
        return TaskJob(_standing(job_id, added), self.task.name, queue, self.task.arguments.returns, added is True)

    def defer_sync(self, con: sqlite3.Connection, /, *args: P.args, **kwargs: P.kwargs) -> str:
        """See ``Task.defer_sync``."""
        from asyncq.sqlite import enqueue_sync  # the SQLite driver, loaded only for synchronous callers

        body = self.task.body(args, kwargs)
        job_id = self.options.job_id()
        options = self.options.enqueue_options(body)
        with self._traced(body, job_id):
            added = enqueue_sync(con, job_id, body, **options)
        return _standing(job_id, added)

    @contextmanager
    def _traced(self, body: dict[str, Any], job_id: str) -> Iterator[None]:
        """The deferral's span (``asyncq.tasks.tracing``); a keyed job's body carries no trace context."""
        with self.task.app.tracing.deferring(
            self.task.name, self.options.queue, body, self.options.key is None
        ) as span:
            if span is not None:
                span.set_attribute("messaging.message.id", job_id)
            yield
