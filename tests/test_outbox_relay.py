"""The product outbox and its relay on each store (real SQLite files; schemas of the real PostgreSQL server), a real
inbox receiver on loopback on the same store, and real child processes (restarted relays, a relay SIGKILLed in the
middle of a delivery). ``messaging_support.place`` says where the stores live; the SQLite driver's own cases (its
``add_sync``, a file locked by another process) run on SQLite only."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from messaging_support import Place
from waiting import eventually

from asyncq.delivery.fake import Delivery, FakeTransport
from asyncq.delivery.http import HttpTransport
from asyncq.errors import Conflict, Permanent, Retryable
from asyncq.inbox import EffectTransaction, make_inbox_app
from asyncq.outbox import Outbox, ReceiverFigures, Relay
from asyncq.sqlite import add_sync
from asyncq.store.port.outbox import Lease, Step
from asyncq.worker.context import RetryPolicy

pytestmark = pytest.mark.timeout(30)

CHILD = Path(__file__).resolve().parent / "relay_children.py"
STEADY = RetryPolicy(base=0.1, cap=1, jitter=lambda: 1.0)  # backoff 100, 200, 400 … ms


class Clock:
    """An injected clock in ms that only the test moves."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Receiver:
    """What the inbox's effect saw: the ids applied in order, and ids made to fail (500 or, for Permanent, 422).
    ``hold`` ids: their first request waits until ``release`` is set, then answers 503 without applying."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.requests: list[str] = []
        self.poison: dict[str, type[Exception]] = {}
        self.hold: set[str] = set()
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()

    def effect(self, tx: EffectTransaction, event_id: str, body: Any) -> None:
        if event_id in self.poison:
            raise self.poison[event_id](f"{event_id} is poison")
        self.applied.append(event_id)

    @web.middleware
    async def gate(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
        key = request.headers.get("Idempotency-Key", "")
        if request.method == "POST":
            self.requests.append(key)
        if key in self.hold:
            self.hold.discard(key)
            self.arrived.set()
            await self.release.wait()
            return web.json_response({"id": key, "status": "held"}, status=503)
        return await handler(request)


@asynccontextmanager
async def running_inbox(db: Path | str, receiver: Receiver) -> AsyncIterator[str]:
    app = make_inbox_app(db, effect=receiver.effect)
    app.middlewares.append(receiver.gate)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/events"
    finally:
        receiver.release.set()
        await runner.cleanup()


def file_rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    """Read a SQLite file through an independent connection."""
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


#: An app's statement in each store's dialect.
ADD_ORDER = {"sqlite": "INSERT INTO orders VALUES (?, ?)", "postgresql": "INSERT INTO orders VALUES ($1, $2)"}


async def item(place: Place, item_id: str) -> dict[str, Any]:
    """A stored item's changing columns (read through the port)."""
    [found] = await place.items([item_id])
    return {name: getattr(found, name) for name in ("state", "attempts", "last_error", "next_attempt_at", "sent_at")}


async def states(place: Place, ids: Iterable[str]) -> list[tuple[str, str]]:
    """``(id, state)`` of each of these ids that is stored, in ``seq`` order."""
    return [(found.id, found.state) for found in await place.items(ids)]


async def lease_row(place: Place) -> tuple[str | None, int]:
    figures = await place.figures()
    return figures.lease_owner, figures.lease_token


async def child(mode: str, config: dict[str, Any], cwd: Path) -> list[dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        mode,
        json.dumps(config),
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines()]


