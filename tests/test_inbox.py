"""The inbox receiver on each store (a real SQLite file; a schema of the real PostgreSQL server: the ``place``
fixture's inbox), a real loopback aiohttp server, and as a real subprocess. What only SQLite has (its journal
settings, its ``:name`` parameters, its transaction grammar) is tested on SQLite; PostgreSQL's counterparts beside
it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from drivers import POSTGRESQL
from messaging_support import Place, write_lock_is_held
from multidict import CIMultiDict
from postgres_support import fresh_schema

from asyncq.delivery.http import HttpTransport
from asyncq.errors import Conflict, Permanent
from asyncq.inbox import INBOX_KEY, STOCK_TABLES, Effect, EffectTransaction, Inbox, add_to_stock, make_inbox_app
from asyncq.store.sqlite.effects import ends_transaction

pytestmark = pytest.mark.timeout(20)


@asynccontextmanager
async def running_inbox(
    db: Path | str, effect: Effect | None = add_to_stock, **options: Any
) -> AsyncIterator[tuple[str, Inbox]]:
    app = make_inbox_app(db, effect=effect, ddl=STOCK_TABLES, **options)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}{options.get('path', '/events')}", app[INBOX_KEY]
    finally:
        await runner.cleanup()


async def dump(place: Place) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows of the inbox's store, read through an independent connection."""
    return await place.tables(place.inbox)


async def stock(place: Place) -> int:
    found = (await dump(place))["stock"]
    return int(found[0][1]) if found else 0


async def post(session: aiohttp.ClientSession, url: str, data: Any, headers: Any = None) -> tuple[int, dict[str, Any]]:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    async with session.post(url, data=raw, headers=headers) as response:
        return response.status, await response.json()


async def test_fifty_simultaneous_posts_of_one_id_apply_once(place: Place) -> None:
    calls: list[str] = []

    def counting(tx: EffectTransaction, event_id: str, body: Any) -> None:
        calls.append(event_id)
        add_to_stock(tx, event_id, body)

    db = place.inbox
    async with running_inbox(db, counting) as (url, inbox), aiohttp.ClientSession() as session:
        answers = await asyncio.gather(*(post(session, url, {"id": "evt-1", "qty": 7}) for _ in range(50)))
        assert inbox.counters.applied == 1 and inbox.counters.duplicates == 49
        assert await inbox.totals() == {"applied": 1, "duplicates": 49, "conflicts": 0}
    assert {status for status, _ in answers} == {200}
    statuses = sorted(answer["status"] for _, answer in answers)
    assert statuses == ["applied"] + ["duplicate"] * 49
    assert all(answer["id"] == "evt-1" for _, answer in answers)
    assert calls == ["evt-1"]
    [(event_id, body, _, duplicates, conflicts)] = (await dump(place))["asyncq_inbox"]
    assert (event_id, json.loads(body), duplicates, conflicts) == ("evt-1", {"id": "evt-1", "qty": 7}, 49, 0)
    assert (await dump(place))["stock"] == [("snack", 7)]


async def test_distinct_ids_are_each_applied(place: Place) -> None:
    db = place.inbox
    async with running_inbox(db) as (url, _), aiohttp.ClientSession() as session:
        answers = await asyncio.gather(*(post(session, url, {"id": f"e-{i}", "qty": 1}) for i in range(30)))
    assert all(answer["status"] == "applied" for _, answer in answers)
    assert await stock(place) == 30 and len((await dump(place))["asyncq_inbox"]) == 30


