"""The job counts the SQLite store keeps (``asyncq_counts``, by triggers) against a full count of the rows, after
every step of random histories.

Steps: enqueue (new and known ids, batches), an app transaction that enqueues and changes rows with its own SQL
and then commits or raises, claims that start at once or ahead, a handler starting a job claimed ahead, finishes
of every outcome (fresh and stale), extend, release, the clock running out leases and deadlines (the next claim
sweeps), redrive, cancel, prune, a statement that fails half-way (a test trigger refuses one row's update), and an
app's own SQL on another connection (updates, deletes, ``INSERT OR REPLACE``). After each: the cells equal ``GROUP
BY`` over the table, and ``stats()`` equals the figures computed from ``list_jobs`` (``core.stats.stats_of_jobs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from conformance.sqlite_files import KEPT_COUNTS, assert_counts_kept
from conformance.support import ALL, T0, claim, new, outcome
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from asyncq.core.jobs import Ticket
from asyncq.core.lifecycle import Fence
from asyncq.core.stats import stats_of_jobs
from asyncq.errors import Conflict
from asyncq.store.port.queue import JobFilter
from asyncq.store.sqlite.migrations import SCHEMA_VERSION
from asyncq.store.sqlite.queue_store import SqliteQueueStore
from asyncq.store.sqlite.schema import RECOUNT

pytestmark = pytest.mark.timeout(120)

IDS = ("a", "b", "c", "d", "e")
APP_SQL = (
    "UPDATE asyncq_jobs SET status = 'dead', reason = 'app', owner = NULL, lease_until = NULL WHERE id = :id",
    "UPDATE asyncq_jobs SET attempts = attempts + 1 WHERE id = :id",
    "UPDATE asyncq_jobs SET reason = NULL WHERE id = :id",
    "UPDATE asyncq_jobs SET lease_until = lease_until + 1 WHERE id = :id",  # no counted column: no trigger
    "DELETE FROM asyncq_jobs WHERE id = :id",
    "INSERT OR REPLACE INTO asyncq_jobs (id, queue, body, status, attempts, max_attempts, token, available_at,"
    " deadline) VALUES (:id, 'default', '{}', 'done', 2, 3, 0, 0, 0)",
)

ids = st.sampled_from(IDS)
enqueues = st.tuples(st.just("enqueue"), st.lists(ids, min_size=1, max_size=3), st.integers(1, 3), st.booleans())
transactions = st.tuples(st.just("transaction"), ids, st.integers(0, len(APP_SQL) - 1), st.booleans())
claims = st.tuples(st.just("claim"), st.integers(1, 3), st.integers(0, 3), st.sampled_from((50, 5_000)))
starts = st.tuples(st.just("start"), st.integers(0, 9))
finishes = st.tuples(
    st.just("finish"), st.integers(0, 9), st.sampled_from(("ok", "retry", "permanent")), st.sampled_from((0, 100))
)
extends = st.tuples(st.just("extend"), st.integers(0, 9))
releases = st.tuples(st.just("release"), st.integers(0, 9))
ticks = st.tuples(st.just("tick"), st.sampled_from((1, 60, 6_000, 70_000)))
operators = st.tuples(st.sampled_from(("redrive", "cancel")), ids)
prunes = st.tuples(st.just("prune"), st.sampled_from((("done",), ("dead",), ("done", "dead"))))
refusals = st.tuples(st.just("refused"), st.integers(0, 9))
app_sql = st.tuples(st.just("app"), ids, st.integers(0, len(APP_SQL) - 1))
steps = st.lists(
    st.one_of(
        enqueues, transactions, claims, starts, finishes, extends, releases, ticks, operators, prunes, refusals, app_sql
    ),
    max_size=30,
)


@dataclass
class History:
    store: SqliteQueueStore
    now: int = T0
    tickets: list[Ticket] = field(default_factory=list)
    ahead: list[Ticket] = field(default_factory=list)  # claimed ahead, not started yet
    refused: int = 0  # finishes that failed half-way
    ran: set[str] = field(default_factory=set)  # the kinds of step that did something (not skipped by a guard)

    def pick(self, k: int, tickets: list[Ticket]) -> Ticket:
        return tickets[len(tickets) - 1 - k % len(tickets)]


class Rollback(Exception):
    """Raised inside an app transaction to roll it back."""


def app_connection(store: SqliteQueueStore) -> sqlite3.Connection:
    con = sqlite3.connect(store.location, isolation_level=None, timeout=5)
    con.execute("PRAGMA recursive_triggers = ON")  # a REPLACE's delete fires delete triggers (see sqlite/schema.py)
    return con


async def run(h: History, step: tuple[Any, ...]) -> None:
    """One step; refused calls (``ValueError``, ``Conflict``, a refused row) change nothing, which is checked too."""
    kind, store, now = step[0], h.store, h.now
    if _guarded(kind, h):
        return
    h.ran.add(kind)
    if kind == "enqueue":
        _, chosen, budget, late = step
        rows = [
            new(job_id, now, max_attempts=budget, body={"v": budget}, delay_ms=50 if late else 0) for job_id in chosen
        ]
        with contextlib.suppress(Conflict):
            await store.enqueue(rows)
    elif kind == "transaction":
        _, job_id, statement, fail = step
        with contextlib.suppress(Rollback, Conflict):
            async with store.transaction() as tx:
                await tx.enqueue_rows([new(job_id, now, body={"v": 1})])
                await tx.execute(APP_SQL[statement], {"id": job_id})
                if fail:
                    raise Rollback
    elif kind == "claim":
        _, n, start_now, lease_ms = step
        settled = await store.settle_and_claim([], now, "w1", lease_ms, [("default", n)], n, start_now=start_now)
        h.tickets += [t for t in settled.tickets[:start_now]]
        h.ahead += [t for t in settled.tickets[start_now:]]
    elif kind == "start":
        ticket = h.pick(step[1], h.ahead)
        settled = await store.settle_and_claim([], now, "w1", 1_000, [], 0, started=[ticket])
        if settled.started == [True]:
            h.ahead.remove(ticket)
            fence = ticket.fence
            h.tickets.append(
                replace(
                    ticket, fence=Fence(fence.owner, fence.token, fence.attempt + 1, fence.lease_until), counted=True
                )
            )
    elif kind == "finish":
        _, k, result, delay = step
        ticket = h.pick(k, h.tickets + h.ahead)  # a job claimed ahead is finished with its attempt counted then
        finish = outcome(ticket, result, delay)
        await store.finish([finish if ticket.counted else finish._replace(counted=False)], now)
    elif kind == "extend":
        ticket = h.pick(step[1], h.tickets)
        [renewal] = await store.extend([(ticket.id, ticket.fence)], now, 5_000)
        if renewal is not None:
            h.tickets.append(replace(ticket, fence=renewal.fence))
    elif kind == "release":
        ticket = h.pick(step[1], h.tickets + h.ahead)
        await store.release([(ticket.id, ticket.fence)], now, [ticket in h.tickets])
    elif kind == "tick":
        h.now += step[1]
    elif kind in ("redrive", "cancel"):
        with contextlib.suppress(ValueError):
            if kind == "redrive":
                await store.redrive(step[1], now, now + 60_000, "ops")
            else:
                await store.cancel(step[1], now, "ops")
    elif kind == "prune":
        await store.prune(now, step[1], vacuum=False, now_ms=now)
    elif kind == "refused":
        await refused_finish(h, h.pick(step[1], h.tickets))
    elif kind == "app":
        _, job_id, statement = step
        with contextlib.closing(app_connection(store)) as con:
            con.execute(APP_SQL[statement], {"id": job_id})


def _guarded(kind: str, h: History) -> bool:
    """Whether a step of ``kind`` has nothing to act on now (no ticket to start, finish, extend, release)."""
    if kind == "start":
        return not h.ahead
    if kind in ("finish", "release"):
        return not (h.tickets or h.ahead)
    return kind in ("extend", "refused") and not h.tickets


async def refused_finish(h: History, ticket: Ticket) -> None:
    """A batch of finishes whose statement fails half-way (a trigger refuses one row): none of it lands."""
    with contextlib.closing(app_connection(h.store)) as con:
        refuse = f"CREATE TRIGGER refuse BEFORE UPDATE ON asyncq_jobs WHEN OLD.id = '{ticket.id}'"
        con.execute(refuse + " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    try:
        with contextlib.suppress(sqlite3.IntegrityError):  # raised if the refused job's finish would land
            h.refused += 1
            await h.store.finish(
                [outcome(t, "ok") for t in h.tickets if t.id != ticket.id] + [outcome(ticket, "ok")], h.now
            )
            h.refused -= 1
    finally:
        with contextlib.closing(app_connection(h.store)) as con:
            con.execute("DROP TRIGGER refuse")


async def check(h: History) -> None:
    """The kept cells are the rows' count, and ``stats()`` is what the listing says."""
    assert_counts_kept(h.store.location)
    stats = await h.store.stats(h.now)
    listed = [job for job in await h.store.list_jobs(JobFilter(limit=ALL))]
    assert stats == stats_of_jobs(listed, h.now)


