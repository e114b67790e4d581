"""Chaos: 300 registrations, and asyncq's idempotent consumer (``consumer.py``) SIGKILLed again and again.

Registrations go through the real site and its outbox relay. The consumer is killed 50-200 ms after it
reports that it is consuming (mid-transaction, between COMMIT and ack, wherever it happens to be),
restarted a bounded number of times, then left to drain. Afterwards every registration has exactly one
ticket, nothing is ready or unacknowledged, nothing is parked, and the redeliveries are counted.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from rabbit_support import amqp_url
from ticket_desk_support import Child, TicketDesk
from waiting import eventually_sync

# A longer run for the folder's README: ASYNCQ_CHAOS_REGISTRATIONS=2000 ASYNCQ_CHAOS_KILLS=30 pytest -s this file.
REGISTRATIONS = int(os.environ.get("ASYNCQ_CHAOS_REGISTRATIONS", "300"))
KILLS = int(os.environ.get("ASYNCQ_CHAOS_KILLS", "6"))

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(120 + REGISTRATIONS // 10 + KILLS * 2)]
__all__ = ["amqp_url"]  # the fixture, imported for pytest
CONSUMER = ("consumer.py", "--verbose", "--prefetch", "20", "--concurrency", "4")


def ticket_counts(desk: TicketDesk) -> Counter[str]:
    with desk.db() as con:
        return Counter(rid for (rid,) in con.execute("SELECT registration_id FROM tickets"))


def dead_and_attempts(desk: TicketDesk) -> tuple[int, int]:
    with desk.db() as con:
        try:
            dead = con.execute("SELECT count(*) FROM asyncq_amqp_dead").fetchone()[0]
            attempts = con.execute("SELECT count(*) FROM asyncq_amqp_attempts").fetchone()[0]
        except sqlite3.OperationalError:  # the consumer never got as far as creating its tables
            return 0, 0
    return int(dead), int(attempts)


def outcome_lines(child: Child) -> list[list[str]]:
    """``[key, outcome, redelivered=…]`` for each answered delivery the child printed."""
    return [line.split() for line in child.lines if line.startswith("R-")]


def test_sigkilled_consumer_leaves_exactly_one_ticket_per_registration(
    tmp_path: Path, amqp_url: str, record_property: pytest.RecordProperty
) -> None:
    desk = TicketDesk(tmp_path, amqp_url)
    seed = random.randrange(1 << 30)
    pause = random.Random(seed)
    answered: list[list[str]] = []
    try:
        desk.start_site()
        with ThreadPoolExecutor(8) as pool:
            ids = sorted(rid for rid, _ in pool.map(desk.register, [f"Guest {n}" for n in range(REGISTRATIONS)]))
        assert ids == [f"R-{n:04d}" for n in range(2, REGISTRATIONS + 2)]

        for _ in range(KILLS):
            child = desk.start(*CONSUMER)
            child.expect("Consuming ")
            time.sleep(pause.uniform(0.05, 0.2))  # the chaos itself: a kill at a random moment
            child.process.kill()
            child.wait()
            answered += outcome_lines(child)

        drain = desk.start(*CONSUMER)
        drain.expect("Consuming ")
        eventually_sync(
            lambda: len(ticket_counts(desk)) == REGISTRATIONS + 1,
            "a ticket for every one",
            timeout=60 + REGISTRATIONS // 20,
        )
        eventually_sync(lambda: desk.counts() == (0, 0), "no ready or unacknowledged message", timeout=30)
        drain.process.terminate()  # SIGTERM: graceful stop
        assert drain.wait() == 0
        answered += outcome_lines(drain)
    finally:
        desk.close()

    counts = ticket_counts(desk)
    assert set(counts) == {"R-0001", *ids}
    assert set(counts.values()) == {1}, {rid: n for rid, n in counts.items() if n != 1}
    assert desk.tickets("R-0001") == [(1, "Mina Patel")]
    assert desk.counts() == (0, 0)
    assert dead_and_attempts(desk) == (0, 0)

    redelivered = sum(1 for line in answered if line[2] == "redelivered=True")
    duplicates = sum(1 for line in answered if line[1] == "duplicate")
    report = {
        "seed": seed,
        "kills": KILLS,
        "answers_seen": len(answered),
        "redelivered": redelivered,
        "duplicates_acked_without_effect": duplicates,
        "stopped_line": drain.lines[-1],
    }
    record_property("chaos", report)
    print(f"chaos report: {report}")
    assert redelivered >= duplicates
