"""The tests' wait helper (``tests/waiting.py``): it returns the first truthy value, and fails naming what it
awaited, at the deadline or at once when ``stop`` gives a reason."""

from __future__ import annotations

import threading
import time

import pytest
from waiting import eventually, eventually_sync


async def test_it_returns_the_first_truthy_value_of_a_plain_or_async_condition() -> None:
    polls: list[int] = []

    def fourth() -> int | None:
        polls.append(len(polls))
        return polls[-1] if len(polls) == 4 else None

    async def sixth() -> str:
        polls.append(len(polls))
        return "ready" if len(polls) == 6 else ""

    assert await eventually(fourth, "the fourth poll") == 3
    assert await eventually(sixth, "the sixth poll", interval=0) == "ready"
    assert polls == list(range(6))


async def test_it_fails_at_the_deadline_naming_what_it_awaited_and_the_last_value() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for the door \(last value: 0\)\nstderr"):
        await eventually(lambda: 0, "the door", timeout=0.05, details=lambda: "stderr")
    assert time.monotonic() - started >= 0.05


def test_the_thread_form_stops_at_once_when_waiting_cannot_help() -> None:
    done = threading.Event()
    threading.Timer(0.01, done.set).start()
    assert eventually_sync(done.is_set, "the timer") is True
    with pytest.raises(AssertionError, match="stopped waiting for the worker: it died"):
        eventually_sync(lambda: False, "the worker", timeout=60, stop=lambda: "it died")
