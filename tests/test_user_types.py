"""The public API's types reach a user's code: ``mypy --strict`` on a small script that misuses it reports each
misuse (before this, ``asyncq.Queue`` was ``Any`` to mypy through the lazy ``__getattr__``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """\
import asyncq
from asyncq import Pool, Queue, RetryPolicy


async def main() -> None:
    queue = await Queue.open(123)  # MISUSE: open-int
    queue.no_such_method()  # MISUSE: no-method
    added: str = await queue.enqueue("job", {})  # MISUSE: enqueue-returns-bool
    await queue.enqueue("job", {}, max_attempts="3")  # MISUSE: attempts-str
    pool = Pool(queue, concurrency="4")  # MISUSE: concurrency-str
    pool.register("default", 42)  # MISUSE: handler-int
    RetryPolicy(cap_ms=1.5)  # MISUSE: cap-ms-gone
    asyncq.NoSuchThing  # MISUSE: no-name
    job = await queue.get("job")
    print(job.status)  # MISUSE: optional-job
    good = await Queue.open("fine.db")  # a correct call: no error on this line
    await good.close()
"""


TASKS_SCRIPT = """\
import sqlite3

import asyncq

app = asyncq.App()


@app.task(queue="emails", max_attempts=5, timeout=30.0)
async def send_email(to: str, subject: str, *, urgent: bool = False) -> int:
    return len(subject)


async def main(con: sqlite3.Connection) -> None:
    async with asyncq.open("app.db") as queue:
        job = await send_email.defer(queue, to="a@b.example", subject="hi")
        count: int = await job.result(timeout=1.0)
        await send_email.defer(queue, to=42, subject="hi")  # MISUSE: to-int
        await send_email.defer(queue, to="a@b.example")  # MISUSE: subject-missing
        await send_email.defer(queue, "a", "b", True)  # MISUSE: urgent-positional
        await send_email.defer(queue, to="a", subject="b", cc="c")  # MISUSE: unknown-keyword
        await send_email.using(key="k", delay=1.0).defer(queue, to="a", subject=b"b")  # MISUSE: using-bytes
        text: str = await job.result()  # MISUSE: result-type
        async with queue.transaction() as tx:
            await send_email.defer(tx, to="a", subject="b")
            await send_email.defer(tx, to="a", subject="b", urgent="yes")  # MISUSE: tx-urgent-str
        send_email.defer_sync(con, to="a", subject="b")
        send_email.defer_sync(con, to="a", subject=3)  # MISUSE: sync-int
        await send_email.defer("app.db", to="a", subject="b")  # MISUSE: target-str
        await app.run_worker(queue, concurrency=16)
    print(count, text)
"""

EDGES_SCRIPT = """\
import asyncq
from asyncq import Outcome, Queue, Ticket
from asyncq.queue import Attempt


async def main(queue: Queue, ticket: Ticket) -> None:
    async with asyncq.open("a.db", busy_timeout="x"):  # MISUSE: open-option-type
        pass
    async with asyncq.open("a.db", bogus=1):  # MISUSE: open-unknown-option
        pass
    async with asyncq.open("a.db", durability="full", busy_timeout=2.0, read_only=False):
        pass
    await queue.finish(ticket, "okk")  # MISUSE: outcome-typo
    await queue.finish(ticket, "retry", delay=1.0)
    await queue.finish(ticket, Outcome.OK)
    async with queue.transaction() as tx:
        await tx.enqueue("a", {}, max_attempt=3)  # MISUSE: tx-option-typo
        await tx.enqueue("b", {"n": [1, 2.5, None]}, max_attempts=3, ttl=60)
    await queue.enqueue("c", {1, 2})  # MISUSE: body-set
    await queue.enqueue("d", object())  # MISUSE: body-object
    report = await queue.prune(60)
    print(report["deleeted"])  # MISUSE: prune-report-key
    print(report["deleted"] + report["bytes_before"])
    described = await queue.describe()
    print(described["store"] == "mysql")  # MISUSE: store-kind
    job = await queue.get("a")
    if job is not None:
        total: int = job.body  # MISUSE: body-is-json
        print(total, job.result)
    claimed = await queue.settle_and_claim([], "w1", [("default", 1)])
    print(claimed.statuses, claimed.tickets[0].id)
    print(claimed.ticketz)  # MISUSE: claimed-field-typo
    first: Ticket = claimed.statuses[0]  # MISUSE: claimed-statuses-not-tickets
    await queue.finish_many([Attempt(ticket, "ok"), Attempt(ticket, Outcome.RETRY, 1000)])
    await queue.finish_many([Attempt(ticket, "okk")])  # MISUSE: attempt-outcome-typo
    await queue.finish_many([Attempt(ticket, "ok", 1.5)])  # MISUSE: attempt-delay-float
    pruning = await queue.prunable(60)
    print(pruning.by_status["done"], pruning.ids[:1], first)
    print(pruning.idz)  # MISUSE: prunable-field-typo
