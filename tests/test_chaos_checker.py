"""The chaos harness's checker is not vacuous: on real store files, each kind of fault it must report is counted.

A queue file and an inbox file (the project's ``Inbox`` with the ``stock`` effect, as ``python -m asyncq.inbox
--effect stock`` runs it) are built by the product's own calls; then one of each fault is written into them
(a done job the receiver never applied, an effect applied twice, an event for no job, a job left pending, a
dead job no handler started), and the checker must count each one, and nothing else. And the nemesis's probe for
its last stop names the right process: on SQLite the one inside ``BEGIN IMMEDIATE``, on PostgreSQL the one whose
backend is ``idle in transaction`` (this run's server, ``postgres_url``).
"""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import asyncq.inbox.receiver
from asyncq import Inbox, JobSpec, Queue

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from chaos_check import body_of, check, failed
from chaos_pg import PostgresStore, split_url
from chaos_store import Held, SqliteStore

pytestmark = pytest.mark.timeout(60)
IDS = [f"job-{n:06d}" for n in range(5)]
CLEAN = {"lost": 0, "duplicated": 0, "unexpected": 0, "non_terminal": 0}


async def build(folder: Path) -> None:
    """Five jobs done, each applied once by the inbox, each start logged; a sixth dead after its one attempt."""
    store = SqliteStore(folder)
    await store.enqueue([JobSpec(job_id, {"item": job_id, "qty": 1}) for job_id in IDS])
    await store.enqueue([JobSpec("job-000005", {"item": "job-000005", "qty": 1}, max_attempts=1)])
    effect, ddl = asyncq.inbox.receiver.EFFECTS["stock"]
    async with await Queue.open(store.location) as queue, Inbox(folder / "inbox.db", effect=effect, ddl=ddl) as inbox:
        tickets = await queue.claim("checker-test", limit=6)
        for ticket in tickets:
            if ticket.id == "job-000005":
                assert await queue.finish(ticket, "retry") == "dead"
            else:
                assert await inbox.receive(ticket.id, ticket.body) == "applied"
                assert await queue.finish(ticket, "ok") == "done"
    (folder / "events.log").write_text("".join(f"S {job_id} 1 checker-test\n" for job_id in IDS))


def run_check(folder: Path) -> dict[str, object]:
    figures = check(SqliteStore(folder), folder / "inbox.db", folder / "events.log", {*IDS, "job-000005"})
    figures |= {"failed": failed(figures)}
    return figures


def test_a_clean_run_is_clean(tmp_path: Path) -> None:
    asyncio.run(build(tmp_path))
    report = run_check(tmp_path)
    assert {name: report[name] for name in CLEAN} == CLEAN
    assert report["failed"] == [] and report["unexpected_by_kind"] == {}
    assert report["done"] == 5 and report["dead_by_reason"] == {"exhausted": 1}
    assert report["dead_never_started"] == 1 and report["attempts_without_start"] == 1
    assert report["dead_every_attempt_failed"] == 0 and report["failed_deliveries"] == {}
    assert report["redeliveries"] == report["duplicates_absorbed"] == 0
    assert report["integrity"] == {"queue": "ok", "inbox": "ok"}


def test_a_start_a_kill_caught_before_it_was_counted_is_not_taken_for_the_attempt_spent_later(tmp_path: Path) -> None:
    """The dead job was started under token 1 by a worker killed before the commit that counts a start (its lease
    still at 0 attempts), then claimed again, counted, under token 2 by one killed before the start: its one
    attempt was spent without a start, and the kill that did it is the caught lease."""
    asyncio.run(build(tmp_path))
    with open(tmp_path / "events.log", "a") as events:
        events.write("S job-000005 1 killed-ahead\n")
    held = [("job-000005", Held(1, 0)), ("job-000005", Held(2, 1))]
    report = check(SqliteStore(tmp_path), tmp_path / "inbox.db", tmp_path / "events.log", {*IDS, "job-000005"}, held)
    assert report["uncounted_starts"] == 1 and report["counted_leases_killed_before_start"] == 1
    assert report["attempts_without_start"] == 1 and report["dead_without_counted_start"] == 1
    assert report["dead_never_started"] == 0  # it did start once, under token 1


