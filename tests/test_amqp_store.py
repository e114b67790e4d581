"""The idempotent consumer's rule for one delivery, on a real SQLite file (no broker needed)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncq.errors import Permanent
from asyncq.store.sqlite.amqp import Delivery, Outcome, list_dead, open_store, process_delivery

pytestmark = pytest.mark.timeout(10)
LIMIT = 3


class Crash(BaseException):
    """Stands for the process dying inside the effect: nothing after it runs."""


@pytest.fixture
def con(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    con = open_store(tmp_path / "app.db")
    con.execute("CREATE TABLE tickets (id TEXT NOT NULL)")
    yield con
    con.close()


def issue(db: sqlite3.Connection, delivery: Delivery) -> None:
    db.execute("INSERT INTO tickets VALUES (?)", (delivery.key,))


def fail(db: sqlite3.Connection, delivery: Delivery) -> None:
    issue(db, delivery)
    raise RuntimeError("printer jammed")


def refuse(db: sqlite3.Connection, d: Delivery) -> None:
    issue(db, d)
    raise Permanent("no such workshop")


def delivery(key: str | None = "R-1", *, redelivered: bool = False, count: int | None = None) -> Delivery:
    return Delivery(key, b'{"id": "R-1"}', "q", redelivered, count, {"h": "v"}, "application/json")


def process(con: sqlite3.Connection, d: Delivery, effect=issue) -> Outcome:  # type: ignore[no-untyped-def]
    return process_delivery(con, d, effect, delivery_limit=LIMIT, now=1_000)


def tickets(con: sqlite3.Connection) -> int:
    return int(con.execute("SELECT count(*) FROM tickets").fetchone()[0])


def keys(con: sqlite3.Connection) -> int:
    return int(con.execute("SELECT count(*) FROM asyncq_amqp_completed").fetchone()[0])


def test_effect_and_key_commit_together_and_a_redelivery_is_a_duplicate(con: sqlite3.Connection) -> None:
    assert process(con, delivery()) is Outcome.COMPLETED
    assert (tickets(con), keys(con)) == (1, 1)
    assert process(con, delivery(redelivered=True)) is Outcome.DUPLICATE
    assert process(con, delivery()) is Outcome.DUPLICATE  # published twice, not redelivered
    assert (tickets(con), keys(con)) == (1, 1)
    assert Outcome.DUPLICATE.acks and not Outcome.RETRY.acks


def test_a_failing_effect_rolls_back_with_its_key_and_is_retried(con: sqlite3.Connection) -> None:
    assert process(con, delivery(), fail) is Outcome.RETRY
    assert (tickets(con), keys(con)) == (0, 0)
    assert process(con, delivery(redelivered=True)) is Outcome.COMPLETED
    assert (tickets(con), keys(con)) == (1, 1)
    assert con.execute("SELECT count(*) FROM asyncq_amqp_attempts").fetchone()[0] == 0


def test_past_the_delivery_limit_the_message_is_parked_with_its_reason(con: sqlite3.Connection) -> None:
    assert process(con, delivery(), fail) is Outcome.RETRY
    for _ in range(LIMIT - 1):
        assert process(con, delivery(redelivered=True), fail) is Outcome.RETRY
    assert process(con, delivery(redelivered=True), fail) is Outcome.PARKED
    (dead,) = list_dead(con)
    assert dead.key == "R-1" and dead.deliveries == LIMIT + 1 and dead.queue == "q"
    assert "delivery limit 3 exceeded" in dead.reason and "RuntimeError: printer jammed" in dead.reason
    assert (dead.body, dead.headers, dead.content_type) == (b'{"id": "R-1"}', {"h": "v"}, "application/json")
    assert (tickets(con), keys(con)) == (0, 0)
    # the ack of the parking was lost: the redelivery is answered as parked again, once
    assert process(con, delivery(redelivered=True)) is Outcome.PARKED
    assert len(list_dead(con)) == 1 and tickets(con) == 0


def test_a_message_that_crashes_the_process_is_still_counted(con: sqlite3.Connection) -> None:
    def crash(db: sqlite3.Connection, d: Delivery) -> None:
        raise Crash

    with pytest.raises(Crash):
        process(con, delivery(), crash)
    for _ in range(LIMIT - 1):
        with pytest.raises(Crash):
            process(con, delivery(redelivered=True), crash)
    assert process(con, delivery(redelivered=True), crash) is Outcome.PARKED
    assert "last error: none seen" in list_dead(con)[0].reason


def test_a_quorum_queues_delivery_count_is_honoured(con: sqlite3.Connection) -> None:
    assert process(con, delivery(redelivered=True, count=LIMIT), fail) is Outcome.PARKED
    assert list_dead(con)[0].deliveries == LIMIT + 1


def test_permanent_and_keyless_messages_are_parked_at_once(con: sqlite3.Connection) -> None:
    assert process(con, delivery("R-2"), refuse) is Outcome.PARKED
    assert process(con, delivery(None)) is Outcome.PARKED
    reasons = [dead.reason for dead in list_dead(con)]
    assert reasons == ["permanent: no such workshop", "no message id to use as completion key"]
    assert (tickets(con), keys(con)) == (0, 0)


def test_a_parked_key_published_again_runs_and_leaves_the_dead_list(con: sqlite3.Connection) -> None:
    process(con, delivery("R-3"), refuse)
    assert len(list_dead(con)) == 1
    assert process(con, delivery("R-3")) is Outcome.COMPLETED
    assert list_dead(con) == [] and tickets(con) == 1
