"""Prometheus metrics over real HTTP: a pool's burst on a real queue file, a stale finish, a lost lease, the
depth gauges and the inbox counters, each scraped from a started endpoint and parsed with prometheus-client.

Queue time is an injected clock where a test is about time (a lease taken over, the oldest job's age)."""

from __future__ import annotations

import asyncio
import json
import pkgutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from waiting import eventually

import asyncq
from asyncq.core.jobs import JobSpec
from asyncq.errors import Permanent, Retryable
from asyncq.inbox import STOCK_TABLES, add_to_stock, make_inbox_app
from asyncq.queue import Queue
from asyncq.web.metrics import (
    ENQUEUE_RESULTS,
    EnqueueCollector,
    PoolMetrics,
    QueueCollector,
    instrument_inbox_app,
    start_metrics_server,
)
from asyncq.worker.pool import JobContext, Pool
from asyncq.worker.settings import PoolSettings

pytestmark = pytest.mark.timeout(30)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(url: str) -> Samples:
    """Every sample at ``url``, by name and labels, as Prometheus would read them."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, tuple(sorted(labels.items()))]


async def scrape_registry(registry: CollectorRegistry) -> Samples:
    async with await start_metrics_server(registry) as server:
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        return await scrape(server.url)


async def burst(pool: Pool) -> None:
    async with asyncio.timeout(10):
        await pool.run(burst=True)


# --- the pool ------------------------------------------------------------------------------------------


async def steer(body: Any, context: JobContext) -> None:
    """Succeed, refuse, fail once, or fail always, as the body's ``kind`` says."""
    kind = body["kind"]
    if kind == "permanent":
        raise Permanent("malformed")
    if kind == "broken" or (kind == "flaky" and context.attempt == 1):
        raise Retryable("busy", delay_ms=0)


async def test_a_burst_counts_claims_finishes_by_status_retries_and_deliveries(
    queue: Queue, path: Path, clock: list[int]
) -> None:
    metrics = PoolMetrics(queue_path=path, clock=lambda: clock[0])
    pool = Pool(queue, concurrency=4, observer=metrics)
    pool.register("default", steer)
    jobs = [JobSpec(f"ok-{n}", {"kind": "ok"}) for n in range(5)]
    jobs += [JobSpec("refused", {"kind": "permanent"}), JobSpec("flaky", {"kind": "flaky"})]
    jobs += [JobSpec("broken", {"kind": "broken"}, max_attempts=2)]
    await queue.enqueue_many(jobs)

    await burst(pool)
    samples = await scrape_registry(metrics.registry)

    assert value(samples, "asyncq_claims_total") == 10 == pool.counters.claimed
    finishes = {s: value(samples, "asyncq_finishes_total", status=s) for s in ("done", "pending", "dead")}
    assert finishes == {"done": 6, "pending": 2, "dead": 2} == pool.counters.finished
    assert value(samples, "asyncq_retries_total") == 2
    assert value(samples, "asyncq_stale_finishes_total") == 0
    assert value(samples, "asyncq_leases_lost_total") == 0
    assert value(samples, "asyncq_cancels_total") == 0
    deliveries = {o: value(samples, "asyncq_delivery_seconds_count", outcome=o) for o in ("ok", "retry", "permanent")}
    assert deliveries == {"ok": 6, "retry": 3, "permanent": 1}
    assert value(samples, "asyncq_delivery_seconds_bucket", outcome="ok", le="+Inf") == 6
    depth = {s: value(samples, "asyncq_jobs", status=s) for s in ("pending", "leased", "done", "dead")}
    assert depth == {"pending": 0, "leased": 0, "done": 6, "dead": 2}
    assert value(samples, "asyncq_dead_jobs", reason="permanent") == 1
    assert value(samples, "asyncq_dead_jobs", reason="exhausted") == 1
    assert value(samples, "asyncq_oldest_ready_age_seconds") == 0
    assert value(samples, "asyncq_queue_file_up") == 1