MALFORMED = {
    "not-json": (b"not json", None),
    "empty": (b"", None),
    "array": (b'[{"id": "e-2"}]', None),
    "string": (b'"e-2"', None),
    "missing-id": (b'{"qty": 1}', None),
    "bad-id": (b'{"id": "bad id", "qty": 1}', None),
    "long-id": (json.dumps({"id": "x" * 65, "qty": 1}).encode(), None),
    "number-id": (b'{"id": 5, "qty": 1}', None),
    "null-id": (b'{"id": null, "qty": 1}', None),
    "invalid-utf8": (b'{"id": "e-2", "note": "\xff\xfe"}', None),
    "bom": (b'\xef\xbb\xbf{"id": "e-2", "qty": 1}', None),
    "repeated-key": (b'{"id": "e-2", "id": "e-3", "qty": 1}', None),
    "nan": (b'{"id": "e-2", "qty": NaN}', None),
    "trailing-data": (b'{"id": "e-2", "qty": 1} {}', None),
    "deep": (b"[" * 30_000 + b"]" * 30_000, None),
    "huge-int": (b'{"id": "e-2", "qty": ' + b"9" * 5000 + b"}", None),
    "bad-key-header": (b'{"qty": 1}', CIMultiDict({"Idempotency-Key": "bad key"})),
    "key-differs": (b'{"id": "e-2", "qty": 1}', CIMultiDict({"Idempotency-Key": "e-3"})),
    "two-keys": (b"{}", CIMultiDict([("Idempotency-Key", "e-2"), ("Idempotency-Key", "e-2")])),
    "key-but-not-json": (b"{", CIMultiDict({"Idempotency-Key": "e-2"})),
}


@pytest.mark.parametrize(("raw", "headers"), list(MALFORMED.values()), ids=list(MALFORMED))
async def test_malformed_requests_are_400_and_change_nothing(
    place: Place, raw: bytes, headers: CIMultiDict[str] | None
) -> None:
    db = place.inbox
    async with running_inbox(db) as (url, inbox), aiohttp.ClientSession() as session:
        assert await post(session, url, {"id": "e-1", "qty": 2}) == (200, {"id": "e-1", "status": "applied"})
        before = await dump(place)
        status, answer = await post(session, url, raw, headers)
        assert status == 400 and "error" in answer
        assert await dump(place) == before
        assert inbox.counters.rejected == 1


async def test_same_id_other_body_is_a_409_and_changes_no_effect(place: Place) -> None:
    db = place.inbox
    async with running_inbox(db) as (url, inbox), aiohttp.ClientSession() as session:
        assert (await post(session, url, {"id": "e-1", "qty": 2}))[0] == 200
        assert await post(session, url, {"id": "e-1", "qty": 3}) == (409, {"id": "e-1", "status": "conflict"})
        assert await post(session, url, {"id": "e-1", "qty": 2}) == (200, {"id": "e-1", "status": "duplicate"})
        assert inbox.counters.conflicts == 1
    assert await stock(place) == 2
    assert [row[3:] for row in (await dump(place))["asyncq_inbox"]] == [(1, 1)]


async def test_key_order_and_whitespace_do_not_make_another_body(place: Place) -> None:
    db = place.inbox
    async with running_inbox(db) as (url, _), aiohttp.ClientSession() as session:
        assert (await post(session, url, b'{"id":"e-1","qty":2,"tags":{"b":1,"a":2}}'))[1]["status"] == "applied"
        again = b'{ "tags" : { "a" : 2, "b" : 1 }, "qty" : 2, "id" : "e-1" }'
        assert await post(session, url, again) == (200, {"id": "e-1", "status": "duplicate"})
        assert (await post(session, url, b'{"id":"e-1","qty":2.0,"tags":{"b":1,"a":2}}'))[0] == 409
    assert await stock(place) == 2


async def test_the_id_may_come_from_the_idempotency_key_header(place: Place) -> None:
    db = place.inbox
    async with running_inbox(db, effect=None) as (url, _), aiohttp.ClientSession() as session:
        key = {"Idempotency-Key": "job-9"}
        assert await post(session, url, [1, 2, 3], key) == (200, {"id": "job-9", "status": "applied"})
        assert await post(session, url, [1, 2, 3], key) == (200, {"id": "job-9", "status": "duplicate"})
        assert (await post(session, url, {"id": "job-8", "qty": 1}, {"Idempotency-Key": "job-8"}))[0] == 200
    assert [(row[0], row[1]) for row in (await dump(place))["asyncq_inbox"]] == [
        ("job-8", '{"id":"job-8","qty":1}'),
        ("job-9", "[1,2,3]"),
    ]