async def replay(steps: list[tuple[Any, ...]]) -> History:
    with tempfile.TemporaryDirectory(prefix="asyncq-counts-") as tmp:
        store = await SqliteQueueStore.open(Path(tmp) / "queue.db", durability="normal")
        try:
            h = History(store)
            for step in steps:
                await run(h, step)
                await check(h)
            return h
        finally:
            await store.close()


# Every kind of step, in an order where each lands at least once.
TOUR = [
    ("enqueue", ["a", "b", "c", "d"], 2, False), ("enqueue", ["e"], 1, True), ("claim", 3, 1, 50),
    ("start", 0), ("finish", 0, "retry", 0), ("finish", 1, "ok", 0), ("claim", 2, 2, 50), ("extend", 0),
    ("release", 0), ("tick", 60), ("claim", 1, 1, 50), ("finish", 0, "permanent", 0), ("tick", 70_000),
    ("claim", 1, 1, 50), ("redrive", "a"), ("cancel", "a"), ("transaction", "b", 0, True),
    ("transaction", "b", 1, False), ("prune", ("done", "dead")), ("enqueue", ["b", "c"], 3, False),
    ("claim", 2, 2, 5_000), ("refused", 0), ("app", "a", 0), ("app", "a", 2), ("app", "b", 1), ("app", "b", 2),
    ("app", "b", 3), ("app", "c", 5), ("app", "c", 4), ("app", "a", 5),
]  # fmt: skip
EXAMPLES = int(os.environ.get("ASYNCQ_HISTORY_EXAMPLES", "25"))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
@example(steps=TOUR)
def test_kept_counts_equal_a_full_count_after_every_step(steps: list[tuple[Any, ...]]) -> None:
    asyncio.run(replay(steps))


