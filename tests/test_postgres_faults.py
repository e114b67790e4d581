"""Faults of the PostgreSQL server under running workers, on a cluster the test owns (``pg_cluster_support``).

Two worker processes (``pg_fault_worker.py``, a pool of 8 tasks each) drain 2,000 jobs while the test ends every
client backend of the server every 0.4 s (``pg_terminate_backend``: the pools', the listeners') and crash-restarts
the server twice (``pg_ctl restart -m immediate``). Before asyncq took asyncpg's own errors for a connection a
fault left closed or mid-operation as a lost connection (``store/postgres/failures.py``: "cannot call
Transaction.__aexit__(): the underlying connection is closed", "cannot switch to state 15; another operation is in
progress"), both workers died of them within seconds. Asserted: every job done, none pending, leased or dead, every
one started by a handler; both workers still running when the faults end and ending cleanly on SIGTERM; each
counted the faults it met (``Pool.counters.store_busy``) and logged them.

And a worker started while the server is down waits for it (a clear line in its log, with backoff) instead of
exiting, then runs the jobs enqueued once the server is up; a read-only server, low timeouts on the role, a reply
lost after ``COMMIT``; and an outbox relay with its receiver whose backends are ended repeatedly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
from aiohttp import web
from pg_cluster_support import Cluster
from waiting import eventually

from asyncq import JobSpec, Pool, Queue, RetryPolicy
from asyncq.delivery.http import HttpTransport
from asyncq.errors import StoreBusy
from asyncq.inbox import EffectTransaction, make_inbox_app
from asyncq.outbox import Outbox, Relay

WORKER = Path(__file__).resolve().parent / "pg_fault_worker.py"
JOBS = 2000
WORKERS = 2
FAULTS_S = 10.0
TERMINATE_EVERY_S = 0.4
RESTARTS_AT_S = (3.0, 7.0)

pytestmark = [pytest.mark.timeout(180)]


def start_worker(url: str, folder: Path, index: int) -> subprocess.Popen[bytes]:
    files = ["--starts", f"{folder}/starts", "--status", f"{folder}/s{index}"]
    command = [sys.executable, str(WORKER), "--db", url, *files]
    return subprocess.Popen(command, stderr=(folder / f"err{index}").open("w"))


async def terminate_client_backends(cluster: Cluster) -> int:
    """End every client backend but this one; how many were ended."""
    conn = await asyncpg.connect(cluster.url(), timeout=5)
    try:
        ended: int = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        return ended
    finally:
        await conn.close()


async def statuses(cluster: Cluster) -> Counter[str]:
    conn = await asyncpg.connect(cluster.url(), timeout=5)
    try:
        return Counter(dict(await conn.fetch("SELECT status, count(*) FROM asyncq.jobs GROUP BY status")))
    finally:
        await conn.close()


async def test_workers_survive_ended_backends_and_crash_restarts_and_finish_every_job(
    cluster: Cluster, tmp_path: Path
) -> None:
    url = cluster.url()
    async with await Queue.open(url) as queue:
        for start in range(0, JOBS, 500):
            await queue.enqueue_many([JobSpec(f"j-{n:05d}", {"n": n}) for n in range(start, start + 500)])
    starts = tmp_path / "starts"
    workers = [start_worker(url, tmp_path, i) for i in range(WORKERS)]
    try:
        ended, restarts, began = 0, 0, time.monotonic()
        while (elapsed := time.monotonic() - began) < FAULTS_S:
            await asyncio.sleep(TERMINATE_EVERY_S)
            if restarts < len(RESTARTS_AT_S) and elapsed >= RESTARTS_AT_S[restarts]:
                await asyncio.to_thread(cluster.crash_restart)
                restarts += 1
            ended += await terminate_client_backends(cluster)
        alive = [worker.poll() for worker in workers]
        assert alive == [None] * WORKERS, [(tmp_path / f"err{i}").read_text()[-3000:] for i in range(WORKERS)]

        async def all_done() -> Counter[str] | None:
            found = await statuses(cluster)
            return found if found["done"] == JOBS else None

        found = await eventually(all_done, "every job done", timeout=90, interval=0.1)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        codes = [worker.wait(30) for worker in workers]
    assert restarts == len(RESTARTS_AT_S) and ended > WORKERS  # the faults really hit the workers' backends
    assert found == Counter(done=JOBS)  # nothing pending, leased or dead
    started = {line.split()[0] for line in starts.read_text().splitlines()}
    assert started == {f"j-{n:05d}" for n in range(JOBS)}
    assert codes == [0] * WORKERS
    counters = [json.loads((tmp_path / f"s{i}").read_text()) for i in range(WORKERS)]
    assert sum(c["finished"]["done"] for c in counters) >= JOBS
    assert sum(c["store_busy"] for c in counters) > 0  # the faults were met, counted ...
    logs = "".join((tmp_path / f"err{i}").read_text() for i in range(WORKERS))
    assert "store busy" in logs  # ... and logged


async def test_a_worker_started_while_the_server_is_down_waits_for_it_then_runs(
    cluster: Cluster, tmp_path: Path
) -> None:
    url = cluster.url()
    await asyncio.to_thread(cluster.stop)
    worker = start_worker(url, tmp_path, 0)
    try:
        log = tmp_path / "err0"
        waiting = await eventually(
            lambda: "the queue is not open yet" in log.read_text(), "the worker logs its wait", timeout=30
        )
        assert waiting and worker.poll() is None  # waiting, not exited
        await asyncio.to_thread(cluster.start)
        async with await Queue.open(url) as queue:
            await queue.enqueue_many([JobSpec(f"late-{n}", {"n": n}) for n in range(50)])

        async def all_done() -> Counter[str] | None:
            found = await statuses(cluster)
            return found if found["done"] == 50 else None

        assert await eventually(all_done, "the jobs enqueued after the start done", timeout=60, interval=0.1)
        assert worker.poll() is None
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(30)
    assert code == 0
    assert "cannot open" in log.read_text() and "ConnectionRefusedError" in log.read_text()


async def set_read_only(cluster: Cluster, on: bool) -> None:
    """``default_transaction_read_only`` for the whole server, as a failover to a standby leaves it."""
    conn = await asyncpg.connect(cluster.url(), timeout=5)
    try:
        await conn.execute(f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


async def test_a_read_only_server_is_a_clear_error_and_workers_wait_until_it_is_writable(
    cluster: Cluster, tmp_path: Path
) -> None:
    url = cluster.url()
    async with await Queue.open(url) as queue:
        await queue.enqueue_many([JobSpec(f"before-{n}", {"n": n}) for n in range(20)])
        worker = start_worker(url, tmp_path, 0)
        try:
            await eventually(lambda: statuses_done(cluster, 20), "the first jobs done", timeout=60, interval=0.05)
            await set_read_only(cluster, True)

            # A connection picks the reloaded setting up between statements, so an enqueue or two may still land
            # first: each attempt has its own id, and those that landed are counted among the jobs to finish.
            attempts: list[str] = []

            async def refused() -> str | None:
                attempts.append(f"while-read-only-{len(attempts)}")
                try:
                    await queue.enqueue(attempts[-1], {})
                except StoreBusy as error:
                    return str(error)
                return None  # the setting not picked up yet by this connection: try again

            message = await eventually(refused, "an enqueue refused by the read-only server", timeout=10)
            assert "read-only" in message and "nothing changed" in message
            assert await queue.get(attempts[-1]) is None  # nothing of the refused call landed
            landed = len(attempts) - 1
            assert await queue.get("before-0") is not None  # reads still work on a read-only server
            log = tmp_path / "err0"
            await eventually(lambda: "read-only" in log.read_text(), "the worker logs the refusal", timeout=30)
            assert worker.poll() is None
            await set_read_only(cluster, False)
            await eventually(
                lambda: _enqueued(queue, [JobSpec(f"after-{n}", {"n": n}) for n in range(20)]),
                "enqueues accepted again",
                timeout=10,
            )
            await eventually(lambda: statuses_done(cluster, 40 + landed), "every job done", timeout=60, interval=0.05)
            assert worker.poll() is None
        finally:
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(30)
        assert code == 0
        counters = json.loads((tmp_path / "s0").read_text())
        assert counters["store_busy"] > 0


async def statuses_done(cluster: Cluster, jobs: int) -> bool:
    found = await statuses(cluster)
    return found["done"] == jobs and sum(found.values()) == jobs


async def _enqueued(queue: Queue, specs: list[JobSpec]) -> bool:
    try:
        await queue.enqueue_many(specs)
    except StoreBusy:
        return False
    return True


async def test_low_statement_and_idle_in_transaction_timeouts_fail_an_apps_long_transaction_cleanly(
    cluster: Cluster, tmp_path: Path
) -> None:
    """``statement_timeout`` and ``idle_in_transaction_session_timeout`` set low on the role: an app transaction that
    enqueues on its own connection and then idles past the timeout fails (the server ends it), and nothing of it
    is left; a statement past the timeout is cancelled; the pool's own short transactions run every job."""
    url = cluster.url()
    admin = await asyncpg.connect(url, timeout=5)
    try:
        await admin.execute("ALTER ROLE postgres SET statement_timeout = '300ms'")
        await admin.execute("ALTER ROLE postgres SET idle_in_transaction_session_timeout = '300ms'")
    finally:
        await admin.close()
    async with await Queue.open(url) as queue:
        app = await asyncpg.connect(url, timeout=5)
        try:
            # The server ends the session; asyncpg then says so at the next statement or at the block's end.
            ended = (asyncpg.IdleInTransactionSessionTimeoutError, asyncpg.ConnectionDoesNotExistError)
            with pytest.raises((*ended, asyncpg.InterfaceError)):
                async with app.transaction():
                    await queue.enqueue("in-a-long-transaction", {}, connection=app)
                    await asyncio.sleep(0.8)  # idle inside the transaction, past the server's timeout
                    await app.execute("SELECT 1")
        finally:
            await app.close()
        assert await queue.get("in-a-long-transaction") is None  # rolled back whole by the server
        app = await asyncpg.connect(url, timeout=5)
        try:
            with pytest.raises(asyncpg.QueryCanceledError):
                async with app.transaction():
                    await queue.enqueue("beside-a-slow-statement", {}, connection=app)
                    await app.execute("SELECT pg_sleep(1)")
        finally:
            await app.close()
        assert await queue.get("beside-a-slow-statement") is None
        await queue.enqueue_many([JobSpec(f"t-{n}", {"n": n}) for n in range(100)])
        worker = start_worker(url, tmp_path, 0)
        try:
            await eventually(lambda: statuses_done(cluster, 100), "every job done", timeout=60, interval=0.05)
            assert worker.poll() is None
        finally:
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(30)
        assert code == 0