async def chunks(total: int) -> AsyncIterator[bytes]:
    yield b'{"id": "e-2", "pad": "'
    sent = 0
    while sent < total:
        yield b"x" * 8192
        sent += 8192
    yield b'"}'


async def test_oversized_bodies_are_413_by_header_and_while_reading(place: Place) -> None:
    db = place.inbox
    async with running_inbox(db, max_body_bytes=65536) as (url, inbox), aiohttp.ClientSession() as session:
        assert (await post(session, url, {"id": "e-1", "qty": 1}))[0] == 200
        before = await dump(place)
        big = json.dumps({"id": "e-2", "qty": 1, "pad": "x" * 70_000}).encode()
        assert (await post(session, url, big))[0] == 413
        async with session.post(url, data=chunks(70_000)) as response:  # chunked: no Content-Length
            assert response.status == 413
        assert await dump(place) == before
        assert inbox.counters.rejected == 2
        pad = 65536 - len(json.dumps({"id": "e-3", "qty": 1, "pad": ""}))
        exact = json.dumps({"id": "e-3", "qty": 1, "pad": "x" * pad}).encode()
        assert len(exact) == 65536
        assert (await post(session, url, exact))[0] == 200


async def test_effect_errors_roll_back_everything(place: Place) -> None:
    db = place.inbox

    def broken(tx: EffectTransaction, event_id: str, body: Any) -> None:
        add_to_stock(tx, event_id, body)
        raise RuntimeError("disk on fire")

    async with running_inbox(db) as (url, inbox), aiohttp.ClientSession() as session:
        assert (await post(session, url, {"id": "e-1", "qty": 1}))[0] == 200
        before = await dump(place)
        status, answer = await post(session, url, {"id": "e-2", "qty": 0})  # add_to_stock: Permanent
        assert (status, answer["status"]) == (422, "refused")
        assert await dump(place) == before
    async with running_inbox(db, broken) as (url, inbox), aiohttp.ClientSession() as session:
        assert await post(session, url, {"id": "e-3", "qty": 1}) == (500, {"id": "e-3", "status": "failed"})
        assert inbox.counters.failed == 1
    assert await dump(place) == before


async def test_counts_survive_a_restart_and_are_served(place: Place) -> None:
    db = place.inbox
    async with running_inbox(db) as (url, _), aiohttp.ClientSession() as session:
        for body in ({"id": "e-1", "qty": 1}, {"id": "e-1", "qty": 1}, {"id": "e-1", "qty": 5}, {"id": "e-2"}):
            await post(session, url, body)
    async with running_inbox(db) as (url, _), aiohttp.ClientSession() as session:
        async with session.get(url + "/stats") as response:
            stats = await response.json()
        async with session.get(url) as response:
            assert response.status == 405
    assert stats["table"] == {"applied": 1, "duplicates": 1, "conflicts": 1}
    assert stats["since_start"] == {
        "applied": 0,
        "duplicates": 0,
        "conflicts": 0,
        "rejected": 0,
        "failed": 0,
        "commits": 0,
    }


async def test_events_waiting_together_share_one_commit(place: Place) -> None:
    """The group commit: events that arrive while the writer is busy (here: all at once, before it runs) are
    written in one transaction; an event alone gets a commit of its own. ``commits`` counts them."""
    db = place.inbox
    async with Inbox(db, effect=add_to_stock, ddl=STOCK_TABLES) as inbox:
        outcomes = await asyncio.gather(*(inbox.receive(f"e-{i}", {"qty": 1}) for i in range(40)))
        assert outcomes == ["applied"] * 40 and inbox.counters.commits == 1
        assert await inbox.receive("e-0", {"qty": 1}) == "duplicate" and inbox.counters.commits == 2
        with pytest.raises(ValueError):
            await inbox.receive("bad id", {"qty": 1})
        assert inbox.counters.commits == 2  # refused before it reached the writer
    assert await stock(place) == 40 and len((await dump(place))["asyncq_inbox"]) == 40


