"""The inbox store's port (``asyncq/store/port/inbox.py``) on every driver: each event once by id, its effect inside
the batch's transaction and rolled back alone when it raises, duplicates and conflicts counted. ``read`` is the
whole state a test can see: the durable totals through the port, and the effect's rows (the app's table) read on a
connection of the test's own; ``expect`` is the state before plus the named changes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from drivers import Driver

from asyncq.core.jsontext import canonical_json
from asyncq.store.port.effects import EffectTransaction
from asyncq.store.port.inbox import InboxEvent, InboxResult, InboxStore, InboxTotals

from .support import T0

EFFECTS = "CREATE TABLE IF NOT EXISTS effects (id text PRIMARY KEY, qty integer NOT NULL)"
#: The effect's one statement in each dialect (``EffectTransaction.dialect``).
ADD_EFFECT = {
    "sqlite": "INSERT INTO effects (id, qty) VALUES (?, ?)",
    "postgresql": "INSERT INTO effects (id, qty) VALUES ($1, $2)",
}


class Refused(Exception):
    """An effect's own failure."""


def effect(tx: EffectTransaction, event_id: str, body: Any) -> None:
    """Writes one row; raises after writing it when the body says so (its row must go with it)."""
    tx.execute(ADD_EFFECT[tx.dialect], (event_id, body["qty"]))
    if body.get("refuse"):
        raise Refused(event_id)


@pytest.fixture
async def inbox(driver: Driver, tmp_path: Path) -> AsyncIterator[InboxStore]:
    """A fresh, empty inbox store of ``driver`` with the effect's table, closed after the test."""
    async with driver.target(tmp_path, "inbox") as where:
        store = await driver.open_inbox(where, [EFFECTS])
        try:
            yield store
        finally:
            await store.close()


@dataclass(frozen=True)
class State:
    totals: InboxTotals
    effects: list[tuple[Any, ...]]


async def read(store: InboxStore, driver: Driver) -> State:
    rows = await driver.app_rows(store.location, "SELECT id, qty FROM effects ORDER BY id")
    return State(await store.totals(), [tuple(row) for row in rows])


def expect(
    before: State,
    after: State,
    *,
    applied: int = 0,
    duplicates: int = 0,
    conflicts: int = 0,
    effects: Sequence[tuple[Any, ...]] = (),
) -> None:
    """``after`` is ``before`` with these counts added and these effect rows written."""
    totals = before.totals
    assert after.totals == InboxTotals(
        totals.applied + applied, totals.duplicates + duplicates, totals.conflicts + conflicts
    )
    assert after.effects == sorted([*before.effects, *effects])


def event(event_id: str, qty: int = 1, **more: Any) -> InboxEvent:
    body = {"qty": qty, **more}
    return InboxEvent(event_id, canonical_json(body), body)


def outcomes(results: list[InboxResult]) -> list[str]:
    return [result if isinstance(result, str) else f"{type(result).__name__}: {result}" for result in results]


async def test_new_events_are_applied_once_with_their_effects(inbox: InboxStore, driver: Driver) -> None:
    before = await read(inbox, driver)
    assert before == State(InboxTotals(0, 0, 0), [])
    assert await inbox.record([event("e-1", 3), event("e-2", 4)], T0, effect) == ["applied", "applied"]
    expect(before, await read(inbox, driver), applied=2, effects=[("e-1", 3), ("e-2", 4)])


async def test_a_known_id_is_a_duplicate_with_its_body_and_a_conflict_with_another(
    inbox: InboxStore, driver: Driver
) -> None:
    await inbox.record([event("e-1", 3)], T0, effect)
    before = await read(inbox, driver)
    found = await inbox.record([event("e-1", 3), event("e-1", 5), event("e-1", 3)], T0 + 1, effect)
    assert found == ["duplicate", "conflict", "duplicate"]
    expect(before, await read(inbox, driver), duplicates=2, conflicts=1)


