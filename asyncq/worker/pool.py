"""The asyncio worker pool: claim → await the handler with no transaction open → finish.

One batcher task owns the queue's writes: each cycle it finishes every handler result gathered so far and claims
jobs for the free slots in the same transaction (a group commit) into a buffer. A commit carries up to
``COMMIT_JOBS`` results when jobs end that fast (at most ``COMMIT_ROUNDS`` rounds of the slots, at least one:
``asyncq.worker.settings``), so its fsync and its hop to the connection's thread are shared by many jobs.
``concurrency`` worker tasks take jobs from the buffer, one at a time each: a worker that ends a job starts the next
one in the same step, without a task per job and without waiting for a turn of the event loop. The batcher and the
per-job path are this module's, in one frame; the jobs in flight are ``asyncq.worker.flight``'s, their leases
``asyncq.worker.leases``', retention ``asyncq.worker.retention``'s, the counters, observer and log ``report``'s.

The outer structure (signals, the batcher and renewer) uses anyio; the per-job path plain asyncio tasks (anyio's
per-task cancel scopes cost more than the whole cycle: 2.3x slower end to end; docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Unpack

import anyio

from asyncq.core.backoff import RetryPolicy
from asyncq.core.failures import ErrorText, error_text
from asyncq.core.flow_limits import Hold, woken_by_the_store
from asyncq.core.jobs import DEFAULT_QUEUE, MAX_BATCH, StoredResult
from asyncq.core.lifecycle import CANCEL, OK, OutcomeName
from asyncq.core.values import check_identifier
from asyncq.delivery.base import JsonText
from asyncq.errors import StoreBusy
from asyncq.queue import Attempt, Queue
from asyncq.worker.context import Handler, JobContext, TransportHandler, deliver_with
from asyncq.worker.flight import Flights, InFlight, uncancel
from asyncq.worker.leases import LeaseKeeper
from asyncq.worker.observer import PoolCounters, PoolObserver
from asyncq.worker.offering import Offering
from asyncq.worker.report import PoolReport
from asyncq.worker.results import kept_result
from asyncq.worker.retention import retention_keepers
from asyncq.worker.schedules import ScheduleKeeper
from asyncq.worker.settings import PoolOptions, PoolSettings
from asyncq.worker.supervision import BusyStore, serve, wait_for_work

# Pool is this module's; the rest are re-exported from where they live.
__all__ = ["Handler", "JobContext", "Pool", "PoolCounters", "PoolObserver", "PoolOptions", "PoolSettings",
           "RetryPolicy", "deliver_with"]  # fmt: skip

log = logging.getLogger("asyncq.worker.pool")


class Pool:
    """Run registered handlers for a queue's jobs with ``concurrency`` tasks in one process."""

    # fmt: off
    def __init__(self, queue: Queue, settings: PoolSettings | None = None, *, observer: PoolObserver | None = None,
                 **options: Unpack[PoolOptions]) -> None:
        # fmt: on
        """Settings as a ``PoolSettings`` or as its fields (``concurrency``, ``lease``, ``retry`` …: see there),
        not both; ``observer`` is told what the pool does (``asyncq.web.metrics.PoolMetrics`` is one). Bad input
        is ``TypeError``/``ValueError`` here, before anything runs."""
        if not isinstance(queue, Queue):
            raise TypeError(f"Pool needs a Queue (await Queue.open(...)), not {type(queue).__name__}")
        if settings is None:
            settings = PoolSettings(**options)
        elif not isinstance(settings, PoolSettings):
            raise TypeError(f"settings must be a PoolSettings, not {type(settings).__name__}")
        elif options:
            raise TypeError("give the pool a PoolSettings or its fields as keywords, not both")
        self._setup(queue, settings, PoolReport(observer))

    @classmethod
    async def open(
        cls, opener: Callable[[], Awaitable[Queue]], settings: PoolSettings, *, observer: PoolObserver | None = None
    ) -> Pool:
        """A pool on the queue ``await opener()`` opens (the caller closes it: ``pool.queue``); the store's lock held by
        another process is waited out as a running pool waits (logged, counted, with backoff), never failed."""
        if not isinstance(settings, PoolSettings):
            raise TypeError(f"settings must be a PoolSettings, not {type(settings).__name__}")
        report = PoolReport(observer)
        busy = BusyStore(report, settings.poll_min, settings.poll_max)
        queue = await busy.open(opener)
        pool = cls.__new__(cls)
        pool._setup(queue, settings, report, busy)
        return pool

    def _setup(self, queue: Queue, settings: PoolSettings, report: PoolReport, busy: BusyStore | None = None) -> None:
        self.queue, self.settings, self.concurrency = queue, settings, settings.concurrency
        self.owner = settings.owner or f"pool-{random.getrandbits(48):012x}"
        self.lease_ms, self.job_timeout, self.retry = settings.lease_ms, settings.job_timeout_seconds, settings.retry
        self.poll_min, self.poll_max = float(settings.poll_min), float(settings.poll_max)
        self.batch, self.prefetch, self.linger = settings.batch, settings.claim_ahead, settings.linger_seconds
        self._result_keep_ms, self._report = settings.result_keep_ms, report
        report.wakeup_losses_seen = queue.store.wakeup_losses  # losses before this pool are not its own
        self.counters, self.observer, self._observed = report.counters, report.observer, report.observed
        self._busy = busy or BusyStore(report, self.poll_min, self.poll_max)
        self._handlers: dict[str, Handler] = {}
        self._flights = Flights()
        self._fences = asyncio.Lock()  # a renewal and a group commit never overlap
        grace = settings.cancel_grace_seconds  # before a handler is cancelled on a cancel request
        self._leases = LeaseKeeper(queue, self.lease_ms, self._flights, self._fences, report, grace)
        keepers = retention_keepers(queue, settings.retention_every_ms, self.poll_max, report)  # none when off
        self.schedules = ScheduleKeeper(queue, report, self.poll_max, evaluate=settings.schedules)
        self._beside = [self._leases.run, *(keeper.run for keeper in keepers), self.schedules.run]  # beside the batcher
        self._turn = 0  # which queue claims first this cycle: free slots go round the queues
        self._holds: tuple[Hold, ...] = ()  # the queues the last commit's claim found held by their limits
        self._stopping, self._resend = False, False  # resend: a commit's reply was lost (StoreBusy.may_have_landed)
        self._ride_asked = False  # an enqueue waits to ride the next cycle (``_host_ride``)
        self._workers: list[asyncio.Task[None]] = []
        self._offering = Offering(queue, self.owner, self.poll_max, self._flights, report)  # core.offers
        self._offers = False  # whether this run offers (``run``; not a burst, nor ``run_once``)

    def register(self, queue_name: str, handler: Handler) -> None:
        """Run ``handler(body, context)`` for jobs of ``queue_name`` (registering the name again replaces it)."""
        check_identifier(queue_name, "queue_name")
        if not callable(handler):
            raise TypeError(f"handler must be callable, not {type(handler).__name__}")
        self._handlers[queue_name] = handler

    def handler(self, queue_name: str = DEFAULT_QUEUE) -> Callable[[Handler], Handler]:
        """Decorator form of ``register``."""

        def decorate(function: Handler) -> Handler:
            self.register(queue_name, function)
            return function

        return decorate

    @property
    def running(self) -> int:
        """Jobs whose handler is running now."""
        return len(self._flights.jobs) - len(self._flights.buffer)

    def stop(self) -> None:
        """Stop claiming; jobs in flight finish (``run`` returns when they have)."""
        self._stopping = True
        self._flights.wake.set()

    # -- the batcher ----------------------------------------------------------------------------------

    async def run(self, *, burst: bool = False) -> None:
        """Work until ``stop()`` (or, with ``burst``, until nothing is ready and nothing runs)."""
        self._stopping = False
        async with self._running():
            await self._work(burst)

    @contextlib.asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        """The workers and the lease keeper run inside; on the way out, handlers still running are cancelled unfinished
        (their leases expire and the jobs run again; the offer and the buffer are given back first, if possible)."""
        if not self._handlers:
            raise ValueError("register a handler before running the pool")
        await self.schedules.declare_once()  # before any claim, even a burst's (failing, the keeper tries again)
        try:
            async with anyio.create_task_group() as group:
                for run_beside in self._beside:
                    group.start_soon(run_beside)
                self._flights.idle_workers.clear()
                self._workers = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]
                yield
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                if self._offering.until is not None:  # cancelled with an offer out: withdraw it, give back its jobs
                    with contextlib.suppress(Exception):  # best effort: it ends by itself, their leases too
                        await self._cycle(capacity=0)
                if self._flights.buffer:
                    with contextlib.suppress(Exception):  # best effort: their leases expire anyway
                        await self._leases.release_buffer()
                for worker in self._workers:
                    worker.cancel()
                await asyncio.gather(*self._workers, return_exceptions=True)
                self._workers = []

    async def _work(self, burst: bool) -> None:
        withdraw, self._offers = self.queue.store.host_rides(self._host_ride), not burst
        try:
            await self._batch(burst)
        finally:
            withdraw()
            self._offers = False

    def _host_ride(self) -> bool:
        """An enqueue of this process asks for a group commit to ride in (``QueueStore.host_rides``): the next
        cycle runs now, if it has room to claim and no rate holds every queue it serves."""
        if self._stopping or self._capacity() <= 0 or not woken_by_the_store(self._holds, self._handlers):
            return False
        self._ride_asked = True
        self._flights.wake.set()
        return True

    async def _batch(self, burst: bool) -> None:
        idle_wait, flights, report = self.poll_min, self._flights, self._report
        while not (self._stopping and not flights.jobs and not flights.results):
            if self._stopping and flights.buffer:
                await self._leases.release_buffer()
                continue
            await self._gather_results()
            try:
                claimed = await self._cycle(capacity=self._capacity())
            except StoreBusy as error:  # every result is kept for the next try
                # A connection lost with the commit in flight: the next try says the results may be there already.
                self._resend = self._resend or error.may_have_landed
                await self._busy.wait(error, f"{len(flights.results)} result(s) kept")
                continue
            self._busy.reset()
            if claimed or flights.results or self._stopping:
                idle_wait = self.poll_min
                continue
            if burst and not flights.jobs and not self._holds:  # jobs a limit holds wait for it even in a burst
                return
            if flights.buffer or self.running >= self.concurrency:
                continue  # nothing to claim for now; the next finished job wakes the batcher
            await wait_for_work(self.queue, flights.wake, idle_wait, report, self._holds, self._handlers, self.poll_max)
            idle_wait = min(idle_wait * 2, self.poll_max)
            if not self._ride_asked:  # what another process's enqueue leased to this pool's offer (a ride's commit
                await self._offering.pick_up()  # takes it, without the read's delay before the enqueue it carries)

    def _capacity(self) -> int:
        """How many jobs to claim now: free slots and the prefetch's room, at most a claim's limit (0 if stopping)."""
        return 0 if self._stopping else min(self.concurrency + self.prefetch - len(self._flights.jobs), MAX_BATCH)

    def _starving(self) -> bool:
        return not self._stopping and not self._flights.buffer and self.running < self.concurrency

    async def _gather_results(self) -> None:
        """Wait until a commit is worth its fsync: slots are starving, or a batch of results is waiting, or
        the oldest waiting result has lingered ``linger`` seconds (its lease is no longer renewed)."""
        batch, flights = self.batch, self._flights
        loop = asyncio.get_running_loop()
        deadline: float | None = None  # the oldest waiting result's: linger from then, not from each wake-up
        while not (self._starving() or len(flights.results) >= batch or self._ride_asked):
            if self._stopping and (flights.results or flights.buffer or not flights.jobs):
                return
            if flights.results and deadline is None:
                deadline = loop.time() + self.linger
            if deadline is not None and loop.time() >= deadline:
                return
            flights.wake.clear()
            # asyncio directly: this runs once per finished job, where anyio's scopes cost too much
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await flights.wake.wait()

    async def run_once(self) -> int:
        """One claim (up to ``concurrency`` jobs), their handlers, and one finish commit; the job count."""
        flights = self._flights
        async with self._running():
            claimed = await self._cycle(capacity=self.concurrency)
            while flights.jobs:  # the last job to end finds the buffer empty and wakes this loop
                flights.wake.clear()
                await flights.wake.wait()
        await self._cycle(capacity=0)
        return claimed

    async def _cycle(self, *, capacity: int) -> int:
        """Finish what is done and claim up to ``capacity`` jobs, in one commit; start what slots allow."""
        flights = self._flights
        async with self._fences:  # read each ticket after any renewal in flight has replaced it
            self._ride_asked = False
            kept = flights.take_results()
            results = [Attempt(f.ticket, outcome, delay, error, value) for f, outcome, delay, error, value in kept]
            started = flights.take_started_ahead()
            wants = self._rotated_wants(capacity) if capacity > 0 else []
            free_now = max(0, self.concurrency - self.running - len(flights.buffer))
            offer = self._offering.terms(free_now if self._offers and not self._stopping else 0)
            if not results and not wants and not started and offer is None:
                return 0
            try:
                statuses, tickets, counted, self._holds = await self.queue.commit_cycle(
                    results, self.owner, wants, self.lease_ms, capacity,
                    start_now=free_now, started=[flight.ticket for flight in started], resend=self._resend, offer=offer,
                )  # fmt: skip
            except BaseException:
                flights.restore(kept, started)
                raise
            flights.counted(started, counted)
            self._offering.settled(offer, len(tickets))
            self._resend = False
        self.counters.commits += 1
        debug = log.isEnabledFor(logging.DEBUG)  # once per cycle, not twice per job
        self._report.finishes(results, statuses, debug)
        if tickets:
            self._report.claimed(len(tickets))
            for ticket in tickets if debug else ():
                log.debug("job %s token %d -> leased by %s", ticket.id, ticket.token, self.owner)
            flights.buffer_all(tickets)
        return len(tickets)

    def _rotated_wants(self, free: int) -> list[tuple[str, int]]:
        names = list(self._handlers)
        self._turn = (self._turn + 1) % len(names)
        return [(name, free) for name in names[self._turn :] + names[: self._turn]]

    # -- workers and one job --------------------------------------------------------------------------

    async def _worker(self) -> None:
        """Run buffered jobs one after another; wait while there are none (or the pool is stopping: those
        are released instead)."""
        loop, me = asyncio.get_running_loop(), asyncio.current_task()
        flights = self._flights
        buffer = flights.buffer
        while True:
            if buffer and not self._stopping:
                flight = buffer.popleft()
                flight.task = me
                if not flight.ticket.counted:  # claimed ahead: its attempt is counted in the next commit
                    flights.started_ahead.append(flight)
                if not buffer:
                    self._wake_if_needed()  # that was the last buffered job: free slots may want a claim
                try:
                    await self._run_job(flight)
                except Exception as error:  # the pool's own machinery failed around this job: keep the worker,
                    self._report.machinery_failed(flight.ticket, error)  # say so loudly, count it, and never leave
                    flights.retry_now(flight, error_text(error))  # the job leased: retried at once under its budget
                continue
            waiter = loop.create_future()
            flights.idle_workers.append(waiter)
            try:
                await waiter
            except BaseException:  # cancelled while idle: the waiter must not count as an idle worker
                with contextlib.suppress(ValueError):
                    flights.idle_workers.remove(waiter)
                raise

    async def _run_job(self, flight: InFlight) -> None:
        """Run one job's handler and keep its result for the next group commit. The handler is awaited here,
        not in a helper: each coroutine frame between the worker and the handler's I/O is passed on every
        resumption (a request has several). This runs once a job: each step it takes is paid per job."""
        ticket = flight.ticket
        observed = self._observed
        started = time.perf_counter() if observed else 0.0  # only an observer is told a job's duration
        outcome: OutcomeName | None = None  # stays None when the job ends without a result
        delay_ms = 0
        failure: ErrorText | None = None
        value: object = None
        try:
            handler = self._handlers[ticket.queue]
            # A delivery takes the stored JSON text as it is; other handlers get the decoded body.
            running: Awaitable[object]
            fence = ticket.fence
            if type(handler) is TransportHandler:
                running = handler.deliver(ticket.id, fence.token, JsonText(ticket.body_json))
            else:
                context = JobContext(
                    ticket.id, ticket.queue, ticket.attempt, fence.token, ticket.deadline, fence.lease_until
                )
                running = handler(ticket.body, context)
            if self.job_timeout is None:
                value = await running
            else:
                async with asyncio.timeout(self.job_timeout):
                    value = await running
            if value is not None and type(value) is not StoredResult:  # a task's is kept already (asyncq.tasks)
                value = kept_result(value, self._result_keep_ms)
            outcome = OK
        except Exception as error:  # classified once for every worker of asyncq (asyncq.core.failures)
            outcome, delay_ms, failure = self._report.failed(ticket, error, self.retry)
        except asyncio.CancelledError:
            # The lease keeper cancelled this job's worker because the lease was lost or a cancel was requested:
            # the worker lives on (finishing a cancelled job dead), unless the pool itself is being cancelled too.
            if not (flight.lost or flight.cancelled) or uncancel() > 0:
                raise
            outcome = None if flight.lost else CANCEL
        finally:
            del self._flights.jobs[flight.key]
            if outcome is None and not flight.lost:  # raised out: the batcher may be waiting for this slot
                self._wake_if_needed()
        if flight.lost:  # no result; if the handler swallowed the cancellation, withdraw it
            if outcome is not None:
                uncancel()
            self._report.lost(flight.ticket)
        elif outcome is not None:  # always, here: without a result the job raised out above
            if flight.cancelled and outcome != CANCEL:  # the handler swallowed the cancellation: withdraw it
                uncancel()
            # the result is kept with the job by the same commit as its finish
            stored = value if type(value) is StoredResult else None
            self._flights.results.append((flight, outcome, delay_ms, failure, stored))
            if observed:
                self._report.observe("on_delivery", time.perf_counter() - started, outcome)
        self._wake_if_needed()

    def _wake_if_needed(self) -> None:
        """Wake the batcher only when a job's end can change its decision: the first waiting result starts the linger
        clock, a full batch or a starving slot ends the wait (not for every job: a wasted loop iteration each)."""
        flights = self._flights
        waiting = len(flights.results)
        if waiting == 1 or waiting == self.batch or self._stopping or (not flights.buffer and self._starving()):
            flights.wake.set()

    # -- process life ---------------------------------------------------------------------------------

    async def serve(self, *, grace: float = 30.0, burst: bool = False) -> None:
        """``run`` until SIGINT or SIGTERM, then stop claiming and give jobs in flight ``grace`` seconds;
        any still running then are cancelled unfinished (their leases expire and they run again)."""
        await serve(self, grace, burst)