async def test_the_effect_runs_inside_a_durable_write_transaction(tmp_path: Path) -> None:
    seen: list[tuple[bool, str, int]] = []

    def probe(tx: EffectTransaction, event_id: str, body: Any) -> None:
        [(mode,)] = tx.execute("PRAGMA journal_mode")
        [(synchronous,)] = tx.execute("PRAGMA synchronous")
        seen.append((write_lock_is_held(tmp_path / "sink.db"), mode, synchronous))

    assert not write_lock_is_held(tmp_path / "free.db")
    async with Inbox(tmp_path / "sink.db", effect=probe, clock=lambda: 1234) as inbox:
        assert await inbox.receive("e-1", {"qty": 1}) == "applied"
        assert await inbox.receive("e-1", {"qty": 1}) == "duplicate"
        with pytest.raises(Conflict):
            await inbox.receive("e-1", {"qty": 2})
        with pytest.raises(ValueError):
            await inbox.receive("bad id", {})
        with pytest.raises(ValueError):
            await inbox.receive("e-2", {"qty": float("inf")})
    assert seen == [(True, "wal", 2)]  # 2 is FULL
    con = sqlite3.connect(tmp_path / "sink.db")
    try:
        assert con.execute("SELECT * FROM asyncq_inbox").fetchall() == [("e-1", '{"qty":1}', 1234, 1, 1)]
    finally:
        con.close()


@pytest.mark.usefixtures("postgres_database")
async def test_the_effect_runs_inside_the_inboxs_durable_transaction_on_postgresql() -> None:
    """PostgreSQL's counterpart: the effect's statements run in the batch's transaction (the inbox row is there,
    a transaction id is taken), which commits with ``synchronous_commit=on``; its thread is the inbox's own."""
    async with fresh_schema() as (url, _schema):
        await probe_the_effects_transaction(Place(POSTGRESQL, url, url))


async def probe_the_effects_transaction(place: Place) -> None:
    seen: list[tuple[Any, ...]] = []

    def probe(tx: EffectTransaction, event_id: str, body: Any) -> None:
        [(synchronous, rows, writing)] = tx.execute(
            "SELECT current_setting('synchronous_commit'), (SELECT count(*) FROM inbox WHERE id = $1),"
            " pg_current_xact_id_if_assigned() IS NOT NULL",
            (event_id,),
        )
        seen.append((synchronous, rows, writing, threading.current_thread().name.startswith("asyncq-inbox-effect")))

    async with Inbox(place.inbox, effect=probe, clock=lambda: 1234) as inbox:
        assert await inbox.receive("e-1", {"qty": 1}) == "applied"
        assert await inbox.receive("e-1", {"qty": 1}) == "duplicate"
        with pytest.raises(Conflict):
            await inbox.receive("e-1", {"qty": 2})
    assert seen == [("on", 1, True, True)]
    assert (await dump(place))["asyncq_inbox"] == [("e-1", '{"qty":1}', 1234, 1, 1)]


async def test_http_transport_against_the_inbox(place: Place) -> None:
    db = place.inbox
    async with running_inbox(db) as (url, _):
        transport = HttpTransport(url)
        await transport.deliver("job-1", {"qty": 4}, {"Asyncq-Token": "1"})
        await transport.deliver("job-1", {"qty": 4}, {"Asyncq-Token": "2"})  # a re-send: the duplicate ACK counts
        with pytest.raises(Permanent):
            await transport.deliver("job-1", {"qty": 5}, {})  # 409
        await transport.close()
    assert await stock(place) == 4


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_the_standalone_receiver_serves_until_a_stop_signal(place: Place, signum: int) -> None:
    db = place.inbox
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncq.inbox", "--db", str(db), "--port", "0", "--effect", "stock",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        url = (await asyncio.wait_for(process.stdout.readline(), 10)).decode().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/events")
        transport = HttpTransport(url)
        await transport.deliver("job-1", {"qty": 6}, {})
        await transport.close()
        process.send_signal(signum)
        assert await asyncio.wait_for(process.wait(), 10) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert await stock(place) == 6


