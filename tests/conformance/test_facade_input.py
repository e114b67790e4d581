"""Bad input is the facade's to refuse, before any change: ``Queue`` over each driver's store raises
``ValueError``/``TypeError`` with every row and audit row unchanged and no transaction left open."""

from __future__ import annotations

import math
from typing import Any

import pytest

from asyncq.core.jobs import MAX_BODY_BYTES, JobSpec
from asyncq.queue import Queue
from asyncq.store.port.queue import QueueStore

from .support import T0, assert_no_transaction_left, dump

pytestmark = pytest.mark.timeout(30)


def facade(store: QueueStore) -> Queue:
    """The facade over the suite's store, on a fixed clock (the fixture closes the store)."""
    return Queue(store, clock=lambda: T0)


async def test_a_batch_with_one_invalid_job_is_refused_whole(store: QueueStore) -> None:
    queue = facade(store)
    before = await dump(store)
    with pytest.raises(ValueError):
        await queue.enqueue_many([JobSpec("new-1", {"v": 1}), JobSpec("bad id", {"v": 1})])
    with pytest.raises(ValueError):
        await queue.enqueue_many([JobSpec("new-1", {"v": 1}), JobSpec("new-2", {"v": float("nan")})])
    with pytest.raises(TypeError):
        await queue.enqueue_many([JobSpec("new-1", {}), ("new-2", {})])  # type: ignore[list-item]
    assert await dump(store) == before
    await assert_no_transaction_left(store)


async def test_a_body_is_capped_at_64_kib_of_canonical_json(store: QueueStore) -> None:
    queue = facade(store)
    largest = "x" * (MAX_BODY_BYTES - 2)  # the two quotes make it exactly 64 KiB
    assert await queue.enqueue("fits", largest) is True
    before = await dump(store)
    with pytest.raises(ValueError):
        await queue.enqueue("too-big", largest + "x")
    with pytest.raises(ValueError):  # counted in UTF-8 bytes, not characters
        await queue.enqueue("too-big", "é" * (MAX_BODY_BYTES // 2))
    assert await dump(store) == before


BAD_ENQUEUES: list[tuple[Any, Any, dict[str, Any]]] = [
    ("", {}, {}),
    ("a b", {}, {}),
    ("a\n", {}, {}),
    ("é", {}, {}),
    ("x" * 65, {}, {}),
    (7, {}, {}),  # an id must be a str
    ("ok", {}, {"queue": ""}),
    ("ok", {}, {"queue": "with space"}),
    ("ok", {}, {"queue": None}),
    ("ok", {}, {"max_attempts": True}),
    ("ok", {}, {"max_attempts": 0}),
    ("ok", {}, {"max_attempts": 2.0}),
    ("ok", {}, {"ttl": True}),
    ("ok", {}, {"ttl": 0}),
    ("ok", {}, {"delay": False}),
    ("ok", {}, {"delay": -1}),
    ("ok", {}, {"delay": 10, "ttl": 5}),  # would be due after its deadline
    ("ok", float("nan"), {}),
    ("ok", {"x": math.inf}, {}),
    ("ok", {1, 2}, {}),
    ("ok", object(), {}),
]


@pytest.mark.parametrize(("job_id", "body", "options"), BAD_ENQUEUES)
async def test_bad_enqueue_input_is_a_value_error_before_any_change(
    store: QueueStore, job_id: Any, body: Any, options: dict[str, Any]
) -> None:
    queue = facade(store)
    await queue.enqueue("present", {"v": 1})
    before = await dump(store)
    with pytest.raises(ValueError):
        await queue.enqueue(job_id, body, **options)
    async with queue.transaction() as tx:
        with pytest.raises(ValueError):
            await tx.enqueue(job_id, body, **options)
    assert await dump(store) == before
    await assert_no_transaction_left(store)


async def test_bad_worker_and_operator_input_is_a_value_error_before_any_change(store: QueueStore) -> None:
    queue = facade(store)
    await queue.enqueue("j", {})
    [ticket] = await queue.claim("w1", lease=1)
    await queue.enqueue("k", {})
    before = await dump(store)
    bad_calls = [
        queue.claim("", lease=1),
        queue.claim("w1", queue="a b"),
        queue.claim("w1", limit=True),
        queue.claim("w1", limit=0),
        queue.claim("w1", lease=0),
        queue.finish(ticket, "done"),
        queue.finish(ticket, "ok", delay=-1),
        queue.finish(ticket, "retry", delay=True),
        queue.finish_many([(ticket, "ok", 0), (ticket, "maybe", 0)]),
        queue.extend(ticket, lease=True),
        queue.redrive("j", "has a space"),
        queue.redrive("j", "note", ttl=0),
        queue.cancel("k", ""),
        queue.cancel("bad id", "note"),
        queue.get("bad id"),
        queue.list_jobs(status="gone"),
        queue.list_jobs(limit=0),
        queue.prune(-1),
        queue.prunable(1, ("pending",)),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            await call
    assert await dump(store) == before
    await assert_no_transaction_left(store)
