"""All or nothing: a write call that fails after some of its statements have run keeps none of them. The driver
makes every update of job ``b`` fail (a trigger); each call below changes ``a`` (or writes an audit row) first,
then ``b``, and must leave the whole state as it was, with no transaction left open."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from drivers import Driver

from asyncq.core.jobs import Ticket
from asyncq.store.port.queue import QueueStore

from .support import T0, Dump, assert_no_transaction_left, claim, dump, enqueue, new, outcome

pytestmark = pytest.mark.timeout(30)

Call = Callable[[QueueStore, Ticket, Ticket], Awaitable[object]]
CALLS: dict[str, Call] = {
    "finish": lambda s, a, b: s.finish([outcome(a, "ok"), outcome(b, "ok")], T0 + 10),
    "finish-on-rows": lambda s, a, b: s.finish([outcome(a, "ok", held=False), outcome(b, "ok", held=False)], T0 + 10),
    # At T0 + 1000 "b"'s lease has expired: the finish of "a" and the claim of "c" land before the claim of "b" fails.
    "settle-then-claim": lambda s, a, b: s.settle_and_claim(
        [outcome(a, "retry")], T0 + 1_000, "w2", 1_000, [("other", 1), ("default", 5)], None
    ),
    "extend": lambda s, a, b: s.extend([("a", a.fence), ("b", b.fence)], T0 + 10, 5_000),
    "release": lambda s, a, b: s.release([("a", a.fence), ("b", b.fence)], T0 + 10),
}


async def two_leases(store: QueueStore, driver: Driver) -> tuple[Ticket, Ticket, Dump]:
    """``a`` leased by w1 for 5 s, ``b`` for 1 s (refusing updates), ``c`` pending in another queue; the state."""
    await enqueue(store, new("a"), new("b"), new("c", queue="other"))
    [a] = await claim(store, "w1", T0, lease_ms=5_000)
    [b] = await claim(store, "w1", T0, lease_ms=1_000)
    driver.refuse_updates_of(store, "b")
    return a, b, await dump(store, T0 + 10)


@pytest.mark.parametrize("name", CALLS)
async def test_a_batch_failing_at_its_last_row_keeps_none_of_it(store: QueueStore, driver: Driver, name: str) -> None:
    a, b, before = await two_leases(store, driver)
    with pytest.raises(Exception, match="refused by the test"):
        await CALLS[name](store, a, b)
    assert await dump(store, T0 + 10) == before
    await assert_no_transaction_left(store)


@pytest.mark.parametrize("operation", ["redrive", "cancel"])
async def test_an_operators_call_failing_after_its_audit_row_keeps_neither(
    store: QueueStore, driver: Driver, operation: str
) -> None:
    await enqueue(store, new("b"))
    if operation == "redrive":
        [ticket] = await claim(store, "w1", T0)
        assert await store.finish([outcome(ticket, "permanent")], T0 + 1) == ["dead"]
    driver.refuse_updates_of(store, "b")
    before = await dump(store)
    with pytest.raises(Exception, match="refused by the test"):
        if operation == "redrive":
            await store.redrive("b", T0 + 2, T0 + 60_000, "ops")
        else:
            await store.cancel("b", T0 + 2, "ops")
    assert await dump(store) == before  # the audit row, written first, is gone too
    await assert_no_transaction_left(store)
