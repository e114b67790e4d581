"""Pause and resume as stored state on each driver (docs/flow-control.md): the claim statement reads the queue's
settings row, so a paused queue is claimed from by no handle (another connection, a reopened store), jobs in
flight still finish, and every move is audited."""

from __future__ import annotations

from typing import Any

import pytest
from drivers import Driver

from asyncq.core.flow import QueueSettings
from asyncq.queue import Queue
from asyncq.store.port.queue import QueueStore

from .support import T0, assert_no_transaction_left, claim, dump, enqueue, expect, new, outcome

pytestmark = pytest.mark.timeout(30)


def facade(store: QueueStore) -> Queue:
    return Queue(store, clock=lambda: T0)


async def test_a_paused_queue_is_claimed_from_by_no_handle_and_its_in_flight_jobs_finish(
    store: QueueStore, driver: Driver
) -> None:
    await enqueue(store, new("a1", queue="mail"), new("a2", queue="mail"), new("b1", queue="other"))
    [held] = await claim(store, "w1", T0, queue="mail")
    before = await dump(store)
    entry = await facade(store).pause("mail", note="provider outage", by="ops on call")
    assert (entry.queue, entry.action, entry.at_ms, entry.actor, entry.note) == (
        "mail", "pause", T0, "ops on call", "provider outage"
    )  # fmt: skip
    paused = QueueSettings("mail", T0, "ops on call", "provider outage", None)
    expect(before, await dump(store), queues=[paused], queue_audit=[entry])
    other = await driver.open_another(store)
    try:
        assert await claim(other, "w2", T0 + 1, queue="mail", n=5) == []
        assert await claim(store, "w1", T0 + 5_000, queue="mail", n=5) == []  # not even the expired lease
        assert [t.id for t in await claim(other, "w2", T0 + 1, queue="other")] == ["b1"]  # other queues run
    finally:
        await other.close()
    assert await store.finish([outcome(held, "ok")], T0 + 500) == ["done"]  # in flight: it finishes
    assert await facade(store).paused_queues() == [paused]


async def test_resume_lets_claims_take_the_queue_again_in_order(store: QueueStore) -> None:
    queue = facade(store)
    await enqueue(store, new("low", queue="mail", priority=-1), new("high", queue="mail", priority=1))
    paused = await queue.pause("mail", note="deploy")
    assert await claim(store, "w1", T0, queue="mail", n=5) == []
    before = await dump(store)
    resumed = await queue.resume("mail", note="deploy done", by="ci")
    assert (resumed.action, resumed.note, resumed.actor, resumed.seq > paused.seq) == (
        "resume",
        "deploy done",
        "ci",
        True,
    )
    expect(before, await dump(store), queues=[QueueSettings("mail", None, None, None, None)], queue_audit=[resumed])
    assert [t.id for t in await claim(store, "w1", T0, queue="mail", n=5)] == ["high", "low"]
    assert await queue.paused_queues() == []
    assert [m.action for m in await queue.queue_audit("mail")] == ["resume", "pause"]  # newest first
    assert await queue.queue_audit("other") == []


async def test_a_pause_is_a_row_it_outlasts_the_handle_that_made_it(store: QueueStore, driver: Driver) -> None:
    await enqueue(store, new("a", queue="mail"))
    first = await driver.open_another(store)
    try:
        await facade(first).pause("mail", note="until the provider answers")
    finally:
        await first.close()
    again = await driver.open_another(store)  # a restart: a new handle, nothing shared in memory
    try:
        assert await claim(again, "w1", T0, queue="mail") == []
        [settings] = await facade(again).paused_queues()
        assert (settings.queue, settings.note, settings.paused_at) == ("mail", "until the provider answers", T0)
        await facade(again).resume("mail", note="answered")
        assert [t.id for t in await claim(again, "w1", T0, queue="mail")] == ["a"]
    finally:
        await again.close()


async def test_pausing_a_paused_queue_or_resuming_a_running_one_changes_nothing(store: QueueStore) -> None:
    queue = facade(store)
    with pytest.raises(ValueError, match="not paused"):
        await queue.resume("mail", note="nothing to resume")
    await queue.pause("mail", note="first")
    before = await dump(store)
    with pytest.raises(ValueError, match="already paused"):
        await queue.pause("mail", note="second")
    assert await dump(store) == before
    await assert_no_transaction_left(store)


BAD_MOVES: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("bad queue", {"note": "ok"}, ValueError),
    ("mail", {"note": ""}, ValueError),
    ("mail", {"note": " padded"}, ValueError),
    ("mail", {"note": "line\nbreak"}, ValueError),
    ("mail", {"note": "x" * 501}, ValueError),
    ("mail", {"note": 7}, ValueError),
    ("mail", {"note": "ok", "by": ""}, ValueError),
]


@pytest.mark.parametrize(("name", "options", "error"), BAD_MOVES)
async def test_a_bad_pause_or_resume_is_refused_before_any_statement(
    store: QueueStore, name: str, options: dict[str, Any], error: type[Exception]
) -> None:
    queue = facade(store)
    await queue.pause("held", note="kept")
    before = await dump(store)
    with pytest.raises(error):
        await queue.pause(name, **options)
    with pytest.raises(error):
        await queue.resume(name, **options)
    with pytest.raises((ValueError, TypeError)):
        await queue.set_max_wait("mail", -1)
    with pytest.raises((ValueError, TypeError)):
        await queue.set_max_wait("mail", True)  # type: ignore[arg-type]
    assert await dump(store) == before
    await assert_no_transaction_left(store)
