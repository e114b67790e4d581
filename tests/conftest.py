"""Fixtures shared by the tests of the async facade: a queue file in ``tmp_path`` and a clock the test moves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from asyncq import Queue

#: The queue clock's starting time in the tests (ms since the epoch, November 2023).
T0 = 1_700_000_000_000


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "queue.db"


@pytest.fixture
def clock() -> list[int]:
    """``clock[0]`` is the queue's time: tests move it instead of sleeping."""
    return [T0]


@pytest.fixture
async def queue(path: Path, clock: list[int]) -> AsyncIterator[Queue]:
    async with await Queue.open(str(path), clock=lambda: clock[0]) as opened:
        yield opened