def test_the_tour_takes_every_kind_of_step() -> None:
    h = asyncio.run(replay(TOUR))
    assert h.refused == 1
    assert h.ran == {step[0] for step in TOUR}  # no step of the tour was skipped by its guard


def test_the_version_5_migration_counts_the_rows_of_a_version_4_file_once(tmp_path: Path) -> None:
    """A version 4 file with rows in every status and reason opens as version 5 with its counts built from the
    rows; reopening does not count them again; the lifecycle then keeps them."""
    from asyncq.store.sqlite.migrations import MIGRATIONS

    path = tmp_path / "v4.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as con:
        for step in MIGRATIONS[:4]:
            for statement in step:
                con.execute(statement)
        con.execute("PRAGMA user_version = 4")
        rows = [
            ("p0", "pending", 0, None, None, None), ("p1", "pending", 1, None, None, None),
            ("l0", "leased", 1, None, "w", T0 + 10_000), ("l1", "leased", 2, None, "w", T0 + 10_000),
            ("d0", "done", 1, None, None, None), ("d1", "done", 3, None, None, None),
            ("x0", "dead", 3, "exhausted", None, None), ("x1", "dead", 0, "cancelled", None, None),
            ("x2", "dead", 1, "deadline", None, None), ("x3", "dead", 1, "permanent", None, None),
        ]  # fmt: skip
        con.executemany(
            "INSERT INTO asyncq_jobs (id, queue, body, status, attempts, max_attempts, token, available_at, deadline,"
            " owner, lease_until, reason) VALUES (?, 'default', '{}', ?, ?, 3, 1, ?, ?, ?, ?, ?)",
            [(i, s, a, T0 - 5, T0 + 60_000, o, lu, r) for i, s, a, r, o, lu in rows],
        )

    async def scenario() -> None:
        store = await SqliteQueueStore.open(path)
        try:
            stats = await store.stats(T0)
            assert stats.by_status == {"pending": 2, "leased": 2, "done": 2, "dead": 4, "waiting": 0}
            assert stats.dead_by_reason == {"exhausted": 1, "cancelled": 1, "deadline": 1, "permanent": 1}
            assert (stats.attempts, stats.oldest_ready_age_ms) == ({0: 1, 1: 2, 2: 1}, 5)
        finally:
            await store.close()
        store = await SqliteQueueStore.open(path)  # a second open migrates nothing and counts nothing again
        try:
            assert (await store.stats(T0)).by_status == {"pending": 2, "leased": 2, "done": 2, "dead": 4, "waiting": 0}
            [ticket] = await claim(store, "w2", T0)
            assert await store.finish([outcome(ticket, "ok")], T0) == ["done"]
            assert (await store.stats(T0)).by_status == {"pending": 1, "leased": 2, "done": 3, "dead": 4, "waiting": 0}
        finally:
            await store.close()

    asyncio.run(scenario())
    assert_counts_kept(path)
    with contextlib.closing(sqlite3.connect(path)) as con:
        assert con.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        kept = con.execute(KEPT_COUNTS).fetchall()
        for statement in RECOUNT:  # counting again from the rows gives the same cells
            con.execute(statement)
        assert con.execute(KEPT_COUNTS).fetchall() == kept