class CommitCutter:
    """A TCP proxy on 127.0.0.1 in front of a PostgreSQL server that, once ``armed``, forwards the next ``COMMIT``
    a client sends, reads the server's answer (the commit has landed) and closes that client's connection without
    passing it on: the client never hears it (``cuts`` counts those)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.armed = False
        self.cuts = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(self.host, self.port)
        cut = asyncio.Event()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                server_w.write(data)
                await server_w.drain()
                if self.armed and b"COMMIT" in data:
                    self.armed = False
                    self.cuts += 1
                    cut.set()
                    return

        async def downstream() -> None:
            while data := await server_r.read(65536):
                if cut.is_set():  # the COMMIT's own answer: the server has committed; the client never sees it
                    return
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if cut.is_set():
            await tasks[1]  # until the server answered the COMMIT (it has landed), then drop the connection
        for task in tasks:
            task.cancel()
        for writer in (client_w, server_w):
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_a_finish_whose_commit_reply_is_lost_is_counted_landed_not_stale(postgres_url: str) -> None:
    """The pool's group commit reaches the server, which commits it, and the connection is cut before the reply
    (a proxy between them). The pool sees a lost connection whose commit may have landed, waits, and sends the
    same finish again as a resend: it finds the job done under its token and counts the finish as landed. Before,
    the second send was refused as stale and counted so."""
    target = urlsplit(postgres_url)
    cutter = CommitCutter(target.hostname or "127.0.0.1", target.port or 5432)
    port = await cutter.start()
    url = postgres_url.replace(f"{target.hostname}:{target.port}", f"127.0.0.1:{port}", 1)
    try:
        async with await Queue.open(url) as queue:
            await queue.enqueue("reply-lost", {"n": 1})
            pool = Pool(queue, concurrency=1, poll_min=0.01, poll_max=0.05)

            @pool.handler()
            async def handle(body: object, context: object) -> None:
                cutter.armed = True  # the next COMMIT on the wire is this job's finish

            await pool.run(burst=True)
            assert cutter.cuts == 1
            job = await queue.get("reply-lost")
            assert job is not None and job.status == "done" and job.attempts == 1
            assert pool.counters.store_busy >= 1  # the cut was met ...
            assert pool.counters.stale_finishes == 0  # ... and the resend counted as landed
            assert pool.counters.finished == {"done": 1}
    finally:
        await cutter.close()


async def test_a_relay_and_its_receiver_survive_their_backends_ended_repeatedly_and_send_each_item_once(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A relay delivers to a real receiver whose inbox is on the same server while another handle adds 300 items and
    the test ends every client backend every 0.3 s for 5 s (and on, up to 30 s, until an end has failed a statement
    of the relay's own): the relay's pooled connections and its listener, the receiver's, the producer's. The relay
    task never ends; each failure is logged and the producer retries its add; once the faults stop every item is
    sent and applied exactly once (the inbox drops the repeats a lost ACK makes), and the relay's listener counted its
    losses and listens again."""
    caplog.set_level(logging.WARNING)
    url, sink = cluster.url() + "?schema=app", cluster.url() + "?schema=sink"
    ddl = ("CREATE SCHEMA IF NOT EXISTS sink", "CREATE TABLE IF NOT EXISTS sink.effects (id text NOT NULL)")

    def relay_failed() -> bool:  # a failure of the relay's own, logged (relay.py: "outbox relay <owner>: ...")
        return any(record.getMessage().startswith("outbox relay") for record in caplog.records)

    def record(tx: EffectTransaction, event_id: str, body: object) -> None:
        tx.execute("INSERT INTO sink.effects (id) VALUES ($1)", (event_id,))

    runner = web.AppRunner(make_inbox_app(sink, effect=record, ddl=ddl), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    transport = HttpTransport(f"http://127.0.0.1:{runner.addresses[0][1]}/events", timeout=5)
    ids = [f"i-{n:03d}" for n in range(300)]
    try:
        async with await Outbox.open(url) as outbox, await Outbox.open(url) as producer:
            # A receiver whose own connections were ended answers 500: those attempts fail; no alarm for them here.
            relay = Relay(outbox, transport, poll_ms=50, retry=RetryPolicy(base=0.02, cap=0.2), alarm_after=10_000)
            running = asyncio.create_task(relay.run())
            adding = asyncio.create_task(add_through_faults(producer, ids))
            ended, began = 0, time.monotonic()
            # 5 s of faults, and on until one has ended a statement of the relay's own (beside other load, every end
            # in 5 s found the relay between its statements in one run of make test), 30 s at most
            while time.monotonic() - began < 5.0 or (not relay_failed() and time.monotonic() - began < 30.0):
                await asyncio.sleep(0.3)
                ended += await terminate_client_backends(cluster)
            await asyncio.wait_for(adding, 60)
            assert not running.done()  # the relay rode every fault out
            wakeups = outbox.store.wakeups  # type: ignore[attr-defined]  # the port has no wake-ups

            async def all_sent() -> bool:
                sent = await cluster_rows(cluster, "SELECT count(*) FROM app.outbox WHERE state = 'sent'")
                return sent == [(len(ids),)]

            await eventually(all_sent, "every item sent", timeout=60, interval=0.1)
            await eventually(lambda: wakeups.listening, "the relay to listen again", timeout=30)
            relay.stop()
            await asyncio.wait_for(running, 30)
    finally:
        await transport.close()
        await runner.cleanup()
    assert ended > 10 and wakeups.lost > 0
    applied = await cluster_rows(cluster, "SELECT id, count(*) FROM sink.effects GROUP BY id ORDER BY id")
    assert applied == [(item_id, 1) for item_id in ids]  # each once: nothing lost, nothing applied twice
    assert relay_failed()
    assert any("listening for new outbox items" in record.getMessage() for record in caplog.records)  # the listener's


async def add_through_faults(producer: Outbox, ids: list[str]) -> None:
    """Add every item, one a few milliseconds, each retried while the server ends its connections (an add that
    may have landed is sent again: the same item again is ``False``, not a second item)."""
    for item_id in ids:
        while True:
            try:
                await producer.add(item_id, {"id": item_id})
                break
            except StoreBusy:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.005)


async def cluster_rows(cluster: Cluster, statement: str) -> list[tuple[object, ...]]:
    conn = await asyncpg.connect(cluster.url(), timeout=5)
    try:
        return [tuple(row) for row in await conn.fetch(statement)]
    finally:
        await conn.close()
