"""Outbox → relay → inbox against a plain-Python model (``relay_model``), one Hypothesis state machine.

Real parts: an ``Outbox`` on a store, one ``Relay`` delivering with ``HttpTransport`` to an ``asyncq.inbox`` receiver
served by aiohttp on 127.0.0.1 (its own store, an effect that writes one ``effects`` row per application), the same
injected clock for all. The machine runs on each driver: two SQLite files, or two fresh schemas of this run's
PostgreSQL database per example (read through connections of the machine's own, dropped at its end).

Rules: add items (the same id and body again is a no-op, another body or topic is ``Conflict``; also inside an app
transaction that commits or raises), relay passes, the clock jumping by powers of 4 ms either way, the receiver
stopped, started and restarted on its port, the receiver answering 503, 422, a 500 after applying, or an ACK for
another id (for every item or one), an operator's retry, and the relay crashing (its lease left to expire), stalling
(it runs again later, believing it holds its lease) or stopping cleanly (the lease released), with the outbox closed
and reopened.

After every step every row of the outbox, its lease, the app's table, the inbox and the effects must equal the
model, and the relay's promises hold on their own: every item is applied at most once, the effects come in the
outbox's order, and an item marked sent has been applied. After the last step a drain (faults cleared, receiver
up, operators retrying alarms, time moving past every backoff and lease) must leave every item sent and applied
exactly once, in order. The client connects anew for each request (``force_close``): a pooled connection to a
receiver that restarted would fail its next request or not depending on timing, which no model can tell.
Size: ``ASYNCQ_MODEL_RELAY_EXAMPLES`` × ``ASYNCQ_MODEL_RELAY_STEPS`` (CI: 150 × 40 on SQLite; PostgreSQL takes a
third of the examples, ``ASYNCQ_MODEL_RELAY_PG_EXAMPLES`` to change it); a failure prints its blob.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import astuple
from typing import Any, ClassVar

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from messaging_support import SQLITE_NAMES
from postgres_support import execute as pg_execute
from postgres_support import new_schema_name, queue_url, run_database
from relay_model import Model, Result, Settings

from asyncq import Conflict, HttpTransport, Outbox, Relay, RetryPolicy
from asyncq.inbox import EffectTransaction, make_inbox_app

T0 = 1_700_000_000_000
IDS = ("a", "b", "c", "d", "e", "f")
TOPICS = ("default", "orders")
FAULTS = (None, None, None, "unavailable", "refuse", "lost-answer", "bad-ack")
JUMPS = (0, *(4**k for k in range(1, 10)), *(4**k for k in range(1, 10)), *(-(4**k) for k in range(1, 10)))
SETTINGS = Settings(batch=3, lease_ms=4096, alarm_after=2, base_ms=100, cap_ms=1600, poll_ms=1000)
AUDIT_COLUMNS = (
    "item_seq, id, at_ms, action, from_state, note, reason, attempts, last_error, skipped_ahead_of, skipped_count"
)
ITEM_COLUMNS = "seq, id, topic, body, created_at, state, attempts, budget_from, last_error, next_attempt_at, sent_at"


class Boom(Exception):
    """The app's own failure inside its transaction."""


ERRORS = (Conflict, ValueError, Boom)


def body_of(item_id: str, variant: str) -> Any:
    """Its id's usual body (keys in either order: the same body), or another one (``Conflict``)."""
    return {"same": {"id": item_id, "n": 1}, "reordered": {"n": 1, "id": item_id}}.get(variant, [item_id, 2])


ADD_EFFECT = {"sqlite": "INSERT INTO effects (id) VALUES (?)", "postgresql": "INSERT INTO effects (id) VALUES ($1)"}


def effect(tx: EffectTransaction, event_id: str, body: Any) -> None:
    """The receiver's effect, in the inbox row's transaction: one row per application, never deduplicated."""
    tx.execute(ADD_EFFECT[tx.dialect], (event_id,))


