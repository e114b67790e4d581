"""The outbox store's port (``asyncq/store/port/outbox.py``) on every driver: adds, the app's transaction, the
head, the fenced lease and relay writes, operator moves. Every test states the whole state it touches: ``read``
takes every item the test made (``get``), the lease and every audit row through the port, and checks that
``head_batch``, ``audit`` and ``figures`` agree with them; ``expect`` is the state before plus the named changes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from drivers import Driver

from asyncq.errors import Conflict
from asyncq.store.port.outbox import (
    ALARM,
    QUARANTINED,
    SENT,
    UNSENT,
    Failure,
    Figures,
    Item,
    Lease,
    NewItem,
    OutboxAuditEntry,
    OutboxStore,
    Step,
)

from .support import ALL, T0

FREE = Lease(None, 0, None)
IDS = "abcdef"


@pytest.fixture
async def outbox(driver: Driver, tmp_path: Path) -> AsyncIterator[OutboxStore]:
    """A fresh, empty outbox store of ``driver``, closed after the test."""
    async with driver.target(tmp_path, "outbox") as where:
        store = await driver.open_outbox(where)
        try:
            yield store
        finally:
            await store.close()


@dataclass(frozen=True)
class State:
    """Every item the test made (by id), the lease, and every audit row (oldest first)."""

    items: dict[str, Item]
    lease: Lease
    audit: list[OutboxAuditEntry]


async def read(store: OutboxStore, ids: Iterable[str] = IDS, now: int = T0) -> State:
    """The whole state through the port (``ids``: every id the test may have added), its views checked."""
    items = {item.id: item for item in [await store.get(item_id) for item_id in ids] if item is not None}
    waiting = sorted((item for item in items.values() if item.state in (UNSENT, ALARM)), key=lambda i: i.seq)
    assert await store.head_batch(ALL) == waiting
    assert await store.head_batch(1) == waiting[:1]
    audit = await store.audit(None)
    for item_id in ids:
        assert await store.audit(item_id) == [entry for entry in audit if entry.id == item_id]
    figures = await store.figures(now)
    lease = Lease(figures.lease_owner, figures.lease_token, figures.lease_until)
    assert figures == figures_of(waiting, items.values(), lease, now)
    return State(items, lease, audit)


def figures_of(waiting: Sequence[Item], items: Iterable[Item], lease: Lease, now: int) -> Figures:
    """Every figure as the items and the lease define it."""
    head = waiting[0] if waiting else None
    return Figures(
        now_ms=now,
        unsent=len(waiting),
        alarm=head is not None and head.state == ALARM,
        alarmed=sum(item.state == ALARM for item in waiting),
        quarantined=sum(item.state == QUARANTINED for item in items),
        oldest_unsent_age_ms=max(0, now - min(i.created_at for i in waiting)) if waiting else None,
        head_id=None if head is None else head.id,
        head_state=None if head is None else head.state,
        head_attempts=0 if head is None else head.attempts,
        head_last_error=None if head is None else head.last_error,
        lease_owner=lease.owner,
        lease_token=lease.token,
        lease_until=lease.lease_until,
    )


def expect(
    before: State,
    after: State,
    items: Mapping[str, Item] | None = None,
    lease: Lease | None = None,
    audit: Sequence[OutboxAuditEntry] = (),
) -> None:
    """``after`` is ``before`` with exactly ``items`` changed (or added), the ``lease`` (if named) and ``audit``."""
    assert after.items == {**before.items, **(items or {})}
    assert after.lease == (before.lease if lease is None else lease)
    assert after.audit == [*before.audit, *audit]


def unsent(store_item: Item | None, item: NewItem, now: int) -> Item:
    """The record a new item must be stored as (its ``seq`` as the store gave it)."""
    assert store_item is not None
    return Item(store_item.seq, item.id, item.topic, item.body, now, UNSENT, 0, 0, None, now, None)


def new(item_id: str, body: object = None, topic: str = "default") -> NewItem:
    return NewItem.check(item_id, {"id": item_id} if body is None else body, topic)


async def added(store: OutboxStore, *ids: str, now: int = T0) -> State:
    for item_id in ids:
        assert await store.add(new(item_id), now) is True
    return await read(store, now=now)


async def test_a_new_item_is_stored_whole_and_unsent(outbox: OutboxStore) -> None:
    before = await read(outbox)
    assert before == State({}, FREE, [])
    assert await outbox.add(new("a", {"n": [1, 2]}, "orders"), T0) is True
    after = await read(outbox)
    expect(before, after, {"a": unsent(after.items.get("a"), new("a", {"n": [1, 2]}, "orders"), T0)})


async def test_the_same_item_again_is_false_and_another_body_or_topic_a_conflict(outbox: OutboxStore) -> None:
    before = await added(outbox, "a")
    assert await outbox.add(new("a"), T0 + 5) is False
    with pytest.raises(Conflict):
        await outbox.add(new("a", {"other": 1}), T0 + 5)
    with pytest.raises(Conflict):
        await outbox.add(new("a", topic="elsewhere"), T0 + 5)
    expect(before, await read(outbox))


async def test_items_commit_with_the_apps_statements_or_not_at_all(outbox: OutboxStore, driver: Driver) -> None:
    async with outbox.transaction() as tx:
        await tx.execute("CREATE TABLE orders (id text PRIMARY KEY)")
    before = await read(outbox)
    with pytest.raises(RuntimeError, match="the app fails"):
        async with outbox.transaction() as tx:
            await tx.execute("INSERT INTO orders VALUES ('o-1')")
            assert await tx.add(new("a"), T0) is True
            raise RuntimeError("the app fails")
    expect(before, await read(outbox))
    assert await driver.app_rows(outbox.location, "SELECT id FROM orders") == []
    async with outbox.transaction() as tx:
        await tx.execute("INSERT INTO orders VALUES ('o-1')")
        assert await tx.add(new("a"), T0) is True
        assert await tx.execute("SELECT id FROM orders") == [("o-1",)]
    after = await read(outbox)
    expect(before, after, {"a": unsent(after.items.get("a"), new("a"), T0)})
    assert await driver.app_rows(outbox.location, "SELECT id FROM orders") == [("o-1",)]


async def test_seq_is_insertion_order_and_the_head_skips_sent_and_quarantined(outbox: OutboxStore) -> None:
    state = await added(outbox, *IDS)
    assert [item.id for item in sorted(state.items.values(), key=lambda i: i.seq)] == list(IDS)
    lease, ours = await outbox.hold_lease(None, "relay", T0, 1_000)
    assert ours
    assert await outbox.advance(lease, T0, 1_000, None, state.items["a"].seq) == Step(lease, False, True)
    assert (await outbox.advance(lease, T0, 1_000, state.items["a"].seq, None)).marked
    await outbox.operate("c", "quarantine", T0, "held back", None)
    assert [item.id for item in await outbox.head_batch(2)] == ["b", "d"]
    assert [item.id for item in await outbox.head_batch(ALL)] == ["b", "d", "e", "f"]
    await read(outbox)  # the figures agree with the items


async def test_the_lease_is_taken_when_free_or_expired_always_with_a_new_token(outbox: OutboxStore) -> None:
    before = await read(outbox)
    first, ours = await outbox.hold_lease(None, "one", T0, 1_000)
    assert (first, ours) == (Lease("one", 1, T0 + 1_000), True)
    stored, ours = await outbox.hold_lease(None, "two", T0 + 999, 1_000)
    assert (stored, ours) == (first, False)
    renewed, ours = await outbox.hold_lease(first, "one", T0 + 500, 1_000)
    assert (renewed, ours) == (Lease("one", 1, T0 + 1_500), True)
    second, ours = await outbox.hold_lease(None, "two", T0 + 1_500, 1_000)  # expired: taken, token + 1
    assert (second, ours) == (Lease("two", 2, T0 + 2_500), True)
    assert await outbox.renew_lease(renewed, T0 + 1_600, 1_000) is None
    assert await outbox.release_lease(renewed) is False
    expect(before, await read(outbox), lease=second)
    assert await outbox.renew_lease(second, T0 + 1_600, 1_000) == Lease("two", 2, T0 + 2_600)
    assert await outbox.release_lease(second) is True
    expect(before, await read(outbox), lease=Lease(None, 2, None))
    assert await outbox.hold_lease(None, "three", T0 + 1_700, 1_000) == (Lease("three", 3, T0 + 2_700), True)


async def test_relay_writes_under_a_lost_lease_change_nothing(outbox: OutboxStore) -> None:
    await added(outbox, "a", "b")
    lost, _ = await outbox.hold_lease(None, "one", T0, 1_000)
    taker, _ = await outbox.hold_lease(None, "two", T0 + 1_000, 1_000)
    before = await read(outbox)
    a, b = before.items["a"], before.items["b"]
    assert await outbox.advance(lost, T0 + 1_000, 1_000, None, a.seq) == Step(None, False, False)
    assert await outbox.advance(lost, T0 + 1_000, 1_000, a.seq, b.seq) == Step(None, False, False)
    failure = Failure("boom", T0 + 5_000, permanent=True, alarm_after=1)
    assert await outbox.record_failure(lost, T0 + 1_000, 1_000, a.seq, failure) == (None, None)
    expect(before, await read(outbox))
    assert before.lease == taker


async def test_an_attempt_is_counted_only_on_an_unsent_due_item_and_sent_clears_the_error(outbox: OutboxStore) -> None:
    state = await added(outbox, "a", "b")
    lease, _ = await outbox.hold_lease(None, "relay", T0, 10_000)
    a, b = state.items["a"], state.items["b"]
    assert await outbox.advance(lease, T0, 10_000, None, a.seq) == Step(lease, False, True)
    retry = Failure("timeout", T0 + 100, permanent=False, alarm_after=5)
    assert await outbox.record_failure(lease, T0, 10_000, a.seq, retry) == (lease, UNSENT)
    before = await read(outbox)
    assert await outbox.advance(lease, T0 + 99, 10_000, None, a.seq) == Step(
        Lease("relay", 1, T0 + 10_099), False, False
    )
    assert await outbox.advance(lease, T0 + 100, 10_000, None, a.seq) == Step(
        Lease("relay", 1, T0 + 10_100), False, True
    )
    sent = await outbox.advance(lease, T0 + 150, 10_000, a.seq, b.seq)
    assert sent == Step(Lease("relay", 1, T0 + 10_150), True, True)
    after = await read(outbox)
    done = replace(before.items["a"], state=SENT, attempts=2, last_error=None, sent_at=T0 + 150)
    expect(before, after, {"a": done, "b": replace(b, attempts=1)}, lease=sent.lease)
    assert (await outbox.advance(lease, T0 + 200, 10_000, a.seq, a.seq)).marked is False  # sent once only


async def test_a_failure_alarms_when_the_budget_is_spent_or_at_once_if_permanent(outbox: OutboxStore) -> None:
    state = await added(outbox, "a", "b")
    lease, _ = await outbox.hold_lease(None, "relay", T0, 10_000)
    a, b = state.items["a"], state.items["b"]
    for attempt in (1, 2):
        await outbox.advance(lease, T0, 10_000, None, a.seq)
        state_after = await outbox.record_failure(lease, T0, 10_000, a.seq, Failure(f"e{attempt}", T0, False, 2))
        assert state_after == (Lease("relay", 1, T0 + 10_000), UNSENT if attempt == 1 else ALARM)
    assert (await outbox.record_failure(lease, T0, 10_000, b.seq, Failure("bad", T0 + 9, True, 99)))[1] == ALARM
    after = await read(outbox)
    expect(
        state,
        after,
        {
            "a": replace(a, state=ALARM, attempts=2, last_error="e2"),
            "b": replace(b, state=ALARM, last_error="bad", next_attempt_at=T0 + 9),
        },
        lease=Lease("relay", 1, T0 + 10_000),
    )
    assert await outbox.record_failure(lease, T0, 10_000, a.seq, Failure("x", T0, False, 1)) == (lease, None)
    expect(after, await read(outbox))  # an item in alarm is not failed again


async def test_operator_moves_are_audited_with_the_ids_they_skip(outbox: OutboxStore) -> None:
    state = await added(outbox, "a", "b", "c")
    lease, _ = await outbox.hold_lease(None, "relay", T0, 60_000)
    a, b, c = (state.items[i] for i in "abc")
    await outbox.advance(lease, T0, 60_000, None, a.seq)
    await outbox.record_failure(lease, T0, 60_000, a.seq, Failure("refused", T0 + 50, True, 3))
    before = await read(outbox)
    quarantined = await outbox.operate("a", "quarantine", T0 + 10, "poison", "the receiver refuses it")
    assert quarantined == OutboxAuditEntry(
        "a", T0 + 10, "quarantine", ALARM, "poison", "the receiver refuses it", 1, "refused", ["b", "c"], 2
    )
    await outbox.advance(lease, T0 + 20, 60_000, None, b.seq)
    await outbox.advance(lease, T0 + 20, 60_000, b.seq, None)
    requeued = await outbox.operate("a", "requeue", T0 + 30, "fixed", None)
    assert requeued == OutboxAuditEntry("a", T0 + 30, "requeue", QUARANTINED, "fixed", None, 1, "refused", ["b"], 1)
    after = await read(outbox)
    moved = replace(before.items["a"], state=UNSENT, budget_from=1, next_attempt_at=T0 + 30)
    sent_b = replace(b, state=SENT, attempts=1, sent_at=T0 + 20)
    expect(
        before,
        after,
        {"a": moved, "b": sent_b, "c": c},
        lease=Lease("relay", 1, T0 + 60_020),
        audit=[quarantined, requeued],
    )


async def test_retry_gives_a_fresh_budget_and_a_wrong_move_changes_nothing(outbox: OutboxStore) -> None:
    state = await added(outbox, "a")
    lease, _ = await outbox.hold_lease(None, "relay", T0, 60_000)
    await outbox.advance(lease, T0, 60_000, None, state.items["a"].seq)
    await outbox.record_failure(lease, T0, 60_000, state.items["a"].seq, Failure("down", T0 + 500, False, 1))
    before = await read(outbox)
    for item_id, action in (("a", "requeue"), ("missing", "retry"), ("missing", "quarantine")):
        with pytest.raises(ValueError, match=f"cannot {action}"):
            await outbox.operate(item_id, action, T0 + 5, "no", None)
    expect(before, await read(outbox))
    entry = await outbox.operate("a", "retry", T0 + 5, "try again", None)
    assert entry == OutboxAuditEntry("a", T0 + 5, "retry", ALARM, "try again", None, 1, "down", [], 0)
    after = await read(outbox)
    retried = replace(before.items["a"], state=UNSENT, budget_from=1, next_attempt_at=T0 + 5)
    expect(before, after, {"a": retried}, audit=[entry])