async def line(proc: asyncio.subprocess.Process, want: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The child's next JSON line that ``want``s, within a deadline."""
    assert proc.stdout is not None
    async with asyncio.timeout(15):
        while True:
            raw = await proc.stdout.readline()
            assert raw, f"child {proc.pid} ended"
            found: dict[str, Any] = json.loads(raw)
            if want(found):
                return found


@pytest.fixture
def clock() -> Clock:
    return Clock()


# --- adding: atomic with the app's rows --------------------------------------------------------------------------


async def test_items_commit_and_roll_back_with_the_apps_rows(place: Place, clock: Clock) -> None:
    async with await Outbox.open(place.outbox, clock=clock) as outbox:
        async with outbox.transaction() as tx:
            await tx.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, qty INTEGER NOT NULL)")
        with pytest.raises(RuntimeError):
            async with outbox.transaction() as tx:
                await tx.execute(ADD_ORDER[place.dialect], ("o-1", 1))
                assert await tx.add("o-1", {"qty": 1, "item": "snack"}, topic="orders")
                raise RuntimeError("the app fails after both writes")
        assert await place.app_rows(place.outbox, "SELECT * FROM orders") == [] and await states(place, ["o-1"]) == []

        async with outbox.transaction() as tx:
            await tx.execute(ADD_ORDER[place.dialect], ("o-1", 1))
            assert await tx.add("o-1", {"qty": 1, "item": "snack"}, topic="orders")
        assert await outbox.add("o-1", {"item": "snack", "qty": 1}, topic="orders") is False  # same canonical body
        with pytest.raises(Conflict):
            await outbox.add("o-1", {"qty": 2, "item": "snack"}, topic="orders")
        with pytest.raises(Conflict):
            await outbox.add("o-1", {"qty": 1, "item": "snack"})  # another topic
        with pytest.raises(Conflict):  # a conflict inside the app's transaction rolls its rows back too
            async with outbox.transaction() as tx:
                await tx.execute(ADD_ORDER[place.dialect], ("o-2", 2))
                await tx.add("o-1", {"qty": 9})
        for bad in ("", "o 1", "x" * 65):
            with pytest.raises(ValueError):
                await outbox.add(bad, {})
        with pytest.raises(ValueError):
            await outbox.add("o-3", {"qty": float("nan")})
        found = await outbox.get("o-1")
        assert found is not None and (found.state, found.attempts, found.created_at) == ("unsent", 0, clock.now)
    assert await place.app_rows(place.outbox, "SELECT * FROM orders") == [("o-1", 1)]
    assert await states(place, ["o-1", "o-2", "o-3"]) == [("o-1", "unsent")]


async def test_add_sync_joins_the_callers_sqlite3_transaction(tmp_path: Path, clock: Clock) -> None:
    db = tmp_path / "app.db"
    con = sqlite3.connect(db, isolation_level=None)
    try:
        con.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO orders VALUES ('o-1')")
        assert add_sync(con, "o-1", {"qty": 1}, now_ms=5)
        con.execute("ROLLBACK")
        assert file_rows(db, "SELECT * FROM orders") == []
        assert file_rows(db, "SELECT name FROM sqlite_master WHERE name = 'asyncq_outbox'") == []  # rolled back too
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO orders VALUES ('o-1')")
        assert add_sync(con, "o-1", {"qty": 1}, now_ms=5)
        con.execute("COMMIT")
        assert add_sync(con, "o-1", {"qty": 1}) is False and not con.in_transaction  # its own transaction
        with pytest.raises(Conflict):
            add_sync(con, "o-1", {"qty": 2})
    finally:
        con.close()
    async with await Outbox.open(str(db), clock=clock) as outbox:
        transport = FakeTransport()
        assert (await Relay(outbox, transport).run_once()).sent == 1
        assert transport.delivered_ids() == ["o-1"] and transport.delivered[0].body == {"qty": 1}


# --- order, backoff, alarm ---------------------------------------------------------------------------------------


async def test_a_failing_middle_item_holds_back_the_ones_behind_it(place: Place, clock: Clock) -> None:
    receiver = Receiver()
    receiver.poison["B"] = RuntimeError  # the receiver answers 500: Retryable
    async with running_inbox(place.inbox, receiver) as url, await Outbox.open(place.outbox, clock=clock) as outbox:
        for item_id in "ABC":
            await outbox.add(item_id, {"qty": 1})
        transport = HttpTransport(url, timeout=5)
        relay = Relay(outbox, transport, retry=STEADY, alarm_after=3)
        try:
            first = await relay.run_once()
            assert (first.sent, first.stopped, first.head_id, first.wait_ms) == (1, "failed", "B", 100)
            assert "Retryable" in (first.error or "")
            assert await states(place, "ABC") == [("A", "sent"), ("B", "unsent"), ("C", "unsent")]
            assert (await item(place, "B"))["attempts"] == 1
            assert (await item(place, "B"))["next_attempt_at"] == clock.now + 100
            assert (await item(place, "C"))["attempts"] == 0

            waiting = await relay.run_once()  # not due yet: nothing is sent, B is not tried
            assert (waiting.sent, waiting.stopped, waiting.wait_ms) == (0, "backoff", 100)
            assert receiver.requests == ["A", "B"]

            clock.now += 100
            assert (await relay.run_once()).wait_ms == 200  # capped exponential backoff
            clock.now += 200
            del receiver.poison["B"]
            done = await relay.run_once()
            assert (done.sent, done.stopped) == (2, "idle")
        finally:
            await transport.close()
    assert receiver.applied == ["A", "B", "C"]  # the order of the first successful deliveries
    assert await place.inbox_ids_in_insertion_order() == ["A", "B", "C"]
    assert receiver.requests == ["A", "B", "B", "B", "C"] and (await item(place, "B"))["attempts"] == 3


