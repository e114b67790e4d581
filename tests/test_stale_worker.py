"""A stale worker cannot undo a newer one: frozen past its lease with SIGSTOP, it wakes to find the job
re-claimed and delivered; its late POST is absorbed by the inbox and its finish is rejected."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import eventually

from asyncq import Queue
from asyncq.delivery.http import HttpTransport
from asyncq.inbox import spawn

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(60)


def inbox_rows(db: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT id, duplicates FROM asyncq_inbox").fetchall()


async def reclaim_and_deliver(db: Path, url: str) -> int:
    """The second worker: claim as soon as the frozen worker's lease has expired, deliver, finish."""
    async with await Queue.open(str(db)) as queue:
        # polled until the frozen worker's lease expires (real time: time itself is what is tested)
        claim = functools.partial(queue.claim, "worker-b", lease=5)
        [ticket] = await eventually(claim, "the expired lease to be claimed again", interval=0.05)
        transport = HttpTransport(url)
        await transport.deliver(ticket.id, ticket.body, {"Asyncq-Token": str(ticket.token)})
        await transport.close()
        assert await queue.finish(ticket, "ok") == "done"
        return ticket.token


def test_frozen_worker_late_post_is_a_duplicate_and_its_finish_is_rejected(tmp_path: Path) -> None:
    db, sink = tmp_path / "queue.db", tmp_path / "inbox.db"

    async def enqueue() -> None:
        async with await Queue.open(str(db)) as queue:
            await queue.enqueue("order-7", {"qty": 7})

    asyncio.run(enqueue())
    receiver, url = spawn(sink, effect="stock", env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = [sys.executable, str(ROOT / "tests" / "stale_worker_child.py"), str(db), url, "worker-a", "300"]
    stale = subprocess.Popen(child, stdout=subprocess.PIPE, text=True)
    try:
        assert stale.stdout is not None
        claimed = json.loads(stale.stdout.readline())
        os.kill(stale.pid, signal.SIGSTOP)  # frozen while it holds the lease, before it has posted
        assert claimed == {"claimed": "order-7", "token": 1}
        assert asyncio.run(reclaim_and_deliver(db, url)) == 2
        assert inbox_rows(sink) == [("order-7", 0)]

        os.kill(stale.pid, signal.SIGCONT)
        late = json.loads(stale.stdout.readline())
        assert stale.wait(timeout=20) == 0
    finally:
        for process in (stale, receiver):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.terminate()
                process.wait(timeout=10)

    assert late == {"delivered": "order-7", "finish": None}  # its POST was acknowledged, its finish refused
    assert inbox_rows(sink) == [("order-7", 1)]  # two deliveries, one row, one duplicate absorbed
    with sqlite3.connect(sink) as con:
        assert con.execute("SELECT qty FROM stock").fetchall() == [(7,)]  # the effect happened once
    with sqlite3.connect(db) as con:
        row = con.execute("SELECT status, token, attempts, owner FROM asyncq_jobs WHERE id = 'order-7'").fetchone()
    assert row == ("done", 2, 2, None)  # the newer worker's result stands
