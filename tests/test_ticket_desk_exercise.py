"""The seed's whole exercise, step by step, on the real site, worker, desk, RabbitMQ and SQLite file.

Each test has its own store (Mina Patel's registration R-0001 and ticket #1 already in it) and its own
queue, so the first new registration is always R-0002. Ctrl+C is a real SIGINT to the worker, Enter a
newline through its stdin pipe.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from rabbit_support import amqp_url
from ticket_desk_support import TicketDesk

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(90)]
__all__ = ["amqp_url"]  # the fixture, imported for pytest

MINA = [(1, "Mina Patel")]
INTERRUPTED = 130


@pytest.fixture
def desk(tmp_path: Path, amqp_url: str) -> Iterator[TicketDesk]:
    """A fresh ticket desk with the site running."""
    desk = TicketDesk(tmp_path, amqp_url)
    try:
        desk.start_site()
        yield desk
    finally:
        desk.close()


def ticket_links(page: str) -> list[str]:
    """The "Open ticket" links of a registration page."""
    return re.findall(r'<a href="(/tickets/\d+)">Open ticket</a>', page)


def test_happy_path_register_work_open_and_download(desk: TicketDesk) -> None:
    home = desk.get("/")
    assert "Explore the evening" in home
    assert "Plan your visit" in desk.get("/explore")
    assert "The evening" in desk.get("/visit")
    evening = desk.get("/evening")
    assert "Guest name" in evening and "Register for the evening" in evening

    registration_id, page = desk.register("Normal guest")
    assert registration_id == "R-0002"
    assert "R-0002" in page and "Your ticket is being prepared" in page
    listing = desk.get("/registrations")
    assert "Your registrations" in listing and "Mina Patel" in listing and "Normal guest" in listing

    assert desk.worker() == ["Received R-0002 redelivered=False", "Handler returned."]

    (link,) = ticket_links(desk.get("/registrations/R-0002"))
    ticket_page = desk.get(link)
    assert "Download ticket" in ticket_page and "Back to registration" in ticket_page
    assert 'href="/registrations/R-0002">Back to registration' in ticket_page
    headers, text = desk.get_response(link + "/download")
    assert "attachment" in headers["Content-Disposition"]
    assert "Registration: R-0002" in text and "Name: Normal guest" in text

    (mina_link,) = ticket_links(desk.get("/registrations/R-0001"))
    assert "Name: Mina Patel" in desk.get(mina_link + "/download")
    assert desk.worker() == ["No ready registrations"]


def test_original_handler_acks_first_and_a_crash_loses_the_ticket(desk: TicketDesk) -> None:
    desk.register("Lost guest")
    worker = desk.paused_worker("before-write", handler="handler_ack_first")
    assert worker.interrupt() == INTERRUPTED
    assert desk.tickets("R-0002") == []
    desk.wait_for_counts(0, 0)  # an empty queue, and yet the work is lost
    assert desk.worker() == ["No ready registrations"]

    assert desk.desk("retry", "R-0002")[0] == 0  # the learner's explicit recovery
    assert desk.worker(handler="handler") == ["Received R-0002 redelivered=False", "Handler returned."]
    assert [name for _, name in desk.tickets("R-0002")] == ["Lost guest"]


def test_pause_then_enter_carries_on(desk: TicketDesk) -> None:
    desk.register("Patient guest")
    worker = desk.paused_worker("before-write")
    worker.send_enter()
    assert worker.wait() == 0
    assert worker.lines[-1] == "Handler returned."
    assert [name for _, name in desk.tickets("R-0002")] == ["Patient guest"]


def test_crash_before_write_is_redelivered_once_and_written_once(desk: TicketDesk) -> None:
    desk.register("Retry guest")
    worker = desk.paused_worker("before-write", handler="handler_no_key")
    assert worker.lines == ["Received R-0002 redelivered=False", "Paused before-write."]
    assert worker.interrupt() == INTERRUPTED
    assert desk.tickets("R-0002") == []
    assert "Your ticket is being prepared" in desk.get("/registrations/R-0002")

    lines = desk.worker(handler="handler_no_key")
    assert lines == ["Received R-0002 redelivered=True", "Handler returned."]
    assert [name for _, name in desk.tickets("R-0002")] == ["Retry guest"]
    assert len(ticket_links(desk.get("/registrations/R-0002"))) == 1
    desk.wait_for_counts(0, 0)


def test_crash_inside_the_transaction_rolls_back_ticket_and_key(desk: TicketDesk) -> None:
    desk.register("Same name")
    worker = desk.paused_worker("inside-transaction")
    assert worker.interrupt() == INTERRUPTED
    assert desk.tickets("R-0002") == []
    assert not desk.completed("R-0002")
    assert "Your ticket is being prepared" in desk.get("/registrations/R-0002")


def test_crash_after_commit_redelivery_writes_nothing_and_is_acked(desk: TicketDesk) -> None:
    desk.register("Same name")
    worker = desk.paused_worker("after-commit")
    assert len(ticket_links(desk.get("/registrations/R-0002"))) == 1  # committed while still paused
    desk.wait_for_counts(0, 1)
    assert worker.interrupt() == INTERRUPTED
    desk.wait_for_counts(1, 0)

    assert desk.worker() == ["Received R-0002 redelivered=True", "Handler returned."]
    assert [name for _, name in desk.tickets("R-0002")] == ["Same name"]
    assert desk.completed("R-0002")
    desk.wait_for_counts(0, 0)  # acknowledged, not left behind


def test_drain_gives_each_same_name_registration_its_own_ticket(desk: TicketDesk) -> None:
    assert desk.register("Same name")[0] == "R-0002"
    assert desk.register("Same name")[0] == "R-0003"
    lines = desk.worker("--drain")
    assert lines == [
        "Received R-0002 redelivered=False",
        "Handler returned.",
        "Received R-0003 redelivered=False",
        "Handler returned.",
        "No ready registrations",
    ]
    assert desk.tickets("R-0002") == [(2, "Same name")]
    assert desk.tickets("R-0003") == [(3, "Same name")]
    assert desk.tickets("R-0001") == MINA


def test_retry_of_a_completed_registration_changes_nothing(desk: TicketDesk) -> None:
    desk.register("Same name")
    desk.worker()
    before = desk.all_rows()

    code, lines, _ = desk.desk("retry", "R-0002")
    assert code == 0 and lines == ["Republished R-0002 (Same name) for redelivery."]
    assert desk.worker("--drain") == [
        "Received R-0002 redelivered=False",
        "Handler returned.",
        "No ready registrations",
    ]
    assert desk.all_rows() == before
    desk.wait_for_counts(0, 0)
    assert desk.desk("retry", "R-0099")[0] == 1


def test_status_reads_rows_and_both_queue_counts(desk: TicketDesk) -> None:
    desk.register("Normal guest")
    worker = desk.paused_worker("after-commit")
    desk.register("Waiting guest")
    code, lines, _ = desk.desk("status")
    assert code == 0
    text = "\n".join(lines)
    assert re.search(r"R-0001\s+Mina Patel\s+#1\s+yes", text)
    assert re.search(r"R-0002\s+Normal guest\s+#2\s+yes", text)
    assert re.search(r"R-0003\s+Waiting guest\s+none\s+no", text)
    assert "ready: 1 (AMQP passive declare)" in text
    assert "unacknowledged: 1 (rabbitmqctl list_queues)" in text
    assert worker.interrupt() == INTERRUPTED

    lines = desk.run("desk.py", "status", RABBITMQCTL="/nonexistent/rabbitmqctl").lines
    unacked = next(line for line in lines if "unacknowledged:" in line)
    assert "unknown" in unacked and ": 0" not in unacked


def test_repair_previews_then_fixes_a_duplicate_of_the_unsafe_handler(desk: TicketDesk) -> None:
    desk.register("Normal guest")
    desk.register("Other guest")
    worker = desk.paused_worker("after-commit", handler="handler_no_key")
    assert worker.interrupt() == INTERRUPTED
    desk.worker(handler="handler_no_key")  # the redelivery writes a second ticket
    desk.worker(handler="handler_no_key")  # R-0003, untouched by the repair
    assert [no for no, _ in desk.tickets("R-0002")] == [2, 3]
    desk.register("Waiting guest")  # R-0004 stays in the queue while the desk repairs
    before = desk.all_rows()

    code, lines, _ = desk.desk("repair", "R-0002")
    assert code == 0
    assert lines == [
        "Repair plan for R-0002 (Normal guest):",
        "  keep the earliest ticket: #2",
        "  remove extra tickets: #3",
        "  completion record: add R-0002",
        "Nothing changed. Run with --apply to apply this plan.",
    ]
    assert desk.all_rows() == before

    code, lines, _ = desk.desk("repair", "R-0002", "--apply")
    assert code == 0 and lines[-1] == "Applied in one transaction."
    assert desk.tickets("R-0002") == [(2, "Normal guest")]
    assert desk.completed("R-0002")
    assert desk.tickets("R-0001") == MINA and desk.tickets("R-0003") == [(4, "Other guest")]
    after = desk.all_rows()
    assert after["registrations"] == before["registrations"]
    assert [row for row in before["tickets"] if row[0] != 3] == after["tickets"]
    desk.wait_for_counts(1, 0)  # the repair consumed and acknowledged nothing

    assert desk.worker("--drain") == [
        "Received R-0004 redelivered=False",
        "Handler returned.",
        "No ready registrations",
    ]
    assert desk.desk("repair", "R-0002")[1][-1] == "Nothing to repair."


def test_repair_refuses_unknown_id_no_ticket_and_name_mismatch(desk: TicketDesk) -> None:
    desk.register("Normal guest")
    desk.worker()
    desk.register("No ticket yet")
    with desk.db() as con, con:
        con.execute("UPDATE tickets SET name = 'Someone else' WHERE registration_id = 'R-0002'")
    before = desk.all_rows()
    refusals = {
        "R-0099": "Refusing: there is no registration R-0099.",
        "R-0003": "Refusing: R-0003 has no ticket",
        "R-0002": "Refusing: R-0002 is registered for 'Normal guest' but has a ticket for 'Someone else'",
    }
    for registration_id, refusal in refusals.items():
        for args in (("repair", registration_id), ("repair", registration_id, "--apply")):
            code, lines, stderr = desk.desk(*args)
            assert code == 1 and lines == [] and stderr.startswith(refusal), (args, lines, stderr)
    assert desk.all_rows() == before
    desk.wait_for_counts(1, 0)  # R-0003's message is still waiting, untouched


def test_a_long_pause_keeps_the_connection_alive(desk: TicketDesk) -> None:
    """With a 1 s heartbeat RabbitMQ closes a silent connection after about 2 s. The worker stays paused
    for 4 s (the subject of this test is elapsed time), then Enter lets the handler ack on the same
    connection: only an event loop that kept heartbeating during the pause can still do that."""
    desk.register("Patient guest")
    worker = desk.start("worker.py", "--pause", "before-write", AMQP_URL=desk.env["AMQP_URL"] + "?heartbeat=1")
    worker.expect("Paused before-write.")
    with pytest.raises(subprocess.TimeoutExpired):
        worker.process.wait(timeout=4)
    worker.send_enter()
    assert worker.wait() == 0, worker.stderr()
    assert worker.lines == ["Received R-0002 redelivered=False", "Paused before-write.", "Handler returned."]
    desk.wait_for_counts(0, 0)
    assert [name for _, name in desk.tickets("R-0002")] == ["Patient guest"]