async def test_one_failing_effect_in_a_group_commit_rolls_back_alone(place: Place) -> None:
    """Events written in one transaction: the one whose effect raises loses its row and its effect's rows (its
    savepoint), the others commit in that same transaction."""
    db = place.inbox

    def picky(tx: EffectTransaction, event_id: str, body: Any) -> None:
        add_to_stock(tx, event_id, body)
        if event_id == "e-1":
            raise RuntimeError("e-1 fails after its write")

    async with Inbox(db, effect=picky, ddl=STOCK_TABLES) as inbox:
        outcomes = await asyncio.gather(
            *(inbox.receive(f"e-{i}", {"qty": 1}) for i in range(3)), return_exceptions=True
        )
        assert inbox.counters.commits == 1 and inbox.counters.failed == 1
    assert outcomes[0] == outcomes[2] == "applied" and isinstance(outcomes[1], RuntimeError)
    assert [row[0] for row in (await dump(place))["asyncq_inbox"]] == ["e-0", "e-2"] and await stock(place) == 2


@pytest.mark.parametrize("statement", ["COMMIT", "ROLLBACK", "END", "BEGIN", " /* why */ commit", ";; -- x\nRollback"])
async def test_an_effect_cannot_end_the_inbox_transaction(place: Place, statement: str) -> None:
    """A statement that would commit half an event (or the events before it) is refused before it runs: the
    event fails alone and the events around it in the same transaction still commit."""
    db = place.inbox

    def meddling(tx: EffectTransaction, event_id: str, body: Any) -> None:
        add_to_stock(tx, event_id, body)
        if event_id == "e-1":
            tx.execute(statement)

    async with Inbox(db, effect=meddling, ddl=STOCK_TABLES) as inbox:
        assert await inbox.receive("e-0", {"qty": 1}) == "applied"
        before = await dump(place)
        outcomes = await asyncio.gather(
            inbox.receive("e-1", {"qty": 5}), inbox.receive("e-2", {"qty": 1}), return_exceptions=True
        )
        assert isinstance(outcomes[0], RuntimeError) and "refused" in str(outcomes[0])
        assert outcomes[1] == "applied" and inbox.counters.commits == 2
        assert await place.in_no_transaction(db)
    after = await dump(place)
    assert [row[0] for row in after["asyncq_inbox"]] == ["e-0", "e-2"] and await stock(place) == 2
    assert after["asyncq_inbox"][0] == before["asyncq_inbox"][0]


ENDING = ["COMMIT", "commit transaction", "END", "ROLLBACK", "rollback transaction", ";COMMIT", "/* a */ /**/COMMIT"]
ENDING += ["-- note\n  END", "\n\tRoLLbAcK", "BEGIN IMMEDIATE", "ROLLBACK/*then*/TO sp"]
NOT_ENDING = ["ROLLBACK TO sp", "rollback transaction to savepoint sp", "SAVEPOINT sp2", "RELEASE sp", "SELECT 1"]
NOT_ENDING += ["INSERT INTO t VALUES ('COMMIT')", "EXPLAIN COMMIT", "ENDX", "-- COMMIT", "/* COMMIT */ SELECT 1"]
NOT_ENDING += ["/* COMMIT", "/* * / COMMIT */ SELECT 2", "SELECT 1 -- COMMIT"]


def run_in_a_transaction(statement: str) -> bool:
    """Run ``statement`` inside an open transaction (with a savepoint ``sp``); whether the transaction is still open
    afterwards (a statement SQLite refuses leaves it open)."""
    con = sqlite3.connect(":memory:", isolation_level=None)
    try:
        con.execute("CREATE TABLE t (x)")
        con.execute("BEGIN")
        con.execute("SAVEPOINT sp")
        with contextlib.suppress(sqlite3.Error):
            con.execute(statement)
        return con.in_transaction
    finally:
        con.close()


