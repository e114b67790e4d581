"""A handler that holds its job: it says when it has started and runs until the test releases it."""

from __future__ import annotations

import asyncio
from typing import Any


class Holding:
    """``pool.register(queue, holding)``: each job it runs sets ``started``, then waits for ``release``."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self, body: Any, context: Any) -> None:
        self.started.set()
        await self.release.wait()
