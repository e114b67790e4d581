"""Prometheus metrics for a worker pool and an inbox receiver (the ``metrics`` extra: prometheus-client).

Every figure goes into a registry of its own, never prometheus-client's global one, so that several pools
(and tests) in one process never collide. Counters move as the pool works; gauges are read at scrape time.

==========================================  =======================================================================
metric                                      meaning
==========================================  =======================================================================
``asyncq_claims_total``                     jobs this pool leased
``asyncq_finishes_total{status}``           finishes that landed, by the job's new status (done, pending, dead)
``asyncq_stale_finishes_total``             finishes refused because the ticket no longer held the lease
``asyncq_retries_total``                    failed attempts put back to pending for another try
``asyncq_leases_lost_total``                handlers cancelled because their lease renewal was refused
``asyncq_cancels_total``                    jobs this pool ended dead on a cancel request (``Queue.cancel``)
``asyncq_delivery_seconds{outcome}``        handler (delivery) time by outcome: ok, retry, permanent, cancel
``asyncq_jobs{status}``                     jobs in the queue file by status, read at scrape time
``asyncq_dead_jobs{reason}``                dead jobs by reason, read at scrape time
``asyncq_oldest_ready_age_seconds``         how long the oldest ready job has waited (0 when none waits)
``asyncq_queue_file_up``                    1 if the queue file could be read at scrape time, else 0
``asyncq_queue_paused{queue}``              1 while a queue is paused (queues with stored settings)
``asyncq_queue_retention_seconds``          each retention rule's window by state, ``{queue,task,state}`` (queue
                                            ``*``: the default; task empty: the whole queue; absent: for ever)
``asyncq_queue_limit{queue,limit}``         a queue's limits in force: ``concurrency``, ``per_key_concurrency``,
                                            ``rate_per_second``, ``burst`` (absent: no such limit)
``asyncq_queue_slots_used{queue}``          a limited queue's live leases now (what its concurrency limit counts)
``asyncq_queue_limit_keys_full{queue}``     limit keys at their per-key limit now
``asyncq_queue_rate_wait_seconds{queue}``   how long until the rate lets the next job start (0: it has room)
``asyncq_store_busy_total``                 store calls that failed transiently and were retried (a lock, a lost
                                            connection, a restarting or read-only server)
``asyncq_wakeups_lost_total``               times the store's wake-ups from other processes were lost (a listener's
                                            connection, a file watcher's source) while the pool ran: it polled
``asyncq_retention_removed_total{state}``   finished jobs this pool's retention step removed
``asyncq_enqueues_total{result}``           a queue's enqueue answers: added, existing, unique_held (an active job
                                            held the key), unique_refused (``EnqueueCollector``)
``asyncq_schedule_ticks_total``             a schedule's ticks by outcome (fired, skipped, missed), as its stored
``{schedule,outcome}``                      counters say (every process's evaluations), read at scrape time
``asyncq_schedule_next_run_seconds``        seconds until a live schedule's next tick (below 0: overdue by that)
``asyncq_schedule_paused{schedule}``        1 while a live schedule is paused
``asyncq_inbox_events_total{outcome}``      inbox requests since start: applied, duplicate, conflict,
                                            rejected (400/413), failed (the effect refused or failed)
==========================================  =======================================================================

Beside a pool::

    metrics = PoolMetrics(queue_path=queue.path, clock=queue.now)
    pool = Pool(queue, observer=metrics)
    async with await start_metrics_server(metrics.registry, port=9108):
        await pool.serve()

In an inbox app: ``instrument_inbox_app(make_inbox_app(db))`` adds ``GET /metrics``.

Scrape-time reads go through the ``Queue`` facade: each scrape opens the queue read-only, reads ``stats()`` and
closes it, on an event loop of its own in the scraping thread (``metrics_routes`` scrapes in a worker thread;
prometheus-client's own server has its threads). Why not the pool's loop (``run_coroutine_threadsafe``)? A
collector is called from a thread and must not depend on that loop being free: a scrape would then wait behind a
busy loop, hang if the loop is blocked, and deadlock if it is called on the loop's own thread; and
``PoolMetrics(queue_path=…)`` is built without a loop or an open queue to hand. Why not a background sampler
into a cache? The figures would be as old as its period, and it would need a task whose life someone manages.
A scrape costs one read-only open (a few milliseconds), and never touches the pool's connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from asyncq.core.clock import wall_clock_ms
from asyncq.core.flow import QueueSettings
from asyncq.core.flow_limits import LimitUsage, rate_per_second
from asyncq.core.lifecycle import CANCEL, DEAD, DONE, OUTCOMES, PENDING, RETRY
from asyncq.core.retention import RETENTION_STATES, RetentionRule
from asyncq.core.schedules import Schedule
from asyncq.core.stats import Stats
from asyncq.inbox import INBOX_KEY, Inbox
from asyncq.queue import Queue

log = logging.getLogger("asyncq.web.metrics")

#: Delivery-time buckets in seconds: from a local handler's milliseconds to an HTTP call near its timeout.
DELIVERY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
INBOX_OUTCOMES = ("applied", "duplicate", "conflict", "rejected", "failed")
ENQUEUE_RESULTS = ("added", "existing", "unique_held", "unique_refused")
SCRAPE_TIMEOUT = 5.0

T = TypeVar("T")


def run_on_own_loop(make: Callable[[], Awaitable[T]]) -> T:
    """``make()`` awaited on a new event loop: in this thread, or in a thread of its own if this one is running
    a loop already (a collector called from a coroutine must not start a loop inside it)."""

    async def main() -> T:
        return await make()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncq-scrape") as pool:
        return pool.submit(asyncio.run, main()).result()


class PoolMetrics:
    """A pool observer (``Pool(queue, observer=…)``) counting into ``registry`` (a new one if not given).

    With ``queue_path``, the registry also reads the queue file's depth at scrape time
    (:class:`QueueCollector`, with ``clock`` in epoch milliseconds, the queue's time base)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        queue_path: str | os.PathLike[str] | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.registry = into = registry if registry is not None else CollectorRegistry()
        self.claims = Counter("asyncq_claims", "Jobs this pool leased.", registry=into)
        self.finishes = Counter("asyncq_finishes", "Finishes that landed, by new status.", ["status"], registry=into)
        self.stale_finishes = Counter("asyncq_stale_finishes", "Finishes refused as stale (lease lost).", registry=into)
        self.retries = Counter("asyncq_retries", "Failed attempts put back to pending.", registry=into)
        self.leases_lost = Counter("asyncq_leases_lost", "Handlers cancelled after a refused renewal.", registry=into)
        self.cancels = Counter("asyncq_cancels", "Jobs ended dead on a cancel request.", registry=into)
        self.store_busy = Counter(
            "asyncq_store_busy",
            "Store calls that failed transiently and were retried: a lock held past the busy timeout (SQLite), a lost"
            " connection, a restarting or read-only server (PostgreSQL).",
            registry=into,
        )
        self.wakeups_lost = Counter(
            "asyncq_wakeups_lost",
            "Times the store's wake-ups from other processes were lost (a listening connection, a file watcher's"
            " source) while this pool ran: it polled until they were back.",
            registry=into,
        )
        self.retention_removed = Counter(
            "asyncq_retention_removed", "Finished jobs this pool's retention step removed, by state.", ["state"],
            registry=into,
        )  # fmt: skip
        for state in RETENTION_STATES:
            self.retention_removed.labels(state)
        self.delivery = Histogram(
            "asyncq_delivery_seconds", "Handler time by outcome.", ["outcome"], buckets=DELIVERY_BUCKETS, registry=into
        )
        for status in (DONE, PENDING, DEAD):
            self.finishes.labels(status)  # present at zero from the first scrape
        for outcome in OUTCOMES:
            self.delivery.labels(outcome)
        if queue_path is not None:
            self.registry.register(QueueCollector(queue_path, clock=clock))

    def on_claimed(self, count: int) -> None:
        """``count`` jobs were leased in one commit."""
        self.claims.inc(count)

    def on_finished(self, outcome: str, status: str | None) -> None:
        """A finish of ``outcome`` committed with the job's new ``status`` (``None``: refused as stale)."""
        if status is None:
            self.stale_finishes.inc()
            return
        self.finishes.labels(status).inc()
        if outcome == RETRY and status == PENDING:
            self.retries.inc()
        elif outcome == CANCEL and status == DEAD:
            self.cancels.inc()

    def on_delivery(self, seconds: float, outcome: str) -> None:
        """A handler returned ``outcome`` after ``seconds``."""
        self.delivery.labels(outcome).observe(seconds)

    def on_lease_lost(self) -> None:
        """A handler was cancelled because its lease was taken away."""
        self.leases_lost.inc()

    def on_store_busy(self) -> None:
        """Another process held the store's lock past the busy timeout; the pool waits and tries again."""
        self.store_busy.inc()

    def on_retention(self, state: str, jobs: int) -> None:
        """The pool's retention step removed ``jobs`` finished jobs in ``state``."""
        self.retention_removed.labels(state).inc(jobs)

    def on_wakeups_lost(self, losses: int) -> None:
        """The store's wake-ups from other processes were lost ``losses`` more times."""
        self.wakeups_lost.inc(losses)


class QueueCollector(Collector):
    """Depth by status, dead jobs by reason, the oldest ready job's age, which queues are paused, their retention and
    their limits with the slots used, read through ``Queue.stats()``, ``Queue.queue_settings()`` and
    ``Queue.limits()`` per scrape (see the module's docstring for why on a loop of its own)."""

    def __init__(self, path: str | os.PathLike[str], *, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.path = path
        self.clock = clock

    def describe(self) -> Iterable[Metric]:
        """The metric names, without reading the file (for the registry's duplicate check)."""
        return self._families(None) + schedule_families([], 0) + limit_families((), None)

    def collect(self) -> Iterable[Metric]:
        """Read the file once; a file that cannot be read shows as ``asyncq_queue_file_up 0``."""
        try:
            stats, settings, rules, schedules, groups_open, limits = run_on_own_loop(self.read)
        except Exception as error:  # missing, not a queue, locked: the gauge says so, the scrape goes on
            log.warning("metrics: cannot read queue file %s: %s", self.path, error)
            return self._families(None, up=0)
        families = self._families(stats, settings=settings, rules=rules, groups_open=groups_open)
        return families + schedule_families(schedules, stats.now_ms) + limit_families(limits, stats.now_ms)

    async def read(
        self,
    ) -> tuple[Stats, list[QueueSettings], list[RetentionRule], list[Schedule], int, list[LimitUsage]]:
        """The queue's stats, stored queue settings, retention rules, schedules, open groups and limits now, through a
        read-only ``Queue`` (nothing is created or changed)."""
        async with await Queue.open(self.path, read_only=True, clock=self.clock, busy_timeout=SCRAPE_TIMEOUT) as queue:
            stats, settings, rules = await queue.stats(), await queue.queue_settings(), await queue.retention_rules()
            return stats, settings, rules, await queue.schedules(), await queue.open_groups(), await queue.limits()

    @staticmethod
    def _families(
        stats: Stats | None,
        up: int = 1,
        settings: Sequence[QueueSettings] = (),
        rules: Sequence[RetentionRule] = (),
        groups_open: int = 0,
    ) -> list[Metric]:
        jobs = GaugeMetricFamily("asyncq_jobs", "Jobs in the queue file by status.", labels=["status"])
        dead = GaugeMetricFamily("asyncq_dead_jobs", "Dead jobs by reason.", labels=["reason"])
        oldest = GaugeMetricFamily("asyncq_oldest_ready_age_seconds", "Wait of the oldest ready job.")
        file_up = GaugeMetricFamily("asyncq_queue_file_up", "1 if the queue file was readable.", value=up)
        paused = GaugeMetricFamily(
            "asyncq_queue_paused", "1 while a queue is paused (queues with stored settings).", labels=["queue"]
        )
        retention = GaugeMetricFamily(
            "asyncq_queue_retention_seconds",
            "How long a retention rule keeps finished jobs, by state (queue '*': the default; task '': the whole"
            " queue; a state kept for ever is absent).",
            labels=["queue", "task", "state"],
        )
        for each in settings:
            paused.add_metric([each.queue], int(each.paused))
        for rule in rules:
            for state in RETENTION_STATES:
                window = rule.windows.of(state)
                if window is not None:
                    retention.add_metric([*rule.key, state], window / 1000)
        if stats is not None:
            for status, count in stats.by_status.items():
                jobs.add_metric([status], count)
            for reason, count in sorted(stats.dead_by_reason.items()):
                dead.add_metric([reason], count)
            oldest.add_metric([], (stats.oldest_ready_age_ms or 0) / 1000)
        # Jobs waiting for their dependencies are asyncq_jobs{status="waiting"}; groups not complete yet:
        groups = GaugeMetricFamily("asyncq_groups_open", "Groups not complete yet (sealed or not).", value=groups_open)
        return [jobs, dead, oldest, file_up, paused, retention, groups]


class EnqueueCollector(Collector):
    """``asyncq_enqueues_total{result}`` from a ``Queue``'s ``enqueue_counts`` since it opened: ``added``,
    ``existing`` (the same id and body there already), ``unique_held`` (an active job held the unique key: answered
    with its id) and ``unique_refused`` (``UniqueConflict`` raised). Register it beside the producers' queue:
    ``registry.register(EnqueueCollector(queue))``."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def describe(self) -> Iterable[Metric]:
        """The metric name, for the registry's duplicate check."""
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        """The counts as they are now (read from the process's memory: no store is touched)."""
        counts = self.queue.enqueue_counts
        family = self._family()
        for result in ENQUEUE_RESULTS:
            family.add_metric([result], getattr(counts, result))
        return [family]

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily("asyncq_enqueues", "Enqueue answers of this queue by result.", labels=["result"])


def schedule_families(schedules: Sequence[Schedule], now_ms: int) -> list[Metric]:
    """Each schedule's stored tick counters; each live one's next run and pause."""
    ticks = CounterMetricFamily(
        "asyncq_schedule_ticks", "A schedule's ticks by outcome (its stored counters).", labels=["schedule", "outcome"]
    )
    next_run = GaugeMetricFamily(
        "asyncq_schedule_next_run_seconds", "Seconds until a live schedule's next tick (below 0: overdue).",
        labels=["schedule"],
    )  # fmt: skip
    paused = GaugeMetricFamily("asyncq_schedule_paused", "1 while a live schedule is paused.", labels=["schedule"])
    for each in schedules:
        for outcome, count in (("fired", each.ticks_fired), ("skipped", each.ticks_skipped),
                               ("missed", each.ticks_missed)):  # fmt: skip
            ticks.add_metric([each.name, outcome], count)
        if not each.retired:
            paused.add_metric([each.name], int(each.paused))
            if each.next_tick is not None:
                next_run.add_metric([each.name], (each.next_tick - now_ms) / 1000)
    return [ticks, next_run, paused]


def limit_families(limits: Sequence[LimitUsage], now_ms: int | None) -> list[Metric]:
    """The limits in force and what they hold (``describe`` names them with none)."""
    limit = GaugeMetricFamily(
        "asyncq_queue_limit", "A queue's limits in force (absent: no such limit).", labels=["queue", "limit"]
    )
    used = GaugeMetricFamily("asyncq_queue_slots_used", "A limited queue's live leases now.", labels=["queue"])
    full = GaugeMetricFamily("asyncq_queue_limit_keys_full", "Limit keys at their per-key limit now.", labels=["queue"])
    wait = GaugeMetricFamily(
        "asyncq_queue_rate_wait_seconds", "Until the rate lets the next job start (0: room now).", labels=["queue"]
    )
    for each in limits:
        values = each.limits._asdict() | {"rate_per_second": rate_per_second(each.limits)}
        for name in ("concurrency", "per_key_concurrency", "rate_per_second", "burst"):
            if values[name] is not None:
                limit.add_metric([each.queue, name], values[name])
        used.add_metric([each.queue], each.slots_used)
        full.add_metric([each.queue], each.keys_full)
        if each.rate_next_ms is not None and now_ms is not None:
            wait.add_metric([each.queue], max(0, each.rate_next_ms - now_ms) / 1000)
    return [limit, used, full, wait]


class InboxCollector(Collector):
    """``asyncq_inbox_events_total{outcome}`` from an :class:`~asyncq.inbox.Inbox`'s counters since start."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox

    def describe(self) -> Iterable[Metric]:
        """The metric name, for the registry's duplicate check."""
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        """The counters as they are now."""
        counters = self.inbox.counters
        values = (counters.applied, counters.duplicates, counters.conflicts, counters.rejected, counters.failed)
        family = self._family()
        for outcome, value in zip(INBOX_OUTCOMES, values, strict=True):
            family.add_metric([outcome], value)
        return [family]

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily("asyncq_inbox_events", "Inbox requests since start, by outcome.", labels=["outcome"])


# --- HTTP ------------------------------------------------------------------------------------------------


def metrics_routes(registry: CollectorRegistry, *, path: str = "/metrics") -> list[web.RouteDef]:
    """``GET path``: the registry in Prometheus' text format, rendered in a worker thread."""

    async def scrape(request: web.Request) -> web.Response:
        body = await asyncio.to_thread(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return [web.get(path, scrape)]


def instrument_inbox_app(
    app: web.Application, registry: CollectorRegistry | None = None, *, path: str = "/metrics"
) -> CollectorRegistry:
    """Add the inbox's counters (``app[INBOX_KEY]``, as ``make_inbox_app`` sets it) and ``GET path`` to
    ``app``; the registry used (a new one if not given)."""
    registry = registry if registry is not None else CollectorRegistry()
    registry.register(InboxCollector(app[INBOX_KEY]))
    app.add_routes(metrics_routes(registry, path=path))
    return registry


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; ``await close()`` (or ``async with``) stops it."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        """The scrape URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def close(self) -> None:
        """Stop serving and release the port."""
        await self.runner.cleanup()

    async def __aenter__(self) -> MetricsServer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def start_metrics_server(registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0) -> MetricsServer:
    """Serve ``GET /metrics`` for ``registry`` on ``host:port`` (0: any free port) beside a pool."""
    app = web.Application()
    app.add_routes(metrics_routes(registry))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    return MetricsServer(runner, str(bound_host), int(bound_port))