"""

POOL_SCRIPT = """\
import asyncq
from asyncq.web.metrics import PoolMetrics
from asyncq.worker.settings import PoolSettings


async def main(queue: asyncq.Queue, app: asyncq.App, observer: PoolMetrics) -> None:
    app.pool(queue, bogus=1)  # MISUSE: pool-unknown-option
    await app.run_worker(queue, concurency=4)  # MISUSE: run-worker-typo
    app.lifespan("app.db", leese=30)  # MISUSE: lifespan-typo
    app.pool(queue, concurrency="8")  # MISUSE: concurrency-str
    asyncq.Pool(queue, owner=1)  # MISUSE: owner-int
    asyncq.Pool(queue, lease_ms=1000)  # MISUSE: lease-ms-gone
    PoolSettings(retry="fast")  # MISUSE: retry-str
    pool = asyncq.Pool(queue)

    async def counts(body: asyncq.JSON, job: asyncq.JobContext) -> None:
        if isinstance(body, dict):
            print(body.get("n"), job.id)

    async def as_bytes(body: bytes, job: asyncq.JobContext) -> None:
        print(body, job.id)

    async def as_text(body: asyncq.JSON, job: asyncq.JobContext) -> None:
        print(body.upper(), job.id)  # MISUSE: body-not-narrowed

    pool.register("default", counts)
    pool.register("default", as_bytes)  # MISUSE: handler-body-bytes
    pool.register("default", as_text)

    async def compute() -> int:
        return 1

    async def careful(body: asyncq.JSON, job: asyncq.JobContext) -> None:
        with asyncq.shield():
            n: int = await asyncq.shield(compute())
            text: str = await asyncq.shield(compute())  # MISUSE: shield-keeps-the-type
            print(n, text)
        await asyncq.shield(42)  # MISUSE: shield-not-awaitable

    pool.register("default", careful)
    asyncq.Pool(queue, cancel_grace="soon")  # MISUSE: cancel-grace-str
    asyncq.Pool(queue, cancel_grace=2.5)
    outcome = await queue.cancel("job-1", note="customer left")
    print(outcome.state, outcome.audit)
    print(outcome.stat)  # MISUSE: cancel-outcome-typo
    asyncq.Pool(queue, observer=1)  # MISUSE: observer-int
    app.pool(queue, concurrency=8, lease=30, owner="w1", observer=observer)
    await app.run_worker(queue, burst=True, concurrency=4, retry=asyncq.RetryPolicy(base=2))
    app.lifespan("app.db", worker=False, concurrency=4, busy_timeout=1.0)
    asyncq.Pool(queue, PoolSettings(concurrency=2, linger=0.01))
"""


def mypy_errors(tmp_path: Path, source: str) -> tuple[set[int], subprocess.CompletedProcess[str]]:
    """The lines of ``source`` (as ``user_app.py``) that ``mypy --strict`` flags, and its run."""
    script = tmp_path / "user_app.py"
    script.write_text(source)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(script),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=170,
    )
    return {int(m.group(1)) for m in re.finditer(r"user_app\.py:(\d+): error", done.stdout)}, done


@pytest.mark.parametrize(
    "source", [SCRIPT, TASKS_SCRIPT, EDGES_SCRIPT, POOL_SCRIPT], ids=["queue-api", "tasks-api", "edges", "pool-options"]
)
def test_mypy_strict_reports_each_misuse_of_the_public_api(tmp_path: Path, source: str) -> None:
    flagged, done = mypy_errors(tmp_path, source)
    expected = {n for n, line in enumerate(source.splitlines(), 1) if "# MISUSE" in line}
    assert flagged == expected, done.stdout
    assert done.returncode == 1
