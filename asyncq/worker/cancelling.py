"""Cancelling a running job on request (``Queue.cancel``), and what a handler protects from it: ``asyncq.shield``.

The pool's lease keeper finds a request in a renewal (``Queue.renew_many``), waits the pool's ``cancel_grace``,
then asks this module to cancel the worker task running the job. A task inside ``shield`` is not cancelled then:
the cancellation is delivered when its outermost shield ends. A shield protects only from a cancel request: a
lost lease or the pool's own shutdown cancels a handler shielded or not (its lease is gone, or the process is
going). Nothing here costs a job that nobody cancels: no per-job state, only a dict of the tasks inside a shield.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from types import TracebackType
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")

_shielded: dict[asyncio.Task[Any], int] = {}  # a task inside shields: how deep
_deferred: dict[asyncio.Task[Any], Callable[[], None]] = {}  # the cancellation each waits to be delivered


class Shield(Generic[T]):
    """A critical section of a handler that a cancel request does not interrupt (see ``shield``)."""

    __slots__ = ("_awaitable", "_task")

    def __init__(self, awaitable: Awaitable[T] | None) -> None:
        self._awaitable = awaitable
        self._task: asyncio.Task[Any] | None = None

    def __enter__(self) -> Shield[T]:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("asyncq.shield is used inside a running task (a handler)")
        self._task = task
        _shielded[task] = _shielded.get(task, 0) + 1
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        task, self._task = self._task, None
        assert task is not None, "a shield is left once, after it was entered"
        depth = _shielded.pop(task) - 1
        if depth:
            _shielded[task] = depth
            return
        deliver = _deferred.pop(task, None)
        if deliver is not None:
            deliver()  # the request came while shielded: the handler is cancelled at its next await

    async def __aenter__(self) -> Shield[T]:
        return self.__enter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(kind, error, tb)

    def __await__(self) -> Generator[Any, None, T]:
        return self._run().__await__()

    async def _run(self) -> T:
        if self._awaitable is None:
            raise TypeError("await asyncq.shield(awaitable), or use `with asyncq.shield():`")
        with self:
            return await self._awaitable


@overload
def shield() -> Shield[None]: ...
@overload
def shield(awaitable: Awaitable[T]) -> Shield[T]: ...
def shield(awaitable: Awaitable[Any] | None = None) -> Shield[Any]:
    """Protect a handler's critical section from a cancel request (``Queue.cancel``): ``with asyncq.shield():``
    (or ``async with``) around a block, or ``await asyncq.shield(awaitable)``. A request that comes meanwhile
    cancels the handler once the section ends; outside a pool's handler it changes nothing."""
    return Shield(awaitable)


def cancel_unless_shielded(task: asyncio.Task[Any], deliver: Callable[[], None]) -> None:
    """Run ``deliver`` (it cancels ``task``) now, or when ``task`` leaves its shield if it is inside one."""
    if _shielded.get(task):
        _deferred[task] = deliver
    else:
        deliver()
