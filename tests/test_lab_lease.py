"""The lease lab contract (``docs/lease-lab.md``), one test per rule, on real SQLite files."""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest

from asyncq.lab import lease
from asyncq.lab.lease import (
    BadAck,
    Conflict,
    Permanent,
    Retryable,
    claim,
    enqueue,
    finish,
    open_queue,
    redrive,
    retry_delay,
    run_file,
    run_once,
)

try:
    import lease_children as kids
except ImportError:  # tests/ imported as a package
    from tests import lease_children as kids

pytestmark = pytest.mark.timeout(30)

TTL = 60_000
TICKET_KEYS = {"id", "qty", "owner", "token", "attempt", "lease_until"}


def job(con: sqlite3.Connection, job_id: str) -> dict[str, Any]:
    found = kids.row(con, job_id)
    assert found is not None, f"no job {job_id!r}"
    return found


def put(con: sqlite3.Connection, job_id: str = "a", qty: int = 5, now: int = 1000, **kw: int) -> None:
    assert enqueue(con, {"id": job_id, "qty": qty}, now, kw.pop("ttl", TTL), **kw) is True


class Clock:
    """Returns the given readings in order and counts the calls."""

    def __init__(self, *readings: object) -> None:
        self.readings, self.calls = list(readings), 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.readings.pop(0)