def test_the_lab_tables_get_no_counts_and_no_triggers(tmp_path: Path) -> None:
    from asyncq.lab.lease import open_queue

    with contextlib.closing(open_queue(tmp_path / "lab.db")) as con:
        names = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')")}
        indexes = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert names == {"jobs", "redrives", "sqlite_sequence"}
    assert not any("ready_at" in name for name in indexes)


def test_stats_refuse_the_labs_tables_which_keep_no_counts(tmp_path: Path) -> None:
    from asyncq.lab.lease import open_queue
    from asyncq.store.sqlite.schema import LAB
    from asyncq.store.sqlite.stats import read_stats

    with contextlib.closing(open_queue(tmp_path / "lab.db")) as con, pytest.raises(ValueError, match="keeps no counts"):
        read_stats(con, LAB, T0)


def test_counts_that_disagree_with_the_rows_are_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Rows deleted with the triggers dropped leave a cell too high; a later delete takes it below zero: ``stats``
    logs the cell and reports the counts as they stand (nothing raises)."""

    async def scenario() -> None:
        store = await SqliteQueueStore.open(tmp_path / "queue.db")
        try:
            assert await store.enqueue([new("a"), new("b")]) == [True, True]
            with contextlib.closing(sqlite3.connect(store.location, isolation_level=None)) as con:
                con.execute("DELETE FROM asyncq_counts")  # as if the counts were lost: the next delete goes below 0
                con.execute("DELETE FROM asyncq_jobs WHERE id = 'a'")
            with caplog.at_level("WARNING", logger="asyncq.store.sqlite.stats"):
                stats = await store.stats(T0)
            assert stats.by_status["pending"] == -1
        finally:
            await store.close()

    asyncio.run(scenario())
    [warned] = [record for record in caplog.records if record.name == "asyncq.store.sqlite.stats"]
    assert warned.levelname == "WARNING" and warned.args == (-1, ("pending", 0, ""))