async def test_the_same_id_twice_in_one_batch_is_applied_once(inbox: InboxStore, driver: Driver) -> None:
    before = await read(inbox, driver)
    assert await inbox.record([event("e-1", 3), event("e-1", 3), event("e-1", 4)], T0, effect) == [
        "applied",
        "duplicate",
        "conflict",
    ]
    expect(before, await read(inbox, driver), applied=1, duplicates=1, conflicts=1, effects=[("e-1", 3)])


async def test_an_effect_that_raises_is_rolled_back_alone(inbox: InboxStore, driver: Driver) -> None:
    before = await read(inbox, driver)
    batch = [event("e-1", 1), event("e-2", 2, refuse=True), event("e-3", 3)]
    assert outcomes(await inbox.record(batch, T0, effect)) == ["applied", "Refused: e-2", "applied"]
    after = await read(inbox, driver)
    expect(before, after, applied=2, effects=[("e-1", 1), ("e-3", 3)])
    assert await inbox.record([event("e-2", 2)], T0 + 1, effect) == ["applied"]  # no row of it was kept
    expect(after, await read(inbox, driver), applied=1, effects=[("e-2", 2)])


async def test_an_effect_may_not_end_the_transaction(inbox: InboxStore, driver: Driver) -> None:
    def commits(tx: EffectTransaction, event_id: str, body: Any) -> None:
        effect(tx, event_id, body)
        tx.execute("COMMIT")

    before = await read(inbox, driver)
    [refused] = await inbox.record([event("e-1", 1)], T0, commits)
    assert isinstance(refused, Exception), refused
    expect(before, await read(inbox, driver))
    assert await inbox.record([event("e-1", 1)], T0, effect) == ["applied"]


async def test_without_an_effect_events_are_recorded_only(inbox: InboxStore, driver: Driver) -> None:
    before = await read(inbox, driver)
    assert await inbox.record([event("e-1"), event("e-2")], T0, None) == ["applied", "applied"]
    assert await inbox.record([event("e-1"), event("e-2", 9)], T0, effect) == ["duplicate", "conflict"]
    expect(before, await read(inbox, driver), applied=2, duplicates=1, conflicts=1)


async def test_the_effect_sees_its_own_rows_and_the_earlier_batches(inbox: InboxStore, driver: Driver) -> None:
    seen: list[list[Any]] = []

    def looks(tx: EffectTransaction, event_id: str, body: Any) -> None:
        effect(tx, event_id, body)
        seen.append([tuple(row) for row in tx.execute("SELECT id FROM effects ORDER BY id")])

    await inbox.record([event("e-1")], T0, effect)
    await inbox.record([event("e-2"), event("e-3")], T0, looks)
    assert seen == [[("e-1",), ("e-2",)], [("e-1",), ("e-2",), ("e-3",)]]


async def test_two_hosts_recording_the_same_ids_in_opposite_orders_each_apply_every_id_once(
    driver: Driver, tmp_path: Path
) -> None:
    """Two stores on one inbox (two hosts), each recording the same batch of ids, one in the other's reverse
    order, with an effect slow enough that the batches overlap. On PostgreSQL each batch's inserts wait for the
    other's rows, so in opposite orders they would deadlock (the server then fails one batch); a batch takes its
    ids' locks in one order first, so neither fails: every id applied once, every other answer a duplicate."""

    def slow(tx: EffectTransaction, event_id: str, body: Any) -> None:
        effect(tx, event_id, body)
        time.sleep(0.01)

    ids = [f"x-{n}" for n in range(8)]
    async with driver.target(tmp_path, "inbox") as where:
        first = await driver.open_inbox(where, [EFFECTS])
        second = await driver.open_inbox(where, [EFFECTS])
        try:
            forward, backward = await asyncio.gather(
                first.record([event(i) for i in ids], T0, slow),
                second.record([event(i) for i in reversed(ids)], T0, slow),
            )
            answers = outcomes(forward) + outcomes(backward)
            assert sorted(answers) == ["applied"] * len(ids) + ["duplicate"] * len(ids), answers
            after = await read(first, driver)
            assert after == State(InboxTotals(len(ids), len(ids), 0), [(i, 1) for i in ids])
        finally:
            await first.close()
            await second.close()