class FaultGate:
    """What the receiver answers instead of (or after) the inbox: ``fault`` for ``target`` (``None``: every id)."""

    def __init__(self) -> None:
        self.fault: str | None = None
        self.target: str | None = None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
        fault = self.fault if self.target in (None, request.headers.get("Idempotency-Key")) else None
        if fault == "unavailable":
            return web.json_response({"error": "busy"}, status=503)
        if fault == "refuse":
            return web.json_response({"error": "refused"}, status=422)
        response = await handler(request)
        if fault == "lost-answer":  # applied and committed, but the answer says otherwise
            return web.json_response({"error": "lost"}, status=500)
        if fault == "bad-ack":
            return web.json_response({"id": "someone-else", "status": "applied"})
        return response


def error_type(text: str | None) -> str | None:
    """The error type an error text starts with (``"Retryable: 127.0.0.1 answered 503"`` → ``"Retryable"``)."""
    return None if text is None else text.split(":")[0]


class SqliteStores:
    """The machine's outbox and inbox as two files of a temporary folder, read through fresh connections."""

    outbox_options: ClassVar[dict[str, Any]] = {"durability": "normal"}
    APP_TABLE = "CREATE TABLE app_rows (seq INTEGER PRIMARY KEY AUTOINCREMENT, value INTEGER NOT NULL)"
    ADD_APP_ROW = "INSERT INTO app_rows (value) VALUES (?)"
    EFFECTS_DDL = ("CREATE TABLE IF NOT EXISTS effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL)",)

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="asyncq-relay-model-")
        self.outbox, self.inbox = os.path.join(self.dir, "app.db"), os.path.join(self.dir, "inbox.db")

    async def start(self) -> None:
        pass

    async def fetch(self, target: str, statement: str) -> list[tuple[Any, ...]]:
        """``statement`` with asyncq's tables named by role (``{outbox}``, ``{outbox_audit}``…)."""
        con = sqlite3.connect(target, timeout=0)
        try:
            return con.execute(statement.format(**SQLITE_NAMES)).fetchall()
        finally:
            con.close()

    async def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgresStores:
    """The machine's outbox and inbox as two fresh schemas of this run's database (their URLs resolve the app's
    tables there too), read through two connections of the machine's own; dropped at its end. The app's rows are
    numbered ``max + 1`` like SQLite's AUTOINCREMENT after a rollback (a sequence would leave a gap)."""

    outbox_options: ClassVar[dict[str, Any]] = {}
    APP_TABLE = "CREATE TABLE app_rows (seq integer PRIMARY KEY, value integer NOT NULL)"
    ADD_APP_ROW = "INSERT INTO app_rows (seq, value) SELECT coalesce(max(seq), 0) + 1, $1 FROM app_rows"
    EFFECTS_DDL = (
        "CREATE TABLE IF NOT EXISTS effects (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id text NOT NULL)",
    )

    def __init__(self) -> None:
        self.schemas = (new_schema_name(), new_schema_name())
        self.outbox, self.inbox = (queue_url(run_database(), schema) for schema in self.schemas)
        self.readers: dict[str, Any] = {}

    async def start(self) -> None:
        import asyncpg

        from asyncq.store.postgres.connection import parse_url

        for target in (self.outbox, self.inbox):
            self.readers[target] = await asyncpg.connect(parse_url(target).dsn)

    async def fetch(self, target: str, statement: str) -> list[tuple[Any, ...]]:
        from asyncq.store.postgres.connection import parse_url

        schema = parse_url(target).schema
        text = statement.format(**{name: f"{schema}.{name}" for name in SQLITE_NAMES})
        return [tuple(row) for row in await self.readers[target].fetch(text)]

    async def close(self) -> None:
        for reader in self.readers.values():
            await reader.close()
        for schema in self.schemas:
            await pg_execute(run_database(), f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def read_stores(stores: SqliteStores | PostgresStores) -> dict[str, list[tuple[Any, ...]]]:
    """The stores' rows through the machine's own connections (``last_error`` cut to its error type)."""
    outbox, inbox = stores.outbox, stores.inbox
    item_rows = await stores.fetch(outbox, f"SELECT {ITEM_COLUMNS} FROM {{outbox}} ORDER BY seq")
    audit_rows = await stores.fetch(outbox, f"SELECT {AUDIT_COLUMNS} FROM {{outbox_audit}} ORDER BY seq")
    items = [(*row[:8], error_type(row[8]), *row[9:]) for row in item_rows]
    audit = [(*row[:8], error_type(row[8]), json.loads(row[9]), row[10]) for row in audit_rows]
    return {
        "items": items,
        "audit": audit,
        "lease": await stores.fetch(outbox, "SELECT owner, token, lease_until FROM {outbox_lease}"),
        "app": await stores.fetch(outbox, "SELECT seq, value FROM app_rows ORDER BY seq"),
        "inbox": await stores.fetch(inbox, "SELECT * FROM {inbox} ORDER BY id"),
        "effects": [event_id for (event_id,) in await stores.fetch(inbox, "SELECT id FROM effects ORDER BY seq")],
    }


class RelayMachine(RuleBasedStateMachine):
    """The three parts, their model, and whether a check failed already (then the drain is not run)."""

    Stores: type[SqliteStores | PostgresStores] = SqliteStores

    def __init__(self) -> None:
        super().__init__()
        self.stores = self.Stores()
        self.outbox_path, self.inbox_path = self.stores.outbox, self.stores.inbox
        self.clock, self.port, self.restarts = [T0], 0, 0
        self.gate, self.runner = FaultGate(), None
        self.model, self.broken = Model(SETTINGS), False
        self.loop = asyncio.new_event_loop()
        self.run(self.start())

    def run(self, awaitable: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(awaitable)

    async def start(self) -> None:
        self.outbox = await self.open_outbox()
        async with self.outbox.transaction() as tx:
            await tx.execute(self.stores.APP_TABLE)
        await self.start_receiver()
        await self.stores.start()
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), trust_env=False)
        self.transport = HttpTransport(f"http://127.0.0.1:{self.port}/events", session=self.session, timeout=5.0)
        self.relay = self.new_relay()
        self.stalled: dict[str, Relay] = {}  # relays that crashed-stopped and may come back (same outbox connection)

    async def open_outbox(self) -> Outbox:
        return await Outbox.open(self.outbox_path, clock=lambda: self.clock[0], **self.stores.outbox_options)

    def new_relay(self) -> Relay:
        retry = RetryPolicy(base=SETTINGS.base_ms / 1000, cap=SETTINGS.cap_ms / 1000, jitter=lambda: 1.0)
        options = {"batch": SETTINGS.batch, "lease_ms": SETTINGS.lease_ms, "alarm_after": SETTINGS.alarm_after}
        return Relay(self.outbox, self.transport, owner=self.model.owner, retry=retry, poll_ms=SETTINGS.poll_ms,
                     **options)  # fmt: skip

    async def start_receiver(self) -> None:
        app = make_inbox_app(self.inbox_path, effect=effect, ddl=self.stores.EFFECTS_DDL, clock=lambda: self.clock[0])
        app.middlewares.append(self.gate.middleware)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()  # the same port again after a restart
        self.port, self.runner = runner.addresses[0][1], runner

    async def stop_receiver(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            await runner.cleanup()

    def teardown(self) -> None:
        try:
            if not self.broken:
                self.drain()
        finally:
            self.run(self.close())
            self.run(self.stores.close())
            self.loop.close()

    async def close(self) -> None:
        await self.stop_receiver()
        await self.session.close()
        await self.outbox.close()

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.broken = True
            raise AssertionError(message)

    def step(self, name: str, product: Callable[[], Awaitable[Any]], model: Callable[[Model], Any]) -> Any:
        """Run one operation on both: the same value or the same error type."""
        changed = self.model
        try:
            changed, result = self.model.trial(model)
            expected: tuple[str, Any] = ("returned", result)
        except ERRORS as error:
            expected = ("raised", type(error).__name__)
        try:
            actual: tuple[str, Any] = ("returned", self.run(product()))
        except ERRORS as error:
            actual = ("raised", type(error).__name__)
        self.check(actual == expected, f"{name} at t0{self.clock[0] - T0:+}: product {actual} != model {expected}")
        self.model = changed
        return actual[1]

    # -- the app adds items ------------------------------------------------------------------------------------

    @initialize(items=st.lists(st.sampled_from(IDS), min_size=1, max_size=5))
    def fill(self, items: list[str]) -> None:
        for item_id in items:
            self.add(item_id, "same", "default", "add", 0)

    @rule(item_id=st.sampled_from(IDS), variant=st.sampled_from(("same",) * 8 + ("reordered", "other")),
          topic=st.sampled_from(("default",) * 9 + ("orders",)), via=st.sampled_from(("add", "commit", "raise")),
          value=st.integers(0, 99))  # fmt: skip
    def add(self, item_id: str, variant: str, topic: str, via: str, value: int) -> None:
        body, now = body_of(item_id, variant), self.clock[0]

        async def product() -> bool:
            if via == "add":
                return await self.outbox.add(item_id, body, topic=topic)
            async with self.outbox.transaction() as tx:
                await tx.execute(self.stores.ADD_APP_ROW, (value,))
                added = await tx.add(item_id, body, topic=topic)
                if via == "raise":
                    raise Boom("the app fails after its writes")
            return added

        def model(m: Model) -> bool:
            if via != "add":
                m.app.append((len(m.app) + 1, value))
            added = m.add(item_id, body, topic, now)
            if via == "raise":
                raise Boom
            return added

        self.step(f"add {item_id} {body} {topic} via {via}", product, model)

    # -- the relay, the receiver, the operator, time -----------------------------------------------------------

    @rule(fault=st.sampled_from(FAULTS), only=st.one_of(st.none(), st.sampled_from(IDS)),
          wait=st.sampled_from((0, 0, SETTINGS.cap_ms + 1)))  # fmt: skip
    def relay_pass(self, fault: str | None, only: str | None, wait: int = 0) -> None:
        """One ``run_once`` (perhaps after waiting out every backoff), the receiver answering ``fault`` for the item
        ``only`` (``None``: for every item)."""
        self.receiver_fault(fault, only)
        self.clock[0] += wait
        now = self.clock[0]

        self.step("relay.run_once", lambda: self.relay_result(self.relay), lambda m: m.run_once(now))

    async def relay_result(self, relay: Relay) -> Result:
        result = await relay.run_once()
        error = error_type(result.error)
        return Result(result.sent, result.stopped, result.head_id, result.wait_ms, error, result.token)

    @rule(action=st.sampled_from(("restart", "stop", "start")))
    def receiver(self, action: str) -> None:
        if action != "start":
            self.run(self.stop_receiver())
        if action != "stop" and self.runner is None:
            self.run(self.start_receiver())
        self.model.receiver.up = self.runner is not None

    def receiver_fault(self, fault: str | None, only: str | None) -> None:
        self.gate.fault, self.gate.target = fault, only
        self.model.receiver.fault, self.model.receiver.target = fault, only

    @rule(item_id=st.sampled_from(IDS))
    def operator_retry(self, item_id: str) -> None:
        """Retry an alarmed or backing-off item (anything else is ValueError and changes nothing)."""
        now = self.clock[0]

        async def product() -> tuple[Any, ...]:
            entry = await self.outbox.retry(item_id, "fixed it")
            return (*astuple(entry)[:7], error_type(entry.last_error), *astuple(entry)[8:])

        self.step(f"retry {item_id}", product, lambda m: m.retry(item_id, "fixed it", now))

    @rule(jump=st.sampled_from(JUMPS), to_lease_end=st.one_of(st.none(), st.sampled_from((-1, 0, 1))))
    def tick(self, jump: int, to_lease_end: int | None = None) -> None:
        """Move the clock by ``jump``, or to the relay lease's end ± 1 ms (where it is taken over, or not)."""
        until = self.model.lease[2]
        if to_lease_end is None or until is None:
            self.clock[0] += jump
        else:
            self.clock[0] = until + to_lease_end

    @rule(how=st.sampled_from(("clean", "crash", "stall")), reopen=st.booleans())
    def restart_relay(self, how: str, reopen: bool) -> None:
        """A new relay under a new owner, after the old one stopped cleanly (lease released), crashed (its lease left
        to expire) or stalled (it may run again later, believing it still holds its lease)."""
        if how == "clean":
            self.run(self.relay.release())
            self.model.release()
        elif how == "stall" and not reopen:
            self.stalled[self.model.owner] = self.relay
        else:
            del self.model.held[self.model.owner]
        if reopen:  # the stalled relays' connection closes with it: they are gone (crashed) too
            for owner in self.stalled:
                del self.model.held[owner]
            self.stalled.clear()
            self.run(self.outbox.close())
            self.outbox = self.run(self.open_outbox())
        self.restarts += 1
        self.model.owner = f"relay-{self.restarts}"
        self.model.held[self.model.owner] = None
        self.relay = self.new_relay()

    @precondition(lambda self: self.stalled)
    @rule(pick=st.integers(0, 7))
    def stalled_relay_pass(self, pick: int) -> None:
        """A stalled relay runs a pass again: only with the lease's current token may it write anything."""
        owner = sorted(self.stalled)[pick % len(self.stalled)]
        now = self.clock[0]
        self.step(f"stalled {owner}.run_once", lambda: self.relay_result(self.stalled[owner]),
                  lambda m: m.run_once(now, owner))  # fmt: skip

    # -- what must hold ----------------------------------------------------------------------------------------

    @invariant()
    def stores_match_the_model(self) -> None:
        found, m = self.run(read_stores(self.stores)), self.model
        items = sorted(m.items.values(), key=lambda item: item.seq)
        expected = [tuple(vars(item).values()) for item in items]
        self.check(found["items"] == expected, f"outbox {found['items']} != model {expected}")
        self.check(found["lease"] == [tuple(m.lease)], f"lease {found['lease']} != model {m.lease}")
        self.check(found["audit"] == m.audit, f"audit {found['audit']} != model {m.audit}")
        self.check(found["app"] == m.app, f"app rows {found['app']} != model {m.app}")
        inbox = [(item_id, *row) for item_id, row in sorted(m.receiver.rows.items())]
        self.check(found["inbox"] == inbox, f"inbox {found['inbox']} != model {inbox}")
        effects, order = found["effects"], [item.id for item in items]
        self.check(len(set(effects)) == len(effects), f"an item was applied twice: {effects}")
        self.check(effects == order[: len(effects)], f"effects {effects} out of the outbox's order {order}")
        unapplied = [item.id for item in items if item.state == "sent" and item.id not in effects]
        self.check(not unapplied, f"marked sent but never applied: {unapplied}")
        self.check(effects == m.receiver.effects, f"effects {effects} != model {m.receiver.effects}")

    def past_every_wait(self) -> int:
        """A time after every backoff and every lease (an abandoned one too), and after the clock's last reading:
        a clock that went back makes the relay wait until it passes the items' times again."""
        times = [item.next_attempt_at for item in self.model.items.values()] + [self.model.lease[2] or 0]
        return max(self.clock[0] + SETTINGS.cap_ms, *times) + 1

    def drain(self) -> None:
        """Clear the faults, bring the receiver up, and pass until every item is sent: each applied once, in order."""
        self.receiver("start")
        for _ in range(4 * len(IDS) + 4):
            for item in self.model.items.values():
                if item.state == "alarm":
                    self.operator_retry(item.id)
            self.tick(self.past_every_wait() - self.clock[0])
            self.relay_pass(None, None)
            self.stores_match_the_model()
            if all(item.state == "sent" for item in self.model.items.values()):
                break
        order = [item.id for item in sorted(self.model.items.values(), key=lambda item: item.seq)]
        effects = self.run(read_stores(self.stores))["effects"]
        assert effects == order, f"after the drain: effects {effects}, items {order}"


class PostgresRelayMachine(RelayMachine):
    Stores = PostgresStores


MACHINES = {"sqlite": (RelayMachine, 1), "postgresql": (PostgresRelayMachine, 3)}


# A passing run takes ~20 s on SQLite; a failing one shrinks for up to Hypothesis's own five minutes (a pytest timeout
# raised into that would end it with a FlakyFailure instead).
@pytest.mark.timeout(420)
@pytest.mark.parametrize("driver", sorted(MACHINES))
def test_outbox_relay_inbox_match_their_model(driver: str, request: pytest.FixtureRequest) -> None:
    machine, share = MACHINES[driver]
    examples = int(os.environ.get("ASYNCQ_MODEL_RELAY_EXAMPLES", "150")) // share
    if driver == "postgresql":
        request.getfixturevalue("postgres_database")
        examples = int(os.environ.get("ASYNCQ_MODEL_RELAY_PG_EXAMPLES", str(examples)))
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=max(1, examples),
            stateful_step_count=int(os.environ.get("ASYNCQ_MODEL_RELAY_STEPS", "40")),
            deadline=None,
            print_blob=True,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
