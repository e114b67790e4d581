"""What every facade over a store shares: the store it holds, the injected clock read as ``now``, and closing."""

from __future__ import annotations

from typing import Any, Generic, Protocol, Self, TypeVar

from asyncq.core.clock import Clock, wall_clock_ms
from asyncq.core.values import check_time


class Closable(Protocol):
    location: str

    async def close(self) -> None: ...


S = TypeVar("S", bound=Closable)


class StoreFacade(Generic[S]):
    """A facade over one store: ``async with`` closes it; ``now()`` is the injected clock, checked."""

    def __init__(self, store: S, clock: Clock = wall_clock_ms) -> None:
        if not callable(clock):
            raise TypeError("clock must be a callable returning epoch milliseconds")
        self.store = store
        self._clock = clock

    @property
    def path(self) -> str:
        """Where the store lives."""
        return self.store.location

    async def close(self) -> None:
        """Close the store (after the transaction in progress)."""
        await self.store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def now(self) -> int:
        """The clock's current time in milliseconds, checked."""
        return check_time(self._clock(), "clock()")
