"""While ``worker.py --pause inside-transaction`` holds the store's write transaction open, every page of the
site and ``desk.py status`` still answer at once with the last committed rows; a registration answers 503
(the one writer is busy) instead of a 500, and the site's relay logs no ``database is locked``."""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from rabbit_support import amqp_url
from ticket_desk_support import TicketDesk

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(90)]
__all__ = ["amqp_url"]  # the fixture, imported for pytest

BUSY_TIMEOUT = 2.0  # the site's writes give up after this; reads must not wait at all
FAST = 1.0  # seconds: a read that waited on the writer's lock would take BUSY_TIMEOUT or fail
PAGES = (
    "/",
    "/explore",
    "/visit",
    "/evening",
    "/registrations",
    "/registrations/R-0001",
    "/registrations/R-0002",
    "/registrations/R-0003",
    "/tickets/1",
    "/tickets/1/download",
    "/tickets/2",
    "/tickets/2/download",
)


@pytest.fixture
def desk(tmp_path: Path, amqp_url: str) -> Iterator[TicketDesk]:
    """A desk whose site gives up a write after ``BUSY_TIMEOUT`` seconds."""
    desk = TicketDesk(tmp_path, amqp_url)
    desk.env["TICKET_DESK_BUSY_TIMEOUT"] = str(BUSY_TIMEOUT)
    try:
        desk.start_site()
        yield desk
    finally:
        desk.close()


def test_pages_and_status_answer_while_a_worker_is_paused_inside_its_transaction(desk: TicketDesk) -> None:
    desk.register("Normal guest")
    desk.worker()  # R-0002 has ticket #2
    desk.register("Same name")
    worker = desk.paused_worker("inside-transaction")  # R-0003: completion key written, not committed
    try:
        for path in PAGES:
            status, text, seconds = desk.fetch(path)
            assert status == 200, (path, status, text[:300])
            assert seconds < FAST, (path, seconds)
        assert "Your ticket is being prepared" in desk.fetch("/registrations/R-0003")[1]
        assert "Name: Normal guest" in desk.fetch("/tickets/2/download")[1]

        started = time.monotonic()
        code, lines, stderr = desk.desk("status")
        assert code == 0, stderr
        text = "\n".join(lines)
        assert re.search(r"R-0002\s+Normal guest\s+#2\s+yes", text)
        assert re.search(r"R-0003\s+Same name\s+none\s+no", text)  # the open transaction is not visible
        assert "Completion keys: 2" in text
        assert "unacknowledged: 1 (rabbitmqctl list_queues)" in text
        assert time.monotonic() - started < 10 + FAST, "status waited on the writer"
    finally:
        assert worker.interrupt() == 130
    assert desk.tickets("R-0003") == [] and not desk.completed("R-0003")


def test_a_registration_while_the_store_is_held_answers_503_and_stores_nothing(desk: TicketDesk) -> None:
    desk.register("Same name")
    worker = desk.paused_worker("inside-transaction")
    try:
        before = desk.all_rows()
        data = urllib.parse.urlencode({"name": "Late guest"}).encode()
        status, text, seconds = desk.fetch("/registrations", data)
        assert status == 503, text[:300]
        assert "The desk is busy" in text and 'value="Late guest"' in text  # the form keeps the name
        assert seconds < BUSY_TIMEOUT + 5
        assert desk.all_rows() == before
        assert desk.fetch("/registrations")[0] == 200  # and reads still work
    finally:
        assert worker.interrupt() == 130
    assert desk.site is not None
    assert "database is locked" not in desk.site.end()