async def seed(place: Place, ids: str) -> None:
    """Items added by another program before the relays start (on SQLite through its own ``sqlite3`` connection)."""
    if place.postgres:
        async with await Outbox.open(place.outbox) as outbox:
            for item_id in ids:
                await outbox.add(item_id, {"qty": 1})
        return
    con = sqlite3.connect(place.outbox, isolation_level=None)
    for item_id in ids:
        add_sync(con, item_id, {"qty": 1})
    con.close()


async def test_alarm_and_attempts_survive_a_restart_and_nothing_behind_moves(place: Place, tmp_path: Path) -> None:
    receiver = Receiver()
    receiver.poison["B"] = RuntimeError
    await seed(place, "ABC")
    async with running_inbox(place.inbox, receiver) as url:
        config = {"db": place.outbox, "url": url, "alarm_after": 3}
        passes = await child("until-alarm", config, tmp_path)
        assert [(p["stopped"], p["sent"]) for p in passes] == [("failed", 1), ("failed", 0), ("alarm", 0)]
        stored = await item(place, "B")
        assert (stored["state"], stored["attempts"]) == ("alarm", 3) and "Retryable" in stored["last_error"]

        restarted = await child("once", config, tmp_path)  # a new process reads the alarm from the file
        [result, figures] = restarted
        assert (result["stopped"], result["sent"], result["head_id"]) == ("alarm", 0, "B")
        assert (figures["alarm"], figures["head_id"], figures["head_attempts"], figures["unsent"]) == (True, "B", 3, 2)
        assert receiver.requests == ["A", "B", "B", "B"] and (await item(place, "C"))["attempts"] == 0

        del receiver.poison["B"]
        async with await Outbox.open(place.outbox) as outbox:
            entry = await outbox.retry("B", "INC-7: receiver fixed")
            assert (entry.action, entry.from_state, entry.attempts, entry.skipped_ahead_of) == ("retry", "alarm", 3, [])
            with pytest.raises(ValueError):
                await outbox.retry("A", "it is sent")  # only alarm or unsent items
        [result, figures] = await child("once", config, tmp_path)
        assert (result["stopped"], result["sent"]) == ("idle", 2) and figures["unsent"] == 0
    assert receiver.applied == ["A", "B", "C"] and (await item(place, "B"))["attempts"] == 4


