"""``consumer.py`` and ``worker.py`` with ``handler.py`` follow one completion rule, the desk's ``completed``
table: whichever of them ticketed a registration, a redelivery through the other writes no second ticket.
On the real broker, with both workers on one queue."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from rabbit_support import amqp_url
from ticket_desk_support import Child, TicketDesk

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(120)]
__all__ = ["amqp_url"]  # the fixture, imported for pytest


@pytest.fixture
def desk(tmp_path: Path, amqp_url: str) -> Iterator[TicketDesk]:
    """A fresh ticket desk with the site running."""
    desk = TicketDesk(tmp_path, amqp_url)
    try:
        desk.start_site()
        yield desk
    finally:
        desk.close()


def consume_until_settled(desk: TicketDesk, *args: str) -> Child:
    """``consumer.py --verbose`` until the queue is empty and nothing is held, then Ctrl+C (exit 0)."""
    consumer = desk.start("consumer.py", "--verbose", *args)
    consumer.expect("Consuming ")
    desk.wait_for_counts(0, 0, timeout=30)
    assert consumer.interrupt() == 0, consumer.stderr()
    return consumer


def ticket_counts(desk: TicketDesk) -> Counter[str]:
    with desk.db() as con:
        return Counter(rid for (rid,) in con.execute("SELECT registration_id FROM tickets"))


def test_retry_of_a_handler_ticketed_id_through_the_consumer_writes_no_second_ticket(desk: TicketDesk) -> None:
    """The issue's steps: ``desk.py retry R-0004; consumer.py --verbose`` after the exercise."""
    desk.register("Same name")
    assert desk.worker() == ["Received R-0002 redelivered=False", "Handler returned."]
    before = desk.all_rows()
    assert desk.desk("retry", "R-0002").code == 0

    consumer = consume_until_settled(desk)
    assert "R-0002 already-ticketed redelivered=False" in consumer.lines
    assert consumer.lines[-1].startswith("Stopped: 1 delivered (0 redelivered), 0 tickets issued, 1 already ticketed")
    assert desk.all_rows() == before  # no second ticket, no other change to the desk's rows


def test_retry_of_a_consumer_ticketed_id_through_the_handler_writes_no_second_ticket(desk: TicketDesk) -> None:
    desk.register("Same name")
    consumer = consume_until_settled(desk)
    assert "R-0002 completed redelivered=False" in consumer.lines
    assert desk.tickets("R-0002") == [(2, "Same name")] and desk.completed("R-0002")
    before = desk.all_rows()

    assert desk.desk("retry", "R-0002").code == 0
    assert desk.worker() == ["Received R-0002 redelivered=False", "Handler returned."]
    assert desk.all_rows() == before
    desk.wait_for_counts(0, 0)


def test_both_workers_on_one_queue_with_every_id_retried_leave_one_ticket_each(desk: TicketDesk) -> None:
    ids = [desk.register(f"Guest {n}")[0] for n in range(10)]
    for registration_id in ids[:3]:  # handler.py tickets the first three
        assert desk.worker()[0] == f"Received {registration_id} redelivered=False"
    for registration_id in ids:  # every id once more: 7 first deliveries and 10 repeats
        assert desk.desk("retry", registration_id).code == 0
    desk.wait_for_counts(17, 0)

    consumer = desk.start("consumer.py", "--verbose", "--prefetch", "1", "--concurrency", "1")
    consumer.expect("Consuming ")
    handler_lines = desk.worker("--drain")  # both take from the queue at the same time
    desk.wait_for_counts(0, 0, timeout=30)
    assert consumer.interrupt() == 0, consumer.stderr()

    assert ticket_counts(desk) == Counter({"R-0001": 1, **dict.fromkeys(ids, 1)})
    assert all(desk.completed(registration_id) for registration_id in ids)
    taken_by_handler = sum(line.startswith("Received ") for line in handler_lines)
    taken_by_consumer = sum(line.startswith("R-") for line in consumer.lines)
    assert taken_by_handler + taken_by_consumer == 17
