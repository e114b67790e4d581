"""``asyncq.open``: a queue as an async context manager, in one ``async with`` (no ``async with await``)."""

from __future__ import annotations

import os
from types import TracebackType
from typing import Unpack

from asyncq.queue import Queue, QueueOptions


# Lower case: it reads as the function it stands for, ``async with asyncq.open("app.db") as queue``.
class open:
    """``async with asyncq.open(path, **options) as queue``: ``Queue.open(path, **options)``, closed on exit."""

    def __init__(self, path: str | os.PathLike[str], **options: Unpack[QueueOptions]) -> None:
        self.path = path
        self.options = options
        self._queue: Queue | None = None

    async def __aenter__(self) -> Queue:
        self._queue = await Queue.open(self.path, **self.options)
        return self._queue

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._queue is not None:
            queue, self._queue = self._queue, None
            await queue.close()