async def test_a_fresh_budget_after_retry_and_one_warning_per_state_change(
    place: Place, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncq.outbox")
    async with await Outbox.open(place.outbox, clock=clock) as outbox:
        await outbox.add("A", {"qty": 1})
        transport = FakeTransport()
        transport.fail_always("A", Retryable("busy"))
        relay = Relay(outbox, transport, retry=STEADY, alarm_after=2)
        for _ in range(2):
            result = await relay.run_once()
            clock.now += result.wait_ms
        assert result.stopped == "alarm"
        for _ in range(5):
            assert (await relay.run_once()).stopped == "alarm"  # polled, not retried
        assert len(transport.attempts) == 2
        warnings = [r for r in caplog.records if r.name == "asyncq.outbox" and r.levelno == logging.WARNING]
        assert len(warnings) == 2  # the first failure, then the alarm: not once per poll

        await outbox.retry("A", "try again")
        assert (await relay.run_once()).stopped == "failed"  # a fresh budget of 2, attempts kept (3)
        clock.now += 1000
        assert (await relay.run_once()).stopped == "alarm"
        assert (await outbox.get("A")).attempts == 4  # type: ignore[union-attr]


async def test_quarantine_records_reason_and_the_items_that_now_go_first(place: Place, clock: Clock) -> None:
    receiver = Receiver()
    receiver.poison["B"] = Permanent  # 422: no retry can help, so the alarm comes at once
    async with running_inbox(place.inbox, receiver) as url, await Outbox.open(place.outbox, clock=clock) as outbox:
        for item_id in "ABCD":
            await outbox.add(item_id, {"qty": 1})
        transport = HttpTransport(url, timeout=5)
        relay = Relay(outbox, transport, retry=STEADY, alarm_after=5)
        try:
            result = await relay.run_once()
            assert (result.sent, result.stopped, result.head_id) == (1, "alarm", "B")
            assert "Permanent" in (result.error or "") and (await item(place, "B"))["attempts"] == 1

            entry = await outbox.quarantine("B", reason="the receiver refuses this body (422)", note="INC-42")
            assert (entry.action, entry.from_state, entry.reason, entry.note) == (
                "quarantine",
                "alarm",
                "the receiver refuses this body (422)",
                "INC-42",
            )
            assert (entry.skipped_ahead_of, entry.skipped_count) == (["C", "D"], 2)
            assert "Permanent" in (entry.last_error or "")
            figures = await outbox.figures()
            assert (figures.unsent, figures.quarantined, figures.head_id, figures.alarm) == (2, 1, "C", False)

            assert (await relay.run_once()).sent == 2  # C and D overtake B, as recorded
            with pytest.raises(ValueError):
                await outbox.quarantine("C", reason="sent already", note="no")
            del receiver.poison["B"]
            requeued = await outbox.requeue("B", note="INC-42 fixed")
            assert (requeued.from_state, requeued.skipped_ahead_of, requeued.skipped_count) == (
                "quarantined",
                ["C", "D"],
                2,
            )
            assert (await relay.run_once()).sent == 1
        finally:
            await transport.close()
        assert [e.action for e in await outbox.audit("B")] == ["quarantine", "requeue"]
    assert receiver.applied == ["A", "C", "D", "B"]
    assert await states(place, "ABCD") == [("A", "sent"), ("B", "sent"), ("C", "sent"), ("D", "sent")]
    async with place.outbox_store() as store:
        [quarantined] = [entry for entry in await store.audit(None) if entry.action == "quarantine"]
    assert (quarantined.reason, quarantined.skipped_ahead_of) == ("the receiver refuses this body (422)", ["C", "D"])


# --- one relay per outbox: the fenced lease ----------------------------------------------------------------------


async def test_a_relay_that_lost_its_lease_can_never_mark_sent(place: Place, clock: Clock) -> None:
    db = place.outbox
    async with await Outbox.open(db, clock=clock) as first_box, await Outbox.open(db, clock=clock) as second_box:
        await first_box.add("A", {"qty": 1})
        entered, release = asyncio.Event(), asyncio.Event()

        async def hold(delivery: Delivery) -> None:
            entered.set()
            await release.wait()

        first = Relay(first_box, FakeTransport(hook=hold), owner="first", lease_ms=60_000)
        second_transport = FakeTransport()
        second_transport.fail("A", Retryable("busy"))
        second = Relay(second_box, second_transport, owner="second", lease_ms=60_000, retry=STEADY)
        in_flight = asyncio.create_task(first.run_once())
        await entered.wait()

        waiting = await second.run_once()
        assert (waiting.stopped, waiting.token, waiting.wait_ms) == ("not-leader", 1, 60_000)
        clock.now += 60_000  # the first relay's lease expires while it is still delivering
        took_over = await second.run_once()
        assert (took_over.stopped, took_over.token) == ("failed", 2)

        release.set()  # the first relay gets its ACK now, with a stale token
        late = await in_flight
        assert (late.stopped, late.sent) == ("lease-lost", 0)
        stored = await item(place, "A")
        assert (stored["state"], stored["attempts"], stored["sent_at"]) == ("unsent", 2, None)
        assert "busy" in stored["last_error"]  # what the current holder recorded, nothing from the stale one

        stale = Lease("first", 1, None)
        step = await first_box.store.advance(stale, clock.now, 60_000, 1, None)
        assert step == Step(None, marked=False, started=False)
        assert (await item(place, "A"))["state"] == "unsent"
        assert (await first.run_once()).stopped == "not-leader"  # it does not get the lease back either
        clock.now += took_over.wait_ms
        assert (await second.run_once()).sent == 1


async def test_a_second_relay_waits_and_takes_over_when_the_first_is_killed(place: Place, tmp_path: Path) -> None:
    receiver = Receiver()
    receiver.hold.add("A")  # the first request for A is held until the test says so
    async with await Outbox.open(place.outbox) as outbox:
        for item_id in "ABC":
            await outbox.add(item_id, {"qty": 1})
    procs: list[asyncio.subprocess.Process] = []

    async def start(owner: str) -> asyncio.subprocess.Process:
        config = {"db": place.outbox, "url": url, "owner": owner, "lease_ms": 1500}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), "run", json.dumps(config), cwd=tmp_path, stdout=asyncio.subprocess.PIPE
        )
        procs.append(proc)
        return proc

    async with running_inbox(place.inbox, receiver) as url:
        try:
            first = await start("first")
            await asyncio.wait_for(receiver.arrived.wait(), 15)  # the first relay is inside its delivery of A
            second = await start("second")
            for _ in range(2):  # it keeps waiting while the first renews its lease
                assert (await line(second, lambda p: True))["stopped"] == "not-leader"
            assert receiver.requests == ["A"] and receiver.applied == []
            assert await lease_row(place) == ("first", 1)

            first.kill()  # SIGKILL, in the middle of the delivery
            assert await first.wait() == -signal.SIGKILL
            took_over = await line(second, lambda p: p["stopped"] != "not-leader")
            assert (took_over["token"], took_over["sent"]) == (2, 3)
            assert await lease_row(place) == ("second", 2)

            second.send_signal(signal.SIGTERM)  # a graceful stop releases the lease
            assert await asyncio.wait_for(second.wait(), 15) == 0
        finally:
            for proc in procs:
                if proc.returncode is None:
                    os.kill(proc.pid, signal.SIGKILL)
                    await proc.wait()
    assert receiver.applied == ["A", "B", "C"] and receiver.requests == ["A", "A", "B", "C"]
    assert await lease_row(place) == (None, 2)
    assert await states(place, "ABC") == [("A", "sent"), ("B", "sent"), ("C", "sent")]


