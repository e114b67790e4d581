"""The ticket desk's rough edges, on the real broker: a misspelt pause point, what Ctrl+C says against what
RabbitMQ really shows, an absurd ticket number, and a broker that does not answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rabbit_support import amqp_url
from ticket_desk_support import TicketDesk

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(90)]
__all__ = ["amqp_url"]  # the fixture, imported for pytest

INTERRUPTED = 130
NOWHERE = "amqp://guest:guest@127.0.0.1:1/"  # nothing listens on port 1


@pytest.fixture
def desk(tmp_path: Path, amqp_url: str) -> Iterator[TicketDesk]:
    """A fresh ticket desk with the site running."""
    desk = TicketDesk(tmp_path, amqp_url)
    try:
        desk.start_site()
        yield desk
    finally:
        desk.close()


def test_an_unknown_pause_point_is_refused_with_one_line_and_nothing_taken(desk: TicketDesk) -> None:
    desk.register("Retry guest")
    desk.wait_for_counts(1, 0)
    for name in ("before_write", "inside", "After-commit", ""):
        code, lines, stderr = desk.run("worker.py", "--pause", name)
        assert code == 2 and lines == [], name
        assert stderr.splitlines() == [
            f"worker.py: error: unknown pause point {name!r}; the checkpoints are before-write, inside-transaction,"
            " after-commit"
        ]
    assert desk.tickets("R-0002") == []
    desk.wait_for_counts(1, 0)  # the registration was not taken


def test_a_pause_point_the_handler_lacks_runs_the_job_and_says_nothing_paused(desk: TicketDesk) -> None:
    desk.register("Retry guest")
    code, lines, stderr = desk.run("worker.py", "--pause", "inside-transaction", handler="handler_no_key")
    assert code == 0 and lines == ["Received R-0002 redelivered=False", "Handler returned."]
    assert stderr.splitlines() == ["Note: handler_no_key.py has no checkpoint 'inside-transaction', so nothing paused."]


def interrupted_line(desk: TicketDesk, pause: str, handler: str) -> str:
    """Ctrl+C a worker paused at ``pause``; its one stderr line (after exit status 130)."""
    worker = desk.paused_worker(pause, handler=handler)
    assert worker.interrupt() == INTERRUPTED
    (line,) = worker.stderr().splitlines()
    return line


def test_ctrl_c_after_the_ack_first_handler_acked_says_nothing_goes_back(desk: TicketDesk) -> None:
    desk.register("Lost guest")
    line = interrupted_line(desk, "before-write", "handler_ack_first")
    assert line == (
        "Interrupted; R-0002 was already acknowledged, so RabbitMQ has removed it and nothing goes back to the"
        " queue (python3 desk.py retry R-0002 republishes it)."
    )
    desk.wait_for_counts(0, 0)  # what the broker shows: nothing ready, nothing held
    assert desk.worker() == ["No ready registrations"]
    assert desk.tickets("R-0002") == []


def test_ctrl_c_before_the_ack_says_the_delivery_returns_and_it_does(desk: TicketDesk) -> None:
    desk.register("Retry guest")
    line = interrupted_line(desk, "before-write", "handler_no_key")
    assert line == (
        "Interrupted; R-0002 was not acknowledged, so RabbitMQ returns it to the queue now that the connection is"
        " closed (the next worker sees redelivered=True)."
    )
    desk.wait_for_counts(1, 0)
    assert desk.worker() == ["Received R-0002 redelivered=True", "Handler returned."]


def test_ctrl_c_inside_the_transaction_says_it_rolls_back_and_it_does(desk: TicketDesk) -> None:
    desk.register("Same name")
    line = interrupted_line(desk, "inside-transaction", "handler")
    assert line.startswith("Interrupted; R-0002 was not acknowledged, so RabbitMQ returns it")
    assert line.endswith("Its open SQLite transaction is rolled back: nothing it wrote is kept.")
    desk.wait_for_counts(1, 0)
    assert desk.tickets("R-0002") == [] and not desk.completed("R-0002")


def test_a_ticket_number_that_names_no_ticket_is_404(desk: TicketDesk) -> None:
    for number in ("999999999999999999999999", "9223372036854775808", "9223372036854775807", "0"):
        for path in (f"/tickets/{number}", f"/tickets/{number}/download"):
            status, text, _ = desk.fetch(path)
            assert status == 404, (path, text[:300])
            assert "There is no such ticket." in text


def test_status_with_the_broker_unreachable_invents_no_count(desk: TicketDesk) -> None:
    desk.register("Waiting guest")  # the queue exists on this machine's broker, with 1 ready and 0 unacked
    desk.wait_for_counts(1, 0)
    code, lines, stderr = desk.run("desk.py", "status", AMQP_URL=NOWHERE)
    assert code == 0 and stderr == ""
    ready = next(line for line in lines if line.startswith("  ready:"))
    unacked = next(line for line in lines if line.startswith("  unacknowledged:"))
    assert ready.startswith("  ready: unknown (broker unreachable:")
    assert unacked.startswith("  unacknowledged: unknown (not asked, broker unreachable:"), unacked


def test_each_command_says_once_that_the_broker_is_unreachable(tmp_path: Path, amqp_url: str) -> None:
    """One line of its own, exit status 1; no stray "error when creating transport" line from aiormq."""
    desk = TicketDesk(tmp_path, amqp_url)  # no site: nothing here needs it
    expected = {
        ("worker.py",): f"Cannot reach RabbitMQ at {NOWHERE}: ",
        ("consumer.py",): f"Cannot reach RabbitMQ at {NOWHERE}: ",
        ("desk.py", "retry", "R-0001"): "Could not republish R-0001: ",
    }
    for command, start in expected.items():
        code, lines, stderr = desk.run(*command, AMQP_URL=NOWHERE)
        assert code == 1 and lines == [], (command, lines)
        (line,) = stderr.splitlines()
        assert line.startswith(start), (command, stderr)