def test_each_fault_is_counted_once_and_fails_the_run(tmp_path: Path) -> None:
    asyncio.run(build(tmp_path))
    with sqlite3.connect(tmp_path / "inbox.db") as inbox:
        inbox.execute("DELETE FROM asyncq_inbox WHERE id = ?", (IDS[3],))  # done, never applied: lost
        inbox.execute("DELETE FROM stock WHERE item = ?", (IDS[3],))
        inbox.execute("UPDATE stock SET qty = 2 WHERE item = ?", (IDS[1],))  # applied twice: duplicated
        stranger = body_of("job-999999")
        inbox.execute("INSERT INTO asyncq_inbox (id, body, applied_at_ms) VALUES ('job-999999', ?, 0)", (stranger,))
        inbox.execute("INSERT INTO stock (item, qty) VALUES ('job-999999', 1)")  # for no job: unexpected
    with sqlite3.connect(tmp_path / "queue.db") as queue:  # left pending: non-terminal
        queue.execute("UPDATE asyncq_jobs SET status = 'pending', owner = NULL WHERE id = ?", (IDS[4],))
    with open(tmp_path / "events.log", "a") as events:
        events.write(f"S {IDS[0]} 2 another-worker\nX another-worker\nL another-worker\n")
        events.write("S job-000005 1 another-worker\nF job-000005 1 another-worker Retryable\n")

    report = run_check(tmp_path)

    assert {name: report[name] for name in CLEAN} == {"lost": 1, "duplicated": 1, "unexpected": 3, "non_terminal": 1}
    assert report["unexpected_by_kind"] == {
        "inbox_row_unknown_id": 1,
        "effect_unknown_id": 1,
        "effect_never_started": 1,
    }
    assert report["failed"] == ["lost", "duplicated", "unexpected", "non_terminal"]
    assert report["redeliveries"] == 1
    assert report["dead_never_started"] == 0 and report["dead_every_attempt_failed"] == 1
    assert report["failed_deliveries"] == {"Retryable": 1}
    assert report["stale_finishes_rejected"] == report["leases_lost"] == 1


HOLDER = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.executescript(sys.argv[2])
print("holding", flush=True)
sys.stdin.readline()
con.execute("COMMIT")
print("released", flush=True)
sys.stdin.readline()
"""


WRITER = "BEGIN IMMEDIATE; UPDATE asyncq_jobs SET available_at = available_at;"
READER = "BEGIN; SELECT count(*) FROM asyncq_jobs;"  # holds a read snapshot, not the write lock


@pytest.mark.parametrize(("begin", "writer"), [(WRITER, True), (READER, False)], ids=["writer", "reader"])
def test_the_write_lock_holder_is_the_process_inside_a_write_transaction(
    tmp_path: Path, begin: str, writer: bool
) -> None:
    asyncio.run(SqliteStore(tmp_path).enqueue([JobSpec("job-000000", {"qty": 1})]))
    store = SqliteStore(tmp_path)
    reader = sqlite3.connect(store.path)  # this process's own connection must not be disturbed by the probe
    reader.execute("SELECT count(*) FROM asyncq_jobs").fetchone()
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(store.path), begin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == "holding\n"
        assert store.write_lock_holder() == (child.pid if writer else None)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "released\n"
        assert store.write_lock_holder() is None  # the child is alive, its transaction is over
    finally:
        child.kill()
        child.wait()
        store.close()
    assert reader.execute("SELECT count(*) FROM asyncq_jobs").fetchone() == (1,)
    reader.close()


PG_HOLDER = """
import asyncio, sys
import asyncpg

async def main(dsn, begin):
    conn = await asyncpg.connect(dsn)
    for statement in filter(None, begin.split(";")):
        await conn.execute(statement)
    print("holding", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    if conn.is_in_transaction():
        await conn.execute("COMMIT")
    print("released", flush=True)
    await asyncio.to_thread(sys.stdin.readline)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

PG_WRITER = "BEGIN; SELECT id FROM {jobs} FOR UPDATE"  # a transaction open, its row locked, waiting for its client
PG_IDLE = "SELECT count(*) FROM {jobs}"  # connected and idle, no transaction


@pytest.mark.parametrize(("begin", "writer"), [(PG_WRITER, True), (PG_IDLE, False)], ids=["in-transaction", "idle"])
async def test_on_postgresql_the_write_lock_holder_is_the_process_holding_a_transaction_open(
    postgres_url: str, begin: str, writer: bool
) -> None:
    """The nemesis's last stop on PostgreSQL: the worker whose backend is ``idle in transaction``, found from the
    backend's ``client_port`` among the sockets of the candidate processes (this one's own connection aside)."""
    store = PostgresStore(postgres_url)
    await store.enqueue([JobSpec("job-000000", {"qty": 1})])
    dsn, schema = split_url(postgres_url)
    command = [sys.executable, "-c", PG_HOLDER, dsn, begin.format(jobs=f"{schema}.jobs")]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    candidates = [os.getpid(), child.pid]
    try:
        assert await asyncio.to_thread(child.stdout.readline) == "holding\n"
        holder = await asyncio.to_thread(store.write_lock_holder, candidates)
        assert holder == (child.pid if writer else None)
        fresh = await asyncio.to_thread(functools.partial(store.write_lock_holder, candidates, fresh=True))
        assert fresh == holder  # read again from /proc, not from the ports kept by the first answer
        child.stdin.write("\n")
        child.stdin.flush()
        assert await asyncio.to_thread(child.stdout.readline) == "released\n"
        assert await asyncio.to_thread(store.write_lock_holder, candidates) is None  # alive, its transaction over
    finally:
        child.kill()
        child.wait()
        await asyncio.to_thread(store.close)