async def test_run_wakes_on_adds_and_stops_gracefully(place: Place) -> None:
    async with await Outbox.open(place.outbox) as outbox:
        transport = FakeTransport()
        relay = Relay(outbox, transport, poll_ms=60_000)  # only a wake-up can make it look again
        running = asyncio.create_task(relay.run())
        await outbox.add("A", {"qty": 1})
        async with outbox.transaction() as tx:
            await tx.add("B", {"qty": 2})
        await eventually(lambda: transport.delivered_ids() == ["A", "B"], "A and B delivered")
        relay.stop()
        await asyncio.wait_for(running, 10)
        figures = await outbox.figures()
        assert (figures.unsent, figures.lease_owner, figures.lease_token) == (0, None, 1)


async def test_run_wakes_on_another_processs_adds_to_the_file(tmp_path: Path) -> None:
    """SQLite: the relay's wait is the file's watcher, so another process's commit of an item wakes it (a commit to
    the app's other tables does not need to: it leaves no unsent item). PostgreSQL's: ``test_relay_wakeups``."""
    db = tmp_path / "app.db"
    code = (
        "import sqlite3, sys\n"
        "from asyncq.sqlite import add_sync\n"
        "con = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "assert add_sync(con, sys.argv[2], {'qty': 1})\n"
        "con.close()\n"
    )
    async with await Outbox.open(str(db)) as outbox:
        transport = FakeTransport()
        relay = Relay(outbox, transport, poll_ms=60_000)  # only a wake-up can make it look again
        running = asyncio.create_task(relay.run())
        try:
            proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, str(db), "elsewhere")
            assert await proc.wait() == 0
            async with asyncio.timeout(10):
                while transport.delivered_ids() != ["elsewhere"]:
                    await asyncio.sleep(0.01)
        finally:
            relay.stop()
            await asyncio.wait_for(running, 10)


# --- the operator's figures --------------------------------------------------------------------------------------