class Send:
    """A recording ``send`` that returns (or raises) what it was given."""

    def __init__(self, answer: object = True, action: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.answer, self.action, self.calls = answer, action, []  # type: list[dict[str, Any]]

    def __call__(self, message: dict[str, Any]) -> object:
        self.calls.append(message)
        if self.action is not None:
            self.action(message)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


# --- step 1: errors and retry_delay -----------------------------------------------------------------


def test_errors_are_exception_subclasses() -> None:
    for error in (Conflict, Retryable, Permanent, BadAck):
        assert issubclass(error, Exception)
    assert len({Conflict, Retryable, Permanent, BadAck}) == 4


@pytest.mark.parametrize(
    ("attempt", "base", "cap", "jitter", "expected"),
    [
        (1, 100, 1000, 1, 100),
        (2, 100, 1000, 1, 200),
        (4, 100, 1000, 1, 800),
        (5, 100, 1000, 1, 1000),  # 1600 capped
        (16, 100, 1000, 1, 1000),
        (16, 60_000, 60_000, 1, 60_000),
        (16, 1, 60_000, 1, 32_768),
        (1, 1, 1, 1, 1),
        (3, 100, 100, 1, 100),  # cap == base
        (3, 100, 1000, 0, 0),
        (3, 100, 1000, 0.0, 0),
        (3, 100, 1000, -0.0, 0),  # finite, == 0: valid
        (3, 100, 1000, 0.5, 200),
        (1, 100, 1000, 0.5, 50),
        (1, 3, 1000, 0.5, 1),  # floor(1.5)
        (1, 100, 1000, 0.999, 99),
        (1, 100, 1000, 1.0, 100),
        (1, 100, 1000, 0.57, 56),  # 100 * 0.57 == 56.99999999999999 in float arithmetic
        (1, 100, 1000, 0.29, 28),  # 100 * 0.29 == 28.999999999999996
        (7, 100, 1000, 5e-324, 0),
    ],
)
def test_retry_delay_table(attempt: int, base: int, cap: int, jitter: float, expected: int) -> None:
    result = retry_delay(attempt, base, cap, jitter)
    assert type(result) is int
    assert result == expected == math.floor(min(cap, base * 2 ** (attempt - 1)) * jitter)


# --- step 2: open_queue ----------------------------------------------------------------------------


def test_open_queue_settings(con: sqlite3.Connection) -> None:
    assert isinstance(con, sqlite3.Connection)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert con.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert con.isolation_level is None
    assert con.in_transaction is False


def test_open_queue_creates_the_exact_schema(con: sqlite3.Connection) -> None:
    def columns(table: str) -> list[tuple[Any, ...]]:
        return [tuple(c[1:]) for c in con.execute(f"PRAGMA table_info({table})")]

    assert columns("jobs") == [
        ("seq", "INTEGER", 0, None, 1),
        ("id", "TEXT", 1, None, 0),
        ("qty", "INTEGER", 1, None, 0),
        ("status", "TEXT", 1, None, 0),
        ("attempts", "INTEGER", 1, None, 0),
        ("max_attempts", "INTEGER", 1, None, 0),
        ("token", "INTEGER", 1, None, 0),
        ("available_at", "INTEGER", 1, None, 0),
        ("deadline", "INTEGER", 1, None, 0),
        ("owner", "TEXT", 0, None, 0),
        ("lease_until", "INTEGER", 0, None, 0),
        ("reason", "TEXT", 0, None, 0),
    ]
    assert columns("redrives") == [
        ("seq", "INTEGER", 0, None, 1),
        ("id", "TEXT", 1, None, 0),
        ("token", "INTEGER", 1, None, 0),
        ("at_ms", "INTEGER", 1, None, 0),
        ("note", "TEXT", 1, None, 0),
    ]
    sql = con.execute("SELECT sql FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
    assert "AUTOINCREMENT" in sql and "UNIQUE" in sql
    assert "CHECK(status IN ('pending','leased','done','dead'))" in sql
    with pytest.raises(sqlite3.IntegrityError):
        con.execute("INSERT INTO jobs (id, qty, status, attempts, max_attempts, token, available_at, deadline)"
                    " VALUES ('x', 1, 'other', 0, 1, 0, 0, 1)")  # fmt: skip


def test_open_queue_timeout_is_one_second(path: Path, con: sqlite3.Connection) -> None:
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            con.execute("BEGIN IMMEDIATE")
        waited = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert 0.8 <= waited <= 3.0
    assert con.in_transaction is False


def test_a_locked_queue_is_an_error_never_nothing_to_do(path: Path, con: sqlite3.Connection) -> None:
    put(con, "a")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    send = Send()
    try:
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            claim(con, "w", 1000)
        assert con.in_transaction is False
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            run_once(con, "w", Clock(1000, 1001), send, 1)
        assert con.in_transaction is False
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert send.calls == []
    assert job(con, "a")["status"] == "pending"


def normalised(statement: str) -> str:
    return " ".join(statement.strip().rstrip(";").upper().split())


def transactions(statements: list[str]) -> list[list[str]]:
    """The traced statements split into transactions; ``SEND`` marks where ``send`` ran. The busy timeout's
    pragmas around a ``BEGIN`` are left out: a write waits for a lock held elsewhere in short sleeps of its own,
    with SQLite's busy timeout at 0 while it tries (``asyncq.store.sqlite.busy.begin_immediate``)."""
    groups: list[list[str]] = []
    current: list[str] | None = None
    for statement in map(normalised, statements):
        if statement.startswith("PRAGMA BUSY_TIMEOUT"):
            continue
        if statement.startswith("BEGIN"):
            assert current is None, f"nested BEGIN in {statements}"
            current = [statement]
        elif current is not None:
            current.append(statement)
            if statement in ("COMMIT", "ROLLBACK", "END"):
                groups.append(current)
                current = None
        else:
            groups.append([statement])  # outside any transaction
    assert current is None, f"a transaction was left open: {statements}"
    return groups


@pytest.mark.parametrize(
    "operation",
    ["enqueue", "enqueue-duplicate", "enqueue-conflict", "claim", "claim-none", "finish", "finish-stale", "redrive",
     "redrive-refused"],
)  # fmt: skip
def test_each_write_is_one_begin_immediate_transaction(con: sqlite3.Connection, operation: str) -> None:
    put(con, "a", 5)
    put(con, "late", now=1000, ttl=10)
    ticket = claim(con, "w", 1000)
    assert ticket is not None
    if operation == "redrive":
        assert finish(con, ticket, "permanent", 1001) == "dead"
    statements: list[str] = []
    con.set_trace_callback(statements.append)
    try:
        with (
            pytest.raises((Conflict, ValueError))
            if operation in ("enqueue-conflict", "redrive-refused")
            else nullcontext()
        ):
            {
                "enqueue": lambda: enqueue(con, {"id": "b", "qty": 1}, 1000, TTL),
                "enqueue-duplicate": lambda: enqueue(con, {"id": "a", "qty": 5}, 1000, TTL),
                "enqueue-conflict": lambda: enqueue(con, {"id": "a", "qty": 6}, 1000, TTL),
                "claim": lambda: claim(con, "w", 1000) or pytest.fail("nothing claimed"),
                "claim-none": lambda: claim(con, "w", 1500),
                "finish": lambda: finish(con, ticket, "ok", 1500),
                "finish-stale": lambda: finish(con, ticket, "ok", 2000),
                "redrive": lambda: redrive(con, "a", 1500, TTL, "ops"),
                "redrive-refused": lambda: redrive(con, "a", 1500, TTL, "ops"),
            }[operation]()
    finally:
        con.set_trace_callback(None)
    groups = transactions(statements)
    assert len(groups) == 1 and groups[0][0] == "BEGIN IMMEDIATE", statements


def test_run_once_sends_between_two_transactions(con: sqlite3.Connection) -> None:
    put(con, "a")
    statements: list[str] = []
    con.set_trace_callback(statements.append)
    try:
        assert run_once(con, "w", Clock(1000, 1001), Send(action=lambda m: statements.append("SEND")), 1)
    finally:
        con.set_trace_callback(None)
    groups = transactions(statements)
    assert [g[0] for g in groups] == ["BEGIN IMMEDIATE", "SEND", "BEGIN IMMEDIATE"], statements
    assert [g[-1] for g in groups] == ["COMMIT", "SEND", "COMMIT"]


def test_open_queue_preserves_existing_rows(path: Path, con: sqlite3.Connection) -> None:
    put(con, "a")
    ticket = claim(con, "w", 1000)
    assert ticket is not None
    assert finish(con, ticket, "permanent", 1001) == "dead"
    assert redrive(con, "a", 1002, TTL, "again") is True
    before = kids.dump(con)
    con.close()
    for _ in range(2):
        reopened = open_queue(path)
        assert kids.dump(reopened) == before
        reopened.close()


def test_open_queue_initialisation_is_one_transaction_and_closes_on_failure(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file whose `jobs` table lacks the spec's columns: the tables are "created if missing", but the
    # implementation's indexes cannot be built, so initialisation fails part-way.
    seed = sqlite3.connect(path)
    seed.execute("CREATE TABLE jobs (x)")
    seed.commit()
    seed.close()
    opened: list[sqlite3.Connection] = []
    real_connect = sqlite3.connect

    def spy(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened.append(real_connect(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(sqlite3, "connect", spy)
    try:
        reopened = open_queue(path)
    except sqlite3.Error:
        monkeypatch.undo()
        assert len(opened) == 1
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            opened[0].execute("SELECT 1")
        check = sqlite3.connect(path)
        names = {r[0] for r in check.execute("SELECT name FROM sqlite_master")}
        check.close()
        assert names == {"jobs"}, "a failed initialisation must not leave part of the schema"
    else:  # an implementation without such indexes accepts the file; nothing to check then
        reopened.close()
        pytest.skip("initialisation did not fail on this schema")


# --- step 3: enqueue -------------------------------------------------------------------------------


def test_enqueue_inserts_a_pending_job(con: sqlite3.Connection) -> None:
    assert enqueue(con, {"id": "a", "qty": 7}, 1234, 500, 4) is True
    assert job(con, "a") == {
        "seq": 1,
        "id": "a",
        "qty": 7,
        "status": "pending",
        "attempts": 0,
        "max_attempts": 4,
        "token": 0,
        "available_at": 1234,
        "deadline": 1734,
        "owner": None,
        "lease_until": None,
        "reason": None,
    }
    assert con.in_transaction is False


def test_enqueue_default_max_attempts_is_three(con: sqlite3.Connection) -> None:
    assert enqueue(con, {"id": "a", "qty": 1}, 0, 1) is True
    assert job(con, "a")["max_attempts"] == 3


@pytest.mark.parametrize(("ttl", "max_attempts"), [(TTL, 3), (10, 3), (TTL, 1), (5, 16)])
def test_enqueue_same_id_same_qty_is_false_and_keeps_the_whole_row(
    con: sqlite3.Connection, ttl: int, max_attempts: int
) -> None:
    put(con, "a", 5, now=1000, ttl=TTL, max_attempts=3)
    ticket = claim(con, "w", 1000)  # a row that has moved on must not be reset either
    assert ticket is not None
    before = kids.dump(con)
    assert enqueue(con, {"id": "a", "qty": 5}, 9000, ttl, max_attempts) is False
    assert kids.dump(con) == before
    assert con.in_transaction is False


@pytest.mark.parametrize("status", ["done", "dead"])
def test_enqueue_duplicate_of_a_finished_job_is_false(con: sqlite3.Connection, status: str) -> None:
    put(con, "a", 5)
    ticket = claim(con, "w", 1000)
    assert ticket is not None
    assert finish(con, ticket, "ok" if status == "done" else "permanent", 1001) == status
    before = kids.dump(con)
    assert enqueue(con, {"id": "a", "qty": 5}, 2000, TTL) is False
    assert kids.dump(con) == before


def test_enqueue_same_id_other_qty_is_conflict_and_changes_nothing(con: sqlite3.Connection) -> None:
    put(con, "a", 5)
    before = kids.dump(con)
    with pytest.raises(Conflict):
        enqueue(con, {"id": "a", "qty": 6}, 2000, TTL)
    assert kids.dump(con) == before
    assert con.in_transaction is False


# --- step 4: claim ---------------------------------------------------------------------------------


def test_claim_returns_the_ticket_and_leases_the_row(con: sqlite3.Connection) -> None:
    put(con, "a", 9, now=1000, ttl=TTL, max_attempts=3)
    ticket = claim(con, "w-1", 1500, 700)
    assert type(ticket) is dict and set(ticket) == TICKET_KEYS
    assert ticket == {"id": "a", "qty": 9, "owner": "w-1", "token": 1, "attempt": 1, "lease_until": 2200}
    assert job(con, "a") == {
        "seq": 1,
        "id": "a",
        "qty": 9,
        "status": "leased",
        "attempts": 1,
        "max_attempts": 3,
        "token": 1,
        "available_at": 1000,
        "deadline": 61_000,
        "owner": "w-1",
        "lease_until": 2200,
        "reason": None,
    }
    assert con.in_transaction is False


def test_claim_default_lease_is_one_second(con: sqlite3.Connection) -> None:
    put(con)
    ticket = claim(con, "w", 1000)
    assert ticket is not None and ticket["lease_until"] == 2000


@pytest.mark.parametrize(("lease_ms", "expected"), [(999, 1999), (1000, 2000), (1001, 2000), (60_000, 2000)])
def test_claim_lease_until_is_capped_by_the_deadline(con: sqlite3.Connection, lease_ms: int, expected: int) -> None:
    put(con, now=1000, ttl=1000)  # deadline 2000
    ticket = claim(con, "w", 1000, lease_ms)
    assert ticket is not None and ticket["lease_until"] == expected == job(con, "a")["lease_until"]


def test_claim_orders_by_seq_not_id(con: sqlite3.Connection) -> None:
    put(con, "z")
    put(con, "a")
    first, second = claim(con, "w", 1000), claim(con, "w", 1000)
    assert first is not None and second is not None
    assert (first["id"], second["id"]) == ("z", "a")
    assert claim(con, "w", 1000) is None


def test_claim_with_nothing_ready_returns_none_and_changes_nothing(con: sqlite3.Connection) -> None:
    assert claim(con, "w", 0) is None
    put(con, "a", now=5000)
    before = kids.dump(con)
    assert claim(con, "w", 4999) is None  # not yet available
    assert kids.dump(con) == before
    assert claim(con, "w", 5000) is not None  # available_at <= now
    assert claim(con, "w", 5001) is None  # leased, not expired
    assert con.in_transaction is False


def test_claim_skips_a_waiting_job_for_a_later_one(con: sqlite3.Connection) -> None:
    put(con, "a")
    put(con, "b")
    ticket = claim(con, "w", 1000)
    assert ticket is not None and ticket["id"] == "a"
    assert finish(con, ticket, "retry", 1001, 5000) == "pending"  # a waits until 6001
    later = claim(con, "w", 1002)
    assert later is not None and later["id"] == "b"
    assert claim(con, "w", 1003) is None
    again = claim(con, "w", 6001)
    assert again is not None and again["id"] == "a" and again["token"] == 2


def test_token_and_attempt_increase_with_every_claim(con: sqlite3.Connection) -> None:
    put(con, "a", max_attempts=5)
    now = 1000
    for n in range(1, 5):
        ticket = claim(con, "w", now, 10)
        assert ticket is not None
        assert (ticket["token"], ticket["attempt"]) == (n, n)
        now = ticket["lease_until"]  # expired exactly at lease_until
    row = job(con, "a")
    assert (row["token"], row["attempts"]) == (4, 4)


def test_expired_lease_is_reclaimed_by_another_owner_and_old_finish_is_stale(con: sqlite3.Connection) -> None:
    put(con, "a")
    old = claim(con, "old", 1000, 500)
    assert old is not None and old["lease_until"] == 1500
    assert claim(con, "new", 1499) is None
    new = claim(con, "new", 1500, 500)
    assert new is not None
    assert (new["owner"], new["token"], new["attempt"], new["lease_until"]) == ("new", 2, 2, 2000)
    before = kids.dump(con)
    assert finish(con, old, "ok", 1600) is False
    assert kids.dump(con) == before
    assert finish(con, new, "ok", 1600) == "done"


def sweep_fields(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("status", "reason", "owner", "lease_until")}


def test_sweep_pending_past_deadline_is_dead_deadline(con: sqlite3.Connection) -> None:
    put(con, "a", now=1000, ttl=100)
    before = job(con, "a")
    assert claim(con, "w", 1100) is None  # deadline <= now
    after = job(con, "a")
    assert (after["status"], after["reason"], after["owner"], after["lease_until"]) == ("dead", "deadline", None, None)
    assert sweep_fields(after) == sweep_fields(before)
    assert con.in_transaction is False


def test_sweep_pending_just_before_deadline_is_claimed(con: sqlite3.Connection) -> None:
    put(con, "a", now=1000, ttl=100)
    ticket = claim(con, "w", 1099)
    assert ticket is not None and ticket["lease_until"] == 1100


def test_sweep_expired_lease_past_deadline_is_dead_deadline(con: sqlite3.Connection) -> None:
    put(con, "a", now=1000, ttl=100)
    assert claim(con, "w", 1000, 5000) is not None  # lease_until = deadline = 1100
    before = job(con, "a")
    assert claim(con, "w", 1100) is None
    after = job(con, "a")
    assert (after["status"], after["reason"], after["owner"], after["lease_until"]) == ("dead", "deadline", None, None)
    assert sweep_fields(after) == sweep_fields(before)
    assert (after["attempts"], after["token"]) == (1, 1)


def test_sweep_pending_exhausted_is_dead_exhausted(con: sqlite3.Connection) -> None:
    put(con, "a", max_attempts=2)
    con.execute("UPDATE jobs SET attempts = 2, token = 7, reason = 'retry' WHERE id = 'a'")  # crafted
    before = job(con, "a")
    assert claim(con, "w", 1000) is None
    after = job(con, "a")
    assert (after["status"], after["reason"], after["owner"], after["lease_until"]) == ("dead", "exhausted", None, None)
    assert sweep_fields(after) == sweep_fields(before)


def test_sweep_expired_lease_exhausted_is_dead_exhausted(con: sqlite3.Connection) -> None:
    put(con, "a", max_attempts=1)
    assert claim(con, "w", 1000, 100) is not None
    before = job(con, "a")
    assert claim(con, "w", 1100) is None
    after = job(con, "a")
    assert (after["status"], after["reason"], after["owner"], after["lease_until"]) == ("dead", "exhausted", None, None)
    assert sweep_fields(after) == sweep_fields(before)


@pytest.mark.parametrize("leased", [False, True])
def test_sweep_deadline_takes_precedence_over_exhausted(con: sqlite3.Connection, leased: bool) -> None:
    put(con, "a", now=1000, ttl=500, max_attempts=1)
    if leased:
        assert claim(con, "w", 1000, 100) is not None
    else:
        con.execute("UPDATE jobs SET attempts = 1 WHERE id = 'a'")
    assert claim(con, "w", 1500) is None
    assert (job(con, "a")["status"], job(con, "a")["reason"]) == ("dead", "deadline")


def test_sweep_leaves_an_unexpired_lease_alone_even_past_max_attempts(con: sqlite3.Connection) -> None:
    put(con, "a", max_attempts=1)
    assert claim(con, "w", 1000, 1000) is not None
    con.execute("UPDATE jobs SET attempts = 5 WHERE id = 'a'")  # beyond the budget, still leased
    before = kids.dump(con)
    assert claim(con, "v", 1999) is None
    assert kids.dump(con) == before


def test_sweep_waits_for_a_lease_that_outlives_the_deadline(con: sqlite3.Connection) -> None:
    # Only "pending, or leased with an expired lease" is swept: a (crafted) lease that ends after the
    # deadline keeps its row leased until the lease itself expires.
    put(con, "a", now=1000, ttl=10_000)
    assert claim(con, "w", 1000, 2000) is not None  # lease_until 3000
    con.execute("UPDATE jobs SET deadline = 1500 WHERE id = 'a'")
    before = kids.dump(con)
    assert claim(con, "v", 2000) is None
    assert kids.dump(con) == before
    assert claim(con, "v", 3000) is None
    assert (job(con, "a")["status"], job(con, "a")["reason"]) == ("dead", "deadline")


def test_sweep_leaves_done_and_dead_rows_alone(con: sqlite3.Connection) -> None:
    put(con, "a", now=1000, ttl=100, max_attempts=1)
    put(con, "b", now=1000, ttl=100, max_attempts=1)
    ta = claim(con, "w", 1000)
    tb = claim(con, "w", 1000)
    assert ta is not None and tb is not None
    assert finish(con, ta, "ok", 1001) == "done"
    assert finish(con, tb, "permanent", 1001) == "dead"
    before = kids.dump(con)
    assert claim(con, "w", 10**6) is None
    assert kids.dump(con) == before


def test_claim_sweeps_every_row_then_claims_the_first_ready(con: sqlite3.Connection) -> None:
    put(con, "late", now=1000, ttl=100)
    put(con, "tired", now=1000, max_attempts=1)
    con.execute("UPDATE jobs SET attempts = 1 WHERE id = 'tired'")
    put(con, "ready", now=1000)
    put(con, "after", now=1000)
    ticket = claim(con, "w", 2000)
    assert ticket is not None and ticket["id"] == "ready"
    statuses = {r[1]: (r[3], r[11]) for r in kids.dump(con)["jobs"]}
    assert statuses == {
        "late": ("dead", "deadline"),
        "tired": ("dead", "exhausted"),
        "ready": ("leased", None),
        "after": ("pending", None),
    }


def test_claim_clears_reason_of_a_retried_job(con: sqlite3.Connection) -> None:
    put(con, "a")
    ticket = claim(con, "w", 1000)
    assert ticket is not None
    assert finish(con, ticket, "retry", 1001, 0) == "pending"
    assert job(con, "a")["reason"] == "retry"
    assert claim(con, "w", 1001) is not None
    assert job(con, "a")["reason"] is None


# --- step 5: finish --------------------------------------------------------------------------------


@pytest.fixture
def held(con: sqlite3.Connection) -> dict[str, Any]:
    """Job ``a`` (qty 5, deadline 11000, max_attempts 3) leased by ``w`` at 1000 until 3000."""
    put(con, "a", 5, now=1000, ttl=10_000, max_attempts=3)
    ticket = claim(con, "w", 1000, 2000)
    assert ticket is not None
    return ticket


@pytest.mark.parametrize(
    ("outcome", "delay", "status", "reason", "available_at"),
    [
        ("ok", 0, "done", None, 2000),
        ("ok", 500, "done", None, 2000),  # available_at = now unless pending
        ("permanent", 0, "dead", "permanent", 2000),
        ("permanent", 500, "dead", "permanent", 2000),
        ("retry", 0, "pending", "retry", 2000),
        ("retry", 500, "pending", "retry", 2500),
        ("retry", 8999, "pending", "retry", 10_999),
        ("retry", 9000, "dead", "deadline", 2000),  # now + delay == deadline
        ("retry", 60_000, "dead", "deadline", 2000),
    ],
)
def test_finish_outcomes(
    con: sqlite3.Connection,
    held: dict[str, Any],
    outcome: str,
    delay: int,
    status: str,
    reason: str | None,
    available_at: int,
) -> None:
    before, kept = job(con, "a"), dict(held)
    assert finish(con, held, outcome, 2000, delay) == status
    assert held == kept  # the ticket is not mutated
    after = job(con, "a")
    changed = {"status": status, "reason": reason, "available_at": available_at, "owner": None, "lease_until": None}
    assert after == {**before, **changed}
    assert con.in_transaction is False


def test_finish_default_delay_is_zero(con: sqlite3.Connection, held: dict[str, Any]) -> None:
    assert finish(con, held, "retry", 2000) == "pending"
    assert job(con, "a")["available_at"] == 2000


@pytest.mark.parametrize("delay", [0, 9000])
def test_finish_retry_at_the_budget_is_dead_exhausted(con: sqlite3.Connection, delay: int) -> None:
    put(con, "a", now=1000, ttl=10_000, max_attempts=1)
    ticket = claim(con, "w", 1000)
    assert ticket is not None
    assert finish(con, ticket, "retry", 1500, delay) == "dead"
    row = job(con, "a")
    assert (row["status"], row["reason"], row["available_at"], row["attempts"]) == ("dead", "exhausted", 1500, 1)


def stale_ticket(con: sqlite3.Connection, held: dict[str, Any], case: str) -> tuple[dict[str, Any], int]:
    """A ticket and a ``now`` that must be refused, for each stale case of the spec."""
    ticket, now = dict(held), 2000
    if case == "missing":
        ticket["id"] = "nope"
    elif case in ("pending", "done", "dead"):
        con.execute("UPDATE jobs SET status = ? WHERE id = 'a'", (case,))
    elif case in ("qty", "token", "attempt", "lease_until"):
        ticket[case] += 1
    elif case == "owner":
        ticket["owner"] = "v"
    elif case == "now==lease_until":
        now = held["lease_until"]
    elif case == "now>lease_until":
        now = held["lease_until"] + 1
    elif case == "now==deadline":  # crafted: a deadline before the lease's end
        con.execute("UPDATE jobs SET deadline = 2000 WHERE id = 'a'")
    elif case == "now>deadline":
        con.execute("UPDATE jobs SET deadline = 1999 WHERE id = 'a'")
    return ticket, now


STALE_CASES = [
    "missing",
    "pending",
    "done",
    "dead",
    "qty",
    "owner",
    "token",
    "attempt",
    "lease_until",
    "now==lease_until",
    "now>lease_until",
    "now==deadline",
    "now>deadline",
]


@pytest.mark.parametrize("outcome", ["ok", "retry", "permanent"])
@pytest.mark.parametrize("case", STALE_CASES)
def test_finish_stale_ticket_is_false_and_changes_nothing(
    con: sqlite3.Connection, held: dict[str, Any], case: str, outcome: str
) -> None:
    ticket, now = stale_ticket(con, held, case)
    before = kids.dump(con)
    calls: list[str] = []
    assert finish(con, ticket, outcome, now, 0, calls.append) is False
    assert kids.dump(con) == before
    assert calls == []
    assert con.in_transaction is False


def test_finish_twice_is_stale_the_second_time(con: sqlite3.Connection, held: dict[str, Any]) -> None:
    assert finish(con, held, "ok", 2000) == "done"
    before = kids.dump(con)
    assert finish(con, held, "ok", 2001) is False
    assert kids.dump(con) == before


def test_finish_changes_only_its_own_job(con: sqlite3.Connection, held: dict[str, Any]) -> None:
    put(con, "b", now=1000)
    other = claim(con, "w", 1000)
    assert other is not None and other["id"] == "b"
    before_b = job(con, "b")
    assert finish(con, held, "ok", 2000) == "done"
    assert job(con, "b") == before_b


# --- step 6: redrive -------------------------------------------------------------------------------


@pytest.fixture
def dead(con: sqlite3.Connection) -> dict[str, Any]:
    put(con, "a", 5, now=1000, ttl=10_000, max_attempts=2)
    for now in (1000, 2000):
        ticket = claim(con, "w", now)
        assert ticket is not None
        finish(con, ticket, "retry", now + 1)
    assert job(con, "a")["status"] == "dead" and job(con, "a")["reason"] == "exhausted"
    return job(con, "a")


def test_redrive_audits_and_rearms_a_dead_job(con: sqlite3.Connection, dead: dict[str, Any]) -> None:
    assert redrive(con, "a", 50_000, 700, "ops-ticket-1") is True
    assert kids.dump(con)["redrives"] == [(1, "a", 2, 50_000, "ops-ticket-1")]
    assert job(con, "a") == {
        **dead,
        "status": "pending",
        "attempts": 0,
        "available_at": 50_000,
        "deadline": 50_700,
        "owner": None,
        "lease_until": None,
        "reason": None,
    }
    assert (job(con, "a")["qty"], job(con, "a")["max_attempts"], job(con, "a")["token"]) == (5, 2, 2)
    ticket = claim(con, "w", 50_000)
    assert ticket is not None and (ticket["token"], ticket["attempt"]) == (3, 1)
    assert con.in_transaction is False


def test_redrive_twice_writes_two_audit_rows(con: sqlite3.Connection, dead: dict[str, Any]) -> None:
    assert redrive(con, "a", 50_000, 1, "first") is True
    assert claim(con, "w", 50_001) is None  # swept: deadline
    assert redrive(con, "a", 50_002, 1, "second") is True
    assert [r[1:] for r in kids.dump(con)["redrives"]] == [("a", 2, 50_000, "first"), ("a", 2, 50_002, "second")]


@pytest.mark.parametrize("state", ["missing", "pending", "leased", "done"])
def test_redrive_of_a_missing_or_live_job_is_value_error(con: sqlite3.Connection, state: str) -> None:
    put(con, "a")
    if state in ("leased", "done"):
        ticket = claim(con, "w", 1000)
        assert ticket is not None
        if state == "done":
            assert finish(con, ticket, "ok", 1001) == "done"
    before = kids.dump(con)
    calls: list[str] = []
    with pytest.raises(ValueError):
        redrive(con, "b" if state == "missing" else "a", 2000, TTL, "note", calls.append)
    assert kids.dump(con) == before
    assert calls == []
    assert con.in_transaction is False


# --- step 7: run_once ------------------------------------------------------------------------------


def test_run_once_delivers_and_finishes(con: sqlite3.Connection) -> None:
    put(con, "a", 4)
    send, clock = Send(True), Clock(1000, 1010)
    result = run_once(con, "w", clock, send, 0.5)
    assert result == {"id": "a", "token": 1, "status": "done"}
    assert type(result) is dict
    assert send.calls == [{"id": "a", "qty": 4}] and type(send.calls[0]) is dict
    assert clock.calls == 2
    row = job(con, "a")
    assert (row["status"], row["available_at"], row["owner"], row["attempts"]) == ("done", 1010, None, 1)
    assert con.in_transaction is False


def test_run_once_default_lease_and_given_lease(con: sqlite3.Connection) -> None:
    put(con, "a")
    put(con, "b")
    seen: list[dict[str, Any] | None] = []
    assert run_once(con, "w", Clock(1000, 1000), Send(action=lambda m: seen.append(job(con, "a"))), 1) is not None
    assert run_once(con, "w", Clock(1000, 1000), Send(action=lambda m: seen.append(job(con, "b"))), 1, 250)
    assert [r["lease_until"] for r in seen if r] == [2000, 1250]


def test_run_once_with_nothing_to_do_returns_none_without_send(con: sqlite3.Connection) -> None:
    send, clock = Send(True), Clock(1000)
    assert run_once(con, "w", clock, send, 1) is None
    assert send.calls == [] and clock.calls == 1
    put(con, "a", now=5000)
    assert run_once(con, "w", Clock(4999), send, 1) is None
    assert send.calls == []
    assert con.in_transaction is False


def test_run_once_sweep_only_returns_none_and_keeps_the_sweep(con: sqlite3.Connection) -> None:
    put(con, "a", now=1000, ttl=10)
    send = Send(True)
    assert run_once(con, "w", Clock(2000), send, 1) is None
    assert send.calls == []
    assert (job(con, "a")["status"], job(con, "a")["reason"]) == ("dead", "deadline")


class Truthy:
    def __bool__(self) -> bool:
        return True


@pytest.mark.parametrize("answer", [1, "True", None, Truthy(), False, 1.0, [True], {"ok": True}])
def test_run_once_any_answer_but_true_is_bad_ack_and_stays_leased(con: sqlite3.Connection, answer: object) -> None:
    put(con, "a")
    clock = Clock(1000, 1001)
    with pytest.raises(BadAck):
        run_once(con, "w", clock, Send(answer), 1)
    assert clock.calls == 1  # an error is not followed by the second reading
    row = job(con, "a")
    assert (row["status"], row["owner"], row["token"], row["lease_until"]) == ("leased", "w", 1, 2000)
    assert con.in_transaction is False


@pytest.mark.parametrize("jitter", [0, 0.5, 1, 0.37])
@pytest.mark.parametrize("attempt", [1, 2])
def test_run_once_retryable_is_pending_with_backoff(con: sqlite3.Connection, jitter: float, attempt: int) -> None:
    put(con, "a", now=0, ttl=TTL, max_attempts=3)
    if attempt == 2:
        assert claim(con, "earlier", 0, 10) is not None  # its lease expires at 10
    clock = Clock(1000, 1234)
    result = run_once(con, "w", clock, Send(Retryable("busy")), jitter)
    assert result == {"id": "a", "token": attempt, "status": "pending"}
    row = job(con, "a")
    expected = 1234 + retry_delay(attempt, 100, 1000, jitter)
    assert (row["status"], row["reason"], row["available_at"]) == ("pending", "retry", expected)


def test_run_once_retry_delay_ignores_a_delay_carried_by_the_error(con: sqlite3.Connection) -> None:
    put(con, "a")
    assert run_once(con, "w", Clock(1000, 1000), Send(Retryable("later", delay_ms=30_000)), 1)
    assert job(con, "a")["available_at"] == 1000 + retry_delay(1, 100, 1000, 1)


def test_run_once_retry_delay_uses_the_capped_backoff(con: sqlite3.Connection) -> None:
    put(con, "a", now=0, ttl=TTL, max_attempts=16)
    con.execute("UPDATE jobs SET attempts = 9, token = 9 WHERE id = 'a'")
    assert run_once(con, "w", Clock(1000, 1000), Send(Retryable()), 1) == {"id": "a", "token": 10, "status": "pending"}
    assert job(con, "a")["available_at"] == 2000  # min(1000, 100 * 2**9)


def test_run_once_retryable_at_the_budget_is_dead_exhausted(con: sqlite3.Connection) -> None:
    put(con, "a", max_attempts=1)
    assert run_once(con, "w", Clock(1000, 1001), Send(Retryable()), 1) == {"id": "a", "token": 1, "status": "dead"}
    assert (job(con, "a")["reason"], job(con, "a")["available_at"]) == ("exhausted", 1001)


def test_run_once_retryable_past_the_deadline_is_dead_deadline(con: sqlite3.Connection) -> None:
    put(con, "a", now=1000, ttl=150)
    assert run_once(con, "w", Clock(1000, 1050), Send(Retryable()), 1) == {"id": "a", "token": 1, "status": "dead"}
    assert (job(con, "a")["reason"], job(con, "a")["available_at"]) == ("deadline", 1050)


def test_run_once_permanent_is_dead_permanent(con: sqlite3.Connection) -> None:
    put(con, "a")
    assert run_once(con, "w", Clock(1000, 1001), Send(Permanent("no")), 1) == {"id": "a", "token": 1, "status": "dead"}
    assert (job(con, "a")["reason"], job(con, "a")["available_at"]) == ("permanent", 1001)


@pytest.mark.parametrize("error", [OSError("net down"), KeyError("x"), ValueError("v"), Conflict("c"), BadAck("b")])
def test_run_once_other_errors_propagate_and_the_job_stays_leased(con: sqlite3.Connection, error: Exception) -> None:
    put(con, "a")
    clock = Clock(1000, 1001)
    with pytest.raises(type(error)) as raised:
        run_once(con, "w", clock, Send(error), 1)
    assert raised.value is error
    assert clock.calls == 1
    row = job(con, "a")
    assert (row["status"], row["owner"], row["token"]) == ("leased", "w", 1)
    assert con.in_transaction is False


@pytest.mark.parametrize("answer", [True, Retryable(), Permanent()])
@pytest.mark.parametrize("second", [999, -1, True, 1001.0, None, "1001", 10**15 - 59_999, 10**16])
def test_run_once_bad_second_clock_is_value_error_and_the_claim_stays(
    con: sqlite3.Connection, answer: object, second: object
) -> None:
    put(con, "a")
    with pytest.raises(ValueError):
        run_once(con, "w", Clock(1000, second), Send(answer), 1)
    row = job(con, "a")
    assert (row["status"], row["owner"], row["token"], row["lease_until"]) == ("leased", "w", 1, 2000)
    assert con.in_transaction is False


def test_run_once_equal_second_clock_is_fine(con: sqlite3.Connection) -> None:
    put(con, "a")
    assert run_once(con, "w", Clock(1000, 1000), Send(), 1) == {"id": "a", "token": 1, "status": "done"}


def test_run_once_late_second_clock_reports_stale(con: sqlite3.Connection) -> None:
    put(con, "a")
    before_finish: list[dict[str, Any]] = []
    send = Send(action=lambda m: before_finish.append(kids.dump(con)))
    assert run_once(con, "w", Clock(1000, 2000), send, 1) == {"id": "a", "token": 1, "status": "stale"}
    assert kids.dump(con) == before_finish[0]


def test_run_once_sends_a_new_dict_each_time(con: sqlite3.Connection) -> None:
    put(con, "a", 1)
    put(con, "b", 2)
    kept: list[dict[str, Any]] = []
    send = Send(action=kept.append)
    run_once(con, "w", Clock(1000, 1000), send, 1)
    run_once(con, "w", Clock(1000, 1000), send, 1)
    assert kept == [{"id": "a", "qty": 1}, {"id": "b", "qty": 2}]
    assert kept[0] is not kept[1]
    assert all(type(m) is dict for m in kept)


def test_run_once_send_mutating_its_dict_does_not_touch_the_ticket(con: sqlite3.Connection) -> None:
    put(con, "a", 3)

    def vandal(message: dict[str, Any]) -> None:
        message["id"], message["qty"], message["owner"], message["token"] = "zzz", 999, "evil", 42
        message.pop("id")

    assert run_once(con, "w", Clock(1000, 1001), Send(action=vandal), 1) == {"id": "a", "token": 1, "status": "done"}
    assert (job(con, "a")["status"], job(con, "a")["qty"]) == ("done", 3)


def test_run_once_send_can_write_through_another_connection(con: sqlite3.Connection, path: Path) -> None:
    put(con, "a")
    in_send: list[bool] = []

    def enqueue_elsewhere(message: dict[str, Any]) -> None:
        in_send.append(con.in_transaction)
        other = sqlite3.connect(path, isolation_level=None, timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")  # fails at once if the caller held a write lock
            other.execute("ROLLBACK")
            second = open_queue(path)
            try:
                assert enqueue(second, {"id": "from-send", "qty": 1}, 1000, TTL) is True
            finally:
                second.close()
        finally:
            other.close()

    assert run_once(con, "w", Clock(1000, 1001), Send(action=enqueue_elsewhere), 1) == {
        "id": "a",
        "token": 1,
        "status": "done",
    }
    assert in_send == [False]
    assert job(con, "from-send")["status"] == "pending"


def test_run_once_send_runs_outside_any_lock_even_in_another_thread(con: sqlite3.Connection, path: Path) -> None:
    put(con, "a")
    started, result = threading.Event(), []

    def writer() -> None:
        started.wait(10)
        other = sqlite3.connect(path, isolation_level=None, timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("COMMIT")
            result.append("ok")
        except sqlite3.Error as exc:
            result.append(str(exc))
        finally:
            other.close()

    thread = threading.Thread(target=writer)
    thread.start()

    def send(message: dict[str, Any]) -> bool:
        started.set()
        thread.join(10)
        return True

    assert run_once(con, "w", Clock(1000, 1001), send, 1) is not None
    assert result == ["ok"]


# --- step 8: run_file ------------------------------------------------------------------------------


def fds_to(path: Path) -> list[str]:
    """This process's file descriptors open on ``path`` (Linux /proc)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                found.append(fd)
        except OSError:
            continue
    return found


@pytest.fixture
def file_queue(path: Path) -> Path:
    setup = open_queue(path)
    put(setup, "a", 2)
    setup.close()
    assert fds_to(path) == []
    return path


def test_run_file_runs_once_and_closes_its_connection(file_queue: Path) -> None:
    during: list[list[str]] = []
    send = Send(action=lambda m: during.append(fds_to(file_queue)))
    assert run_file(file_queue, "w", Clock(1000, 1001), send, 1) == {"id": "a", "token": 1, "status": "done"}
    assert during and during[0] != [], "the probe must see the connection while it is open"
    assert fds_to(file_queue) == []
    assert kids.row(file_queue, "a")["status"] == "done"  # type: ignore[index]


def test_run_file_accepts_a_str_path_and_returns_none_when_idle(file_queue: Path) -> None:
    send = Send()
    assert run_file(str(file_queue), "w", Clock(0), send, 1) is None
    assert send.calls == []
    assert fds_to(file_queue) == []


@pytest.mark.parametrize("failure", ["send", "clock", "bad-ack"])
def test_run_file_closes_its_connection_on_failure(file_queue: Path, failure: str) -> None:
    error = OSError("boom")
    send = Send(error if failure == "send" else "yes" if failure == "bad-ack" else True)
    clock = Clock(1000, 5 if failure == "clock" else 1001)
    with pytest.raises((OSError, ValueError, BadAck)) as raised:
        run_file(file_queue, "w", clock, send, 1)
    if failure == "send":
        assert raised.value is error
    assert fds_to(file_queue) == []
    assert kids.row(file_queue, "a")["status"] == "leased"  # type: ignore[index]


def test_run_file_closes_its_connection_on_bad_input(file_queue: Path) -> None:
    with pytest.raises(ValueError):
        run_file(file_queue, "w", Clock(1000), Send(), 2)
    with pytest.raises(ValueError):
        run_file(file_queue, "w", Clock(-1), Send(), 1)
    assert fds_to(file_queue) == []
    assert kids.row(file_queue, "a")["status"] == "pending"  # type: ignore[index]


@pytest.mark.parametrize("kind", ["missing", "missing-dir", "directory", "dangling-symlink", "fifo"])
def test_run_file_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "queue.db"
    if kind == "missing-dir":
        target = tmp_path / "nowhere" / "queue.db"
    elif kind == "directory":
        target.mkdir()
    elif kind == "dangling-symlink":
        target.symlink_to(tmp_path / "elsewhere.db")
    elif kind == "fifo":
        os.mkfifo(target)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    send, clock = Send(), Clock(1000, 1001)
    with pytest.raises(FileNotFoundError):
        run_file(target, "w", clock, send, 1)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert send.calls == [] and clock.calls == 0


@pytest.mark.parametrize("name", ["", ":memory:"])
def test_run_file_refuses_names_of_no_file_with_file_not_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # Step 8: "refuses a path that is not an existing regular file with FileNotFoundError". Neither ""
    # nor ":memory:" (absent from the working directory) names an existing regular file.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError):
        run_file(name, "w", Clock(1000, 1001), Send(), 1)
    assert list(tmp_path.iterdir()) == []


def test_run_file_accepts_a_symlink_to_a_queue(file_queue: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.db"
    link.symlink_to(file_queue)
    assert run_file(link, "w", Clock(1000, 1001), Send(), 1) == {"id": "a", "token": 1, "status": "done"}


def test_module_exports_the_contract() -> None:
    for name in ("Conflict", "Retryable", "Permanent", "BadAck", "retry_delay", "open_queue", "enqueue", "claim"):
        assert hasattr(lease, name)
    for name in ("finish", "redrive", "run_once", "run_file"):
        assert callable(getattr(lease, name))