@pytest.mark.parametrize("statement", ENDING)
def test_statements_that_end_a_transaction_are_recognised(statement: str) -> None:
    assert ends_transaction(statement)
    if not statement.startswith(("BEGIN", "ROLLBACK/*")):  # these two fail inside a transaction: refused anyway
        assert not run_in_a_transaction(statement)


@pytest.mark.parametrize("statement", NOT_ENDING)
def test_statements_that_keep_the_transaction_are_let_through(statement: str) -> None:
    assert not ends_transaction(statement)
    assert run_in_a_transaction(statement)


async def test_an_effect_that_releases_the_inbox_savepoint_fails_its_whole_batch(place: Place) -> None:
    """Savepoints are the effect's to use; releasing the inbox's own merges the event into the batch, so the batch
    cannot keep its events apart any more: all of it is rolled back and every event is answered as failed."""
    db = place.inbox

    def meddling(tx: EffectTransaction, event_id: str, body: Any) -> None:
        add_to_stock(tx, event_id, body)
        if event_id == "e-2":
            tx.execute("RELEASE inbox_event")

    async with Inbox(db, effect=meddling, ddl=STOCK_TABLES) as inbox:
        assert await inbox.receive("e-0", {"qty": 1}) == "applied"
        before = await dump(place)
        outcomes = await asyncio.gather(
            *(inbox.receive(f"e-{i}", {"qty": 1}) for i in (1, 2, 3)), return_exceptions=True
        )
        failure = asyncpg.PostgresError if place.postgres else sqlite3.OperationalError
        assert all(isinstance(outcome, failure) for outcome in outcomes), outcomes
        assert inbox.counters.failed == 3 and await place.in_no_transaction(db)
    assert await dump(place) == before


async def test_an_effect_may_use_savepoints_of_its_own(place: Place) -> None:
    def careful(tx: EffectTransaction, event_id: str, body: Any) -> None:
        tx.execute("SAVEPOINT mine")
        add_to_stock(tx, event_id, {"qty": 100, "item": "tried"})
        tx.execute("ROLLBACK TO mine")
        tx.execute("RELEASE mine")
        add_to_stock(tx, event_id, body)

    async with Inbox(place.inbox, effect=careful, ddl=STOCK_TABLES) as inbox:
        assert await inbox.receive("e-0", {"qty": 3}) == "applied"
    assert (await dump(place))["stock"] == [("snack", 3)]


async def test_the_effect_transaction_reads_rows_and_is_unusable_after_the_effect(place: Place) -> None:
    kept: list[EffectTransaction] = []
    read: list[list[Any]] = []

    def remember(tx: EffectTransaction, event_id: str, body: Any) -> None:
        add_to_stock(tx, event_id, body)
        if tx.dialect == "postgresql":
            read.append(tx.execute("SELECT item, qty FROM stock WHERE item = $1", ("snack",)))
        else:
            read.append(tx.execute("SELECT item, qty FROM stock WHERE item = :item", {"item": "snack"}))
        kept.append(tx)

    async with Inbox(place.inbox, effect=remember, ddl=STOCK_TABLES) as inbox:
        await inbox.receive("e-0", {"qty": 3})
        await inbox.receive("e-1", {"qty": 4})
        with pytest.raises(RuntimeError, match="effect has returned"):
            kept[0].execute("DELETE FROM stock")
    assert read == [[("snack", 3)], [("snack", 7)]] and await stock(place) == 7
    assert [tx.dialect for tx in kept] == [place.dialect] * 2


def test_a_bad_path_is_refused_before_anything_opens() -> None:
    for bad in ("", ":memory:", 7):
        with pytest.raises(ValueError, match="db"):
            Inbox(bad)
    for bad_url in ("postgresql://localhost/app?schema=Bad", "postgresql://localhost/app?wakeups=never"):
        with pytest.raises(ValueError, match=r"schema|wakeups"):
            Inbox(bad_url)
    assert Inbox("postgresql://localhost/app?schema=sink").db == "postgresql://localhost/app?schema=sink"