async def test_figures_show_backlog_age_head_attempts_and_the_receivers_counts(place: Place, clock: Clock) -> None:
    receiver = Receiver()
    async with (
        running_inbox(place.inbox, receiver) as url,
        await Outbox.open(place.outbox, clock=clock) as outbox,
    ):
        direct = HttpTransport(url, timeout=5)
        await direct.deliver("A", {"qty": 1}, {})  # another publisher got A there first: a duplicate later
        await direct.deliver("K", {"qty": 2}, {})  # K is known with another body: a conflict later
        await direct.close()
        start = clock.now
        for item_id in ("A", "K", "Z"):
            await outbox.add(item_id, {"qty": 1})
            clock.now += 500
        clock.now = start + 4000
        transport = HttpTransport(url, timeout=5)
        relay = Relay(outbox, transport, stats_url=url + "/stats", owner="relay-1")
        try:
            before = await relay.figures()
            assert (before.unsent, before.oldest_unsent_age_ms, before.head_id, before.head_attempts) == (
                3,
                4000,
                "A",
                0,
            )
            assert before.receiver == ReceiverFigures(applied=2, duplicates=0, conflicts=0)

            result = await relay.run_once()
            assert (result.sent, result.stopped, result.head_id) == (1, "alarm", "K")  # 409 is Permanent
            after = await relay.figures()
        finally:
            await transport.close()
    assert (after.unsent, after.oldest_unsent_age_ms, after.alarmed, after.quarantined) == (2, 3500, 1, 0)
    assert (after.alarm, after.head_id, after.head_state, after.head_attempts) == (True, "K", "alarm", 1)
    assert "409" in (after.head_last_error or "")
    assert (after.lease_owner, after.lease_token) == ("relay-1", 1)
    assert after.receiver == ReceiverFigures(applied=2, duplicates=1, conflicts=1)

    async with await Outbox.open(place.outbox, clock=clock) as reopened:
        figures = await Relay(reopened, FakeTransport(), stats_url=url + "/stats").figures()  # the receiver is gone
    assert figures.receiver is None and figures.receiver_error is not None and figures.unsent == 2


async def test_run_rides_out_a_store_held_by_another_process(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Another connection holds the file's write lock: each pass fails with the store's busy error, which the
    loop logs and waits out (nothing is delivered meanwhile); once the lock is gone, the item goes."""
    db = tmp_path / "app.db"
    caplog.set_level(logging.WARNING, logger="asyncq.outbox")
    async with await Outbox.open(str(db), busy_timeout=0.02) as outbox:
        await outbox.add("A", {"qty": 1})
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        transport = FakeTransport()
        relay = Relay(outbox, transport, poll_ms=20)
        running = asyncio.create_task(relay.run())
        try:
            await eventually(
                lambda: sum("locked" in r.getMessage() for r in caplog.records) >= 2,
                "two passes of the relay to log the locked file",
            )
            assert transport.delivered_ids() == [] and not running.done()
            blocker.execute("ROLLBACK")
            await eventually(lambda: transport.delivered_ids() == ["A"], "A delivered once the lock is gone")
        finally:
            blocker.close()
            relay.stop()
            await asyncio.wait_for(running, 10)
    assert file_rows(db, "SELECT id, state FROM asyncq_outbox ORDER BY seq") == [("A", "sent")]


async def test_a_transaction_is_usable_only_inside_its_block(place: Place, clock: Clock) -> None:
    db = place.outbox
    async with await Outbox.open(db, clock=clock) as outbox:
        with pytest.raises(RuntimeError, match="refused"):
            async with outbox.transaction() as tx:
                await tx.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
                await tx.execute("COMMIT")  # refused before it runs: nothing is committed early
        assert not await place.has_table(db, "orders")
        async with outbox.transaction() as tx:
            await tx.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
            with pytest.raises(RuntimeError, match="holds an open transaction"):
                await outbox.add("A", {})  # would wait for its own block forever
            with pytest.raises(RuntimeError, match="refused"):
                await tx.execute("ROLLBACK")  # caught by the app: the block is still whole and commits
            await tx.add("A", {"qty": 1})
        assert await place.has_table(db, "orders")
        with pytest.raises(RuntimeError, match="block has ended"):
            await tx.add("B", {"qty": 1})
        with pytest.raises(RuntimeError, match="block has ended"):
            await tx.execute("SELECT 1")
        with pytest.raises(ValueError):
            await Outbox.open(db, durability="fast")
    assert await states(place, "AB") == [("A", "unsent")]
