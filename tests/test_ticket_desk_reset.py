"""``python3 desk.py reset`` lays out the seed's starting point from wherever a learner left off: the
ack-first ``handler.py``, a fresh store with Mina Patel's ticket, an empty queue, and it says so. It
refuses, changing nothing, when the broker does not answer or a worker holds the store's transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from rabbit_support import amqp_url
from ticket_desk_support import TicketDesk, import_example

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(90)]
__all__ = ["amqp_url"]  # the fixture, imported for pytest

NOWHERE = "amqp://guest:guest@127.0.0.1:1/"  # nothing listens on port 1
LEARNERS_HANDLER = "# my own try\nfrom common import checkpoint\ndef handle(ch, delivery, job, db, pause):\n    pass\n"


@pytest.fixture
def desk(tmp_path: Path, amqp_url: str) -> Iterator[TicketDesk]:
    """A fresh ticket desk with the site running."""
    desk = TicketDesk(tmp_path, amqp_url)
    try:
        desk.start_site()
        yield desk
    finally:
        desk.close()


def fresh_rows(tmp_path: Path) -> tuple[list[str], dict[str, list[tuple[object, ...]]]]:
    """The tables and rows of a store created from nothing."""
    store = import_example("store")
    path = tmp_path / "fresh" / "nightjar.db"
    path.parent.mkdir()
    store.connect(path).close()
    return tables(path), rows(path)


def tables(path: Path) -> list[str]:
    with sqlite3.connect(path) as con:
        return sorted(name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))


def rows(path: Path) -> dict[str, list[tuple[object, ...]]]:
    with sqlite3.connect(path) as con:
        names = ("registrations", "tickets", "completed", "outbox", "sqlite_sequence")
        return {name: con.execute(f"SELECT * FROM {name} ORDER BY 1").fetchall() for name in names}


def used_desk(desk: TicketDesk) -> None:
    """Where a learner might leave off: tickets by both workers, a ready registration, one held by a paused
    worker, and their own handler.py."""
    for name in ("Normal guest", "Retry guest"):
        desk.register(name)
    consumer = desk.start("consumer.py")  # tickets both, and creates asyncq's tables in the store
    consumer.expect("Consuming ")
    desk.wait_for_counts(0, 0)
    assert consumer.interrupt() == 0
    desk.register("Same name")
    desk.register("Same name")
    (desk.folder / "handler.py").write_text(LEARNERS_HANDLER)


def test_reset_lays_out_the_seeds_starting_point_and_says_so(desk: TicketDesk, tmp_path: Path) -> None:
    used_desk(desk)
    held = desk.paused_worker("before-write", handler="handler_no_key")  # holds R-0004, unacknowledged
    desk.wait_for_counts(1, 1)
    before = rows(desk.db_path)

    code, lines, stderr = desk.desk("reset")
    assert code == 0, stderr
    kept = desk.db_path.with_name("nightjar.before-reset.db")
    assert lines == [
        "Reset to the seed's starting point:",
        "  handler.py: the original handler, which acknowledges before it writes (cat handler.py shows it)",
        f"  store {desk.db_path}: fresh, with Mina Patel's registration R-0001 and her ticket #1",
        f"  queue {desk.queue}: empty, 0 ready (deleted and declared again)",
        "The shipped handler.py is the safe one: the lesson's third block (or git checkout handler.py) brings it back.",
        "Your previous handler.py is kept as handler.py.before-reset.",
        f"The previous store is kept as {kept}.",
    ]
    assert (desk.folder / "handler.py").read_text() == (desk.folder / "handler_ack_first.py").read_text()
    assert (desk.folder / "handler.py.before-reset").read_text() == LEARNERS_HANDLER
    assert (tables(desk.db_path), rows(desk.db_path)) == fresh_rows(tmp_path)
    assert rows(kept) == before

    assert held.interrupt() == 130  # its delivery went with the deleted queue
    assert desk.worker() == ["No ready registrations"]
    desk.wait_for_counts(0, 0)

    registration_id, page = desk.register("Normal guest")  # the running site carries on, from R-0002
    assert registration_id == "R-0002" and "Your ticket is being prepared" in page
    assert desk.worker() == ["Received R-0002 redelivered=False", "Handler returned."]
    assert desk.tickets("R-0002") == [(2, "Normal guest")] and not desk.completed("R-0002")  # ack-first: no key


def test_a_second_reset_keeps_the_first_backup_of_the_safe_handler(desk: TicketDesk) -> None:
    shipped = (desk.folder / "handler.py").read_text()
    assert desk.desk("reset").code == 0
    code, lines, _ = desk.desk("reset")
    assert code == 0
    assert not any(line.startswith("Your previous handler.py") for line in lines)  # it was the starting one
    assert (desk.folder / "handler.py.before-reset").read_text() == shipped


def assert_refused(desk: TicketDesk, refusal: str, **env: str) -> None:
    """``desk.py reset`` exits 1 with one line starting ``refusal`` and changes nothing."""
    handler = (desk.folder / "handler.py").read_text()
    before = rows(desk.db_path)
    counts = desk.counts()
    code, lines, stderr = desk.run("desk.py", "reset", **env)
    assert code == 1 and lines == []
    (line,) = stderr.splitlines()
    assert line.startswith(refusal), line
    assert (desk.folder / "handler.py").read_text() == handler
    assert rows(desk.db_path) == before
    assert desk.counts() == counts
    assert not desk.db_path.with_name("nightjar.before-reset.db").exists()
    assert not (desk.folder / "handler.py.before-reset").exists()


def test_reset_refuses_when_the_broker_does_not_answer(desk: TicketDesk) -> None:
    desk.register("Normal guest")
    desk.wait_for_counts(1, 0)
    assert_refused(desk, "Refusing: RabbitMQ does not answer at amqp://guest:guest@127.0.0.1:1/", AMQP_URL=NOWHERE)


def test_reset_refuses_while_a_worker_holds_the_store(desk: TicketDesk) -> None:
    desk.register("Same name")
    worker = desk.paused_worker("inside-transaction")
    desk.wait_for_counts(0, 1)
    assert_refused(desk, "Refusing: a worker holds the store's write transaction", TICKET_DESK_BUSY_TIMEOUT="0.5")
    assert worker.interrupt() == 130
    desk.wait_for_counts(1, 0)
