"""Real concurrent claims: 2, 4 and 8 child processes, started once and reused for hundreds of rounds,
are released together on a shared pipe to claim a one-job queue.

Each round: exactly one winner; every other child either saw the job already leased (``None``) or
reported its error (only ``database is locked`` is acceptable, and it must be reported, never hidden as
``None``). The row then shows exactly one claim (token 1), by the winner.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncq.lab.lease import enqueue, open_queue

try:
    import lease_children as kids
except ImportError:  # tests/ imported as a package
    from tests import lease_children as kids

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(("processes", "rounds"), [(2, 200), (4, 100), (8, 60)])
def test_exactly_one_winner_per_round(
    tmp_path: Path, record_property: Callable[[str, object], None], processes: int, rounds: int
) -> None:
    path = tmp_path / "queue.db"
    con = open_queue(path)
    release_read, release_write = os.pipe()
    children: list[subprocess.Popen[bytes]] = []
    tally: Counter[str] = Counter()
    try:
        for n in range(processes):
            config = {"db": str(path), "owner": f"w{n}", "release_fd": release_read}
            children.append(kids.spawn("claimer", config, tmp_path, pass_fds=[release_read]))
        os.close(release_read)
        release_read = -1
        lines = [kids.Lines(child, tmp_path) for child in children]
        for round_no in range(rounds):
            now = 1000 + round_no
            con.execute("DELETE FROM jobs")
            assert enqueue(con, {"id": f"job-{round_no}", "qty": 1}, now, 60_000) is True
            for child in children:
                kids.send_line(child, str(now))
            for reader in lines:
                assert reader.read() == '"ready"'
            os.write(release_write, b"x" * processes)  # every child is blocked on this pipe: all go at once
            reports = [reader.json() for reader in lines]
            check_round(con, round_no, reports, tally)
    finally:
        os.close(release_write)
        if release_read >= 0:
            os.close(release_read)
        for child in children:
            kids.finish_child(child)
        con.close()
    record_property("tally", dict(tally))
    assert tally["winner"] == rounds
    assert tally["winner"] + tally["none"] + tally["locked"] == processes * rounds


def check_round(con: object, round_no: int, reports: list[dict[str, object]], tally: Counter[str]) -> None:
    winners = [r["ticket"] for r in reports if r.get("ticket")]
    nones = [r for r in reports if "ticket" in r and r["ticket"] is None]
    errors = [r for r in reports if "error" in r]
    assert len(winners) + len(nones) + len(errors) == len(reports)
    for error in errors:  # reported, not hidden; and nothing else than a busy database
        assert (error["error"], error["message"]) == ("OperationalError", "database is locked"), error
    assert all(r["in_transaction"] is False for r in reports)
    assert len(winners) == 1, reports
    (ticket,) = winners
    assert isinstance(ticket, dict)
    assert (ticket["id"], ticket["token"], ticket["attempt"]) == (f"job-{round_no}", 1, 1)
    found = kids.row(con, f"job-{round_no}")  # type: ignore[arg-type]
    assert found is not None
    # One claim happened (token 1), by the winner: every None saw the job already leased.
    assert (found["status"], found["token"], found["attempts"], found["owner"]) == ("leased", 1, 1, ticket["owner"])
    assert found["lease_until"] == ticket["lease_until"]
    tally["winner"] += 1
    tally["none"] += len(nones)
    tally["locked"] += len(errors)
