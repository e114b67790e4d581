"""The tests' one way to wait for a state that no event announces: poll a condition under a deadline.

``await eventually(condition, "what")`` (a coroutine's loop) and ``eventually_sync(condition, "what")`` (a
thread's) call ``condition`` (plain or async) every ``interval`` seconds until it returns something truthy, and
return that. At the deadline they fail with an ``AssertionError`` naming what was awaited, the last value seen and
``details`` (say, a child's stderr). ``stop`` is asked at each step for a reason to fail at once (a worker that
died: waiting longer cannot help). Never a sleep "to wait a bit": the wait ends as soon as the condition holds.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

#: A description, or a function making one when the wait fails (for state that is read only then).
Text = str | Callable[[], str]


async def eventually(
    condition: Callable[[], T | Awaitable[T]],
    what: Text,
    *,
    timeout: float = 10.0,
    interval: float = 0.005,
    stop: Callable[[], str | None] | None = None,
    details: Text = "",
) -> T:
    """Poll ``condition`` on the running loop until it returns something truthy; return it (see the module)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        _check(value, what, timeout, deadline, stop, details)
        await asyncio.sleep(interval)


def eventually_sync(
    condition: Callable[[], T],
    what: Text,
    *,
    timeout: float = 10.0,
    interval: float = 0.01,
    stop: Callable[[], str | None] | None = None,
    details: Text = "",
) -> T:
    """``eventually`` for a thread without an event loop (it blocks between polls)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        _check(value, what, timeout, deadline, stop, details)
        time.sleep(interval)


def exited(processes: Sequence[subprocess.Popen[Any]], *, expected: Iterable[int] = ()) -> Callable[[], str | None]:
    """A ``stop`` for waits on child processes: names one that has exited with a code not ``expected``."""
    allowed = set(expected)

    def stop() -> str | None:
        gone = [p for p in processes if p.poll() is not None and p.returncode not in allowed]
        return f"process {gone[0].pid} exited {gone[0].returncode}" if gone else None

    return stop


def _check(
    value: object, what: Text, timeout: float, deadline: float, stop: Callable[[], str | None] | None, details: Text
) -> None:
    reason = stop() if stop is not None else None
    if reason is None and time.monotonic() < deadline:
        return
    why = (
        f"stopped waiting for {_text(what)}: {reason}"
        if reason
        else f"timed out after {timeout} s waiting for {_text(what)}"
    )
    extra = _text(details)
    raise AssertionError(f"{why} (last value: {value!r})" + (f"\n{extra}" if extra else ""))


def _text(text: Text) -> str:
    return text() if callable(text) else text