async def test_a_finish_whose_lease_was_taken_over_counts_as_stale(queue: Queue, path: Path, clock: list[int]) -> None:
    taken: list[Any] = []
    async with await Queue.open(path, clock=lambda: clock[0] + 60_000) as other_worker:  # past the 30 s lease

        async def handler(body: Any, context: JobContext) -> None:
            taken.extend(await other_worker.claim("w2", lease=60))  # then finish with the old ticket

        metrics = PoolMetrics(queue_path=path, clock=lambda: clock[0])
        pool = Pool(queue, owner="w1", lease=30, observer=metrics)
        pool.register("default", handler)
        await queue.enqueue("job", {})
        await burst(pool)

    assert [ticket.token for ticket in taken] == [2]
    samples = await scrape_registry(metrics.registry)
    assert value(samples, "asyncq_claims_total") == 1
    assert value(samples, "asyncq_stale_finishes_total") == 1 == pool.counters.stale_finishes
    assert sum(value(samples, "asyncq_finishes_total", status=s) for s in ("done", "pending", "dead")) == 0
    assert value(samples, "asyncq_delivery_seconds_count", outcome="ok") == 1
    assert value(samples, "asyncq_jobs", status="leased") == 1


async def test_a_lost_lease_is_counted_and_its_delivery_is_not(queue: Queue, path: Path, clock: list[int]) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(body: Any, context: JobContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    metrics = PoolMetrics()
    pool = Pool(queue, owner="w1", lease=1.0, observer=metrics)  # renewals every 0.25 s of real time
    pool.register("default", handler)
    await queue.enqueue("job", {})
    async with await Queue.open(path, clock=lambda: clock[0] + 2_000) as other_worker:
        running = asyncio.create_task(pool.run(burst=True))
        async with asyncio.timeout(5):
            await started.wait()
            assert len(await other_worker.claim("w2", lease=60)) == 1
            clock[0] += 2_000  # the pool's renewer now finds the lease due, and the renewal is refused
            await cancelled.wait()
            await running

    samples = await scrape_registry(metrics.registry)
    assert value(samples, "asyncq_leases_lost_total") == 1
    assert value(samples, "asyncq_claims_total") == 1
    assert sum(value(samples, "asyncq_delivery_seconds_count", outcome=o) for o in ("ok", "retry", "permanent")) == 0
    assert ("asyncq_jobs", (("status", "leased"),)) not in samples  # no queue_path: no depth gauges


# --- depth at scrape time ------------------------------------------------------------------------------


async def test_depth_and_the_oldest_ready_age_are_read_at_scrape_time(
    queue: Queue, path: Path, clock: list[int]
) -> None:
    registry = CollectorRegistry()
    registry.register(QueueCollector(path, clock=lambda: clock[0]))
    await queue.enqueue_many([JobSpec("a", 1), JobSpec("b", 2), JobSpec("later", 3, delay=60)])
    clock[0] += 1_000
    await queue.enqueue("c", 4)
    clock[0] += 4_000

    samples = await scrape_registry(registry)
    assert value(samples, "asyncq_jobs", status="pending") == 4
    assert value(samples, "asyncq_oldest_ready_age_seconds") == 5.0

    await queue.claim("w1", limit=2)
    await queue.cancel("later", "not-needed")
    samples = await scrape_registry(registry)
    depth = {s: value(samples, "asyncq_jobs", status=s) for s in ("pending", "leased", "done", "dead")}
    assert depth == {"pending": 1, "leased": 2, "done": 0, "dead": 1}
    assert value(samples, "asyncq_dead_jobs", reason="cancelled") == 1
    assert value(samples, "asyncq_oldest_ready_age_seconds") == 4.0


async def test_a_paused_queue_shows_in_its_gauge_until_it_is_resumed(queue: Queue, path: Path) -> None:
    registry = CollectorRegistry()
    registry.register(QueueCollector(path))
    assert not [key for key in await scrape_registry(registry) if key[0] == "asyncq_queue_paused"]
    await queue.pause("mail", note="provider outage")
    assert value(await scrape_registry(registry), "asyncq_queue_paused", queue="mail") == 1
    await queue.resume("mail", note="provider back")
    assert value(await scrape_registry(registry), "asyncq_queue_paused", queue="mail") == 0


async def test_each_retention_rules_windows_show_in_its_gauge(queue: Queue, path: Path) -> None:
    registry = CollectorRegistry()
    registry.register(QueueCollector(path))
    assert not [key for key in await scrape_registry(registry) if key[0] == "asyncq_queue_retention_seconds"]
    await queue.set_default_retention(done=86_400)
    await queue.set_retention("mail", done=60, dead=0)
    await queue.set_retention("mail", task="send", cancelled=5)
    found = {
        dict(labels)["queue"] + "/" + dict(labels)["task"] + "/" + dict(labels)["state"]: sample
        for (name, labels), sample in (await scrape_registry(registry)).items()
        if name == "asyncq_queue_retention_seconds"
    }
    assert found == {"*//done": 86_400, "mail//done": 60, "mail//dead": 0, "mail/send/cancelled": 5}


async def test_a_queues_enqueue_answers_are_counted_unique_keys_held_and_refused_apart(queue: Queue) -> None:
    registry = CollectorRegistry()
    registry.register(EnqueueCollector(queue))
    assert await queue.enqueue("a", {}, unique_key="k") is True
    assert await queue.enqueue("a", {}, unique_key="k") is False  # the same job again
    assert await queue.enqueue("b", {}, unique_key="k") == "a"  # held by a
    assert await queue.enqueue_many([JobSpec("c", {}), JobSpec("d", {}, unique_key="k")]) == [True, "a"]
    with pytest.raises(asyncq.UniqueConflict):
        await queue.enqueue("e", {}, unique_key="k", on_conflict="raise")
    async with queue.transaction() as tx:
        assert await tx.enqueue("f", {}, unique_key="k") == "a"
    samples = await scrape_registry(registry)
    counts = {result: value(samples, "asyncq_enqueues_total", result=result) for result in ENQUEUE_RESULTS}
    assert counts == {"added": 2, "existing": 1, "unique_held": 3, "unique_refused": 1}
    assert (queue.enqueue_counts.added, queue.enqueue_counts.unique_held) == (2, 3)


async def test_an_unreadable_queue_file_shows_as_down_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    registry = CollectorRegistry()
    registry.register(QueueCollector(missing))
    samples = await scrape_registry(registry)
    assert value(samples, "asyncq_queue_file_up") == 0
    assert not any(name == "asyncq_jobs" for name, _labels in samples)
    assert not missing.exists()


async def test_a_collector_called_on_the_loops_own_thread_reads_without_deadlock(
    queue: Queue, path: Path, clock: list[int]
) -> None:
    """``generate_latest`` called straight from a coroutine: the read runs on a loop of its own, in its own thread."""
    registry = CollectorRegistry()
    registry.register(QueueCollector(path, clock=lambda: clock[0]))
    await queue.enqueue_many([JobSpec("a", 1), JobSpec("b", 2)])
    clock[0] += 3_000
    async with asyncio.timeout(10):
        text = generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert value(samples, "asyncq_jobs", status="pending") == 2
    assert value(samples, "asyncq_oldest_ready_age_seconds") == 3.0
    assert value(samples, "asyncq_queue_file_up") == 1


async def test_a_file_that_is_not_a_queue_shows_as_down_and_is_left_unchanged(tmp_path: Path) -> None:
    other = tmp_path / "app.db"
    with closing(sqlite3.connect(other)) as con:
        con.execute("CREATE TABLE orders (id TEXT)")
    before = other.read_bytes()
    registry = CollectorRegistry()
    registry.register(QueueCollector(other))
    samples = await scrape_registry(registry)
    assert value(samples, "asyncq_queue_file_up") == 0
    assert other.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


# --- the inbox ---------------------------------------------------------------------------------------------


async def test_the_inbox_app_serves_its_event_counts_by_outcome(tmp_path: Path) -> None:
    app = make_inbox_app(tmp_path / "inbox.db", effect=add_to_stock, ddl=STOCK_TABLES)
    instrument_inbox_app(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        posts = [{"id": "e1", "qty": 1}, {"id": "e1", "qty": 1}, {"id": "e1", "qty": 2}, "not json", {"id": "e2"}]
        async with aiohttp.ClientSession() as session:
            for body in posts:
                data = body if isinstance(body, str) else json.dumps(body)
                async with session.post(base + "/events", data=data) as response:
                    await response.read()
        samples = await scrape(base + "/metrics")
    finally:
        await runner.cleanup()
    outcomes = ("applied", "duplicate", "conflict", "rejected", "failed")
    assert {o: value(samples, "asyncq_inbox_events_total", outcome=o) for o in outcomes} == dict.fromkeys(outcomes, 1)


# --- an optional extra ---------------------------------------------------------------------------------------


def test_no_module_but_asyncq_metrics_imports_prometheus_client() -> None:
    names = [m.name for m in pkgutil.walk_packages(asyncq.__path__, "asyncq.") if not m.name.endswith("__main__")]
    modules = [name for name in names if name != "asyncq.web.metrics"]
    code = f"import sys\nfor name in {modules!r}:\n    __import__(name)\nprint('prometheus_client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.strip() == "False"


async def test_a_pool_opened_while_the_store_is_locked_elsewhere_waits_and_counts_it(path: Path) -> None:
    """``Pool.open`` (what ``asyncq work`` starts with) under another writer's lock: each open that found the lock
    held past the busy timeout is counted as a running pool counts it (counters and metrics), then it runs."""
    async with await Queue.open(path) as seeding:
        await seeding.enqueue("j1", {})
    metrics = PoolMetrics()
    settings = PoolSettings(concurrency=1, poll_min=0.01, poll_max=0.05)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock while the pool opens
    opening = asyncio.create_task(
        Pool.open(lambda: Queue.open_existing(path, busy_timeout=0.05), settings, observer=metrics)
    )
    async with asyncio.timeout(10):
        while value(await scrape_registry(metrics.registry), "asyncq_store_busy_total") < 2:
            await asyncio.sleep(0.01)  # polled under a deadline: the open retries on its own schedule
    assert not opening.done()
    blocker.execute("COMMIT")
    blocker.close()
    async with asyncio.timeout(10):
        pool = await opening
    async with pool.queue as queue:

        async def handler(body: Any, context: JobContext) -> None:
            return None

        pool.register("default", handler)
        await pool.run(burst=True)
        assert (await queue.stats()).by_status["done"] == 1
    samples = await scrape_registry(metrics.registry)
    assert value(samples, "asyncq_store_busy_total") == pool.counters.store_busy >= 2


async def test_a_store_locked_elsewhere_is_counted_and_the_pool_goes_on(path: Path) -> None:
    async with await Queue.open(path, busy_timeout=0.05) as queue:
        for n in range(10):
            await queue.enqueue(f"j{n}", {})
        metrics = PoolMetrics()
        pool = Pool(queue, concurrency=2, poll_min=0.01, poll_max=0.05, observer=metrics)

        async def handler(body: Any, context: JobContext) -> None:
            return None

        pool.register("default", handler)
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
        running = asyncio.create_task(pool.run(burst=True))
        await eventually(lambda: pool.counters.store_busy >= 2, "two busy tries of the pool", interval=0.01)
        blocker.execute("COMMIT")
        blocker.close()
        async with asyncio.timeout(10):
            await running
        assert (await queue.stats()).by_status["done"] == 10
    samples = await scrape_registry(metrics.registry)
    assert value(samples, "asyncq_store_busy_total") == pool.counters.store_busy >= 2
    assert pool.counters.internal_errors == 0  # the observer had the method: nothing failed around it


async def test_a_job_cancelled_while_running_is_counted(queue: Queue, path: Path) -> None:
    metrics = PoolMetrics()
    started = asyncio.Event()

    async def forever(body: Any, context: JobContext) -> None:
        started.set()
        await asyncio.Event().wait()

    pool = Pool(queue, concurrency=1, lease=30.0, observer=metrics)
    pool.register("default", forever)
    running = asyncio.create_task(pool.run())
    await queue.enqueue("long", {})
    await asyncio.wait_for(started.wait(), 10)
    assert (await queue.cancel("long", note="stop")).state == "requested"

    async def counted() -> bool:
        return value(await scrape_registry(metrics.registry), "asyncq_cancels_total") == 1

    await eventually(counted, "the cancel is counted")
    pool.stop()
    await asyncio.wait_for(running, 10)
    samples = await scrape_registry(metrics.registry)
    assert value(samples, "asyncq_finishes_total", status="dead") == 1
    assert value(samples, "asyncq_delivery_seconds_count", outcome="cancel") == 1


async def test_the_limits_in_force_and_the_slots_they_hold_are_gauges(queue: Queue, path: Path) -> None:
    registry = CollectorRegistry()
    registry.register(QueueCollector(path, clock=queue.now))
    assert not [key for key in await scrape_registry(registry) if key[0].startswith("asyncq_queue_limit")]
    for n in range(4):
        await queue.enqueue(f"m{n}", {}, queue="mail", limit_key=f"t{n % 2}")
    await queue.set_limits("mail", concurrency=3, per_key_concurrency=1, rate=120, per=60.0, burst=2)
    await queue.claim("w1", queue="mail", limit=5)  # one job a key: two slots used, both keys full
    samples = await scrape_registry(registry)
    limits = {name: value(samples, "asyncq_queue_limit", queue="mail", limit=name) for name in ("concurrency",
              "per_key_concurrency", "rate_per_second", "burst")}  # fmt: skip
    assert limits == {"concurrency": 3, "per_key_concurrency": 1, "rate_per_second": 2.0, "burst": 2}
    assert value(samples, "asyncq_queue_slots_used", queue="mail") == 2
    assert value(samples, "asyncq_queue_limit_keys_full", queue="mail") == 2
    assert value(samples, "asyncq_queue_rate_wait_seconds", queue="mail") == 0.5  # the burst spent: 500 ms on
