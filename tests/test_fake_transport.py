"""FakeTransport: the in-memory transport that pool tests and examples deliver through."""

from __future__ import annotations

import asyncio

import pytest

from asyncq.delivery.base import Transport
from asyncq.delivery.fake import Delivery, FakeTransport
from asyncq.errors import BadAck, Permanent, Retryable

pytestmark = pytest.mark.timeout(5)


async def test_records_attempts_and_successes_with_a_copy_of_the_body() -> None:
    fake = FakeTransport()
    transport: Transport = fake  # it satisfies the protocol the pool expects
    body = {"qty": [1, 2]}
    await transport.deliver("a", body, {"Asyncq-Token": "1"})
    body["qty"].append(3)
    assert fake.delivered == [Delivery("a", {"qty": [1, 2]}, {"Asyncq-Token": "1"})]
    assert fake.attempts == fake.delivered


async def test_scripted_failures_are_raised_once_each_in_order_then_it_succeeds() -> None:
    fake = FakeTransport()
    fake.fail("a", Retryable("busy", delay_ms=5), BadAck("wrong id"))
    with pytest.raises(Retryable):
        await fake.deliver("a", 1, {})
    await fake.deliver("b", 1, {})  # other ids are not affected
    with pytest.raises(BadAck):
        await fake.deliver("a", 1, {})
    await fake.deliver("a", 1, {})
    assert [d.job_id for d in fake.attempts] == ["a", "b", "a", "a"]
    assert fake.delivered_ids() == ["b", "a"]


async def test_fail_always_until_cleared() -> None:
    fake = FakeTransport()
    fake.fail_always("a", Permanent("gone"))
    for _ in range(3):
        with pytest.raises(Permanent):
            await fake.deliver("a", None, {})
    fake.fail_always("a", None)
    await fake.deliver("a", None, {})
    assert fake.delivered_ids() == ["a"]


async def test_the_hook_can_hold_a_delivery_in_flight() -> None:
    release = asyncio.Event()
    entered = asyncio.Event()

    async def hold(delivery: Delivery) -> None:
        entered.set()
        await release.wait()

    fake = FakeTransport(hook=hold)
    task = asyncio.create_task(fake.deliver("a", {}, {}))
    await entered.wait()
    assert fake.delivered == [] and len(fake.attempts) == 1
    release.set()
    await task
    assert fake.delivered_ids() == ["a"]


async def test_bodies_and_ids_follow_the_http_rules_and_close_is_final() -> None:
    fake = FakeTransport()
    with pytest.raises(Permanent):
        await fake.deliver("a", {"x": float("nan")}, {})
    with pytest.raises(ValueError):
        await fake.deliver("not an id", {}, {})
    await fake.close()
    with pytest.raises(RuntimeError):
        await fake.deliver("a", {}, {})
