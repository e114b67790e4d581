"""The asyncio worker pool: claim → await the handler with no transaction open → finish.

One batcher task owns the queue's writes: each cycle it finishes every handler result gathered so far
and claims jobs for the free slots in the same transaction (a group commit) into a buffer. A commit
carries up to ``COMMIT_JOBS`` results when jobs end that fast (at most ``COMMIT_ROUNDS`` rounds of the slots,
at least one), so its fsync and its hop to the connection's thread are shared by many jobs. ``concurrency``
worker tasks take jobs from the buffer, one at a time each: a worker that ends a job starts the next one
in the same step, without a task per job and without waiting for a turn of the event loop. One renewer
task extends, in one transaction, every lease past half its length; a job whose renewal is refused (the
lease was lost) is cancelled and its result is never written.
The retry policy for unexpected errors lives here, above the lifecycle, which stays exactly the lab's.

The outer structure (signals, the batcher and renewer) uses anyio; the per-job path uses plain asyncio
tasks because anyio's per-task cancel scopes cost more than the whole queue cycle (measured: 2.3x
slower end to end; docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable

import anyio

from asyncq.core.backoff import RetryPolicy
from asyncq.core.failures import ErrorText, classify, error_text
from asyncq.core.jobs import DEFAULT_LEASE_MS, DEFAULT_QUEUE, MAX_BATCH, StoredResult, Ticket
from asyncq.core.lifecycle import DEAD, OK, PERMANENT, RETRY
from asyncq.core.limits import (
    DEFAULT_RETRY_BASE_MS,
    MAX_CONCURRENCY,
    MAX_JOB_TIMEOUT_SECONDS,
    MAX_LEASE_MS,
    MAX_POLL_SECONDS,
    MIN_LEASE_MS,
    MIN_POLL_SECONDS,
)
from asyncq.core.values import Duration, check_duration, check_identifier, check_int, check_seconds, duration_ms
from asyncq.delivery.base import JsonText
from asyncq.errors import StoreBusy
from asyncq.queue import Queue
from asyncq.worker.context import Handler, JobContext, TransportHandler, deliver_with, job_fields
from asyncq.worker.observer import NoObserver, PoolCounters, PoolObserver

# Pool is this module's; the rest are re-exported from where they live.
__all__ = ["Handler", "JobContext", "Pool", "PoolCounters", "PoolObserver", "RetryPolicy", "deliver_with"]

log = logging.getLogger("asyncq.worker.pool")

# The results a group commit waits for from 16 slots up (unless a slot is starving or the oldest result has
# lingered): a commit's fsync, its hop to the connection's thread and its statements' fixed cost are shared by
# this many jobs. At 16 tasks a commit per round of the slots (17 jobs) made the pool reach 0.72x a bare aiohttp
# loop; one per 128 jobs 0.84x (docs/architecture.md, "Commits of 128 jobs"). Above 128 slots a round is more.
COMMIT_JOBS = 128
# A small pool waits for a few rounds of its slots, not for 128 results: the buffer holds a batch ahead, and
# every buffered job is a lease no other worker process can take (a 1-slot pool would hold 129 of them).
COMMIT_ROUNDS = 8
LINGER_MAX = 0.06  # the default linger: long enough for 128 results at ~2,000 jobs/s


class _InFlight:
    """A claimed job: waiting in the buffer (``task`` is None) or run by a worker."""

    __slots__ = ("key", "lost", "task", "ticket")

    def __init__(self, ticket: Ticket, key: tuple[str, int]) -> None:
        self.ticket = ticket
        self.key = key  # stays put while renewals replace the ticket
        self.task: asyncio.Task[None] | None = None
        self.lost = False


class Pool:
    """Run registered handlers for a queue's jobs with ``concurrency`` tasks in one process."""

    def __init__(
        self,
        queue: Queue,
        *,
        concurrency: int = 16,
        owner: str | None = None,
        lease: Duration | None = None,
        job_timeout: float | None = None,
        retry: RetryPolicy | None = None,
        poll_min: float = 0.05,
        poll_max: float = 1.0,
        prefetch: int | None = None,
        linger: float | None = None,
        observer: PoolObserver | None = None,
        lease_ms: int | None = None,
    ) -> None:
        """``lease`` (default 30 s), ``job_timeout``, ``poll_min``/``poll_max`` (an idle pool's poll interval) and
        ``linger`` (how long a result waits to share a commit) are seconds; ``lease_ms`` is deprecated."""
        if not isinstance(queue, Queue):
            raise TypeError(f"Pool needs a Queue (await Queue.open(...)), not {type(queue).__name__}")
        self.queue = queue
        self.concurrency = check_int(concurrency, "concurrency", 1, MAX_CONCURRENCY)
        self.owner = check_identifier(owner or f"pool-{random.getrandbits(48):012x}", "owner")
        self.lease_ms = duration_ms(lease, "lease", lease_ms, "lease_ms", DEFAULT_LEASE_MS, MIN_LEASE_MS, MAX_LEASE_MS)
        self.job_timeout = (
            None
            if job_timeout is None
            else check_duration(job_timeout, "job_timeout", MIN_POLL_SECONDS, MAX_JOB_TIMEOUT_SECONDS)
        )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        self.retry = retry or RetryPolicy()
        self.poll_min = check_duration(poll_min, "poll_min", MIN_POLL_SECONDS, MAX_POLL_SECONDS)
        self.poll_max = check_duration(poll_max, "poll_max", self.poll_min, MAX_POLL_SECONDS)
        # A commit waits for this many results (fewer when a slot starves or the oldest result has lingered).
        self.batch = max(self.concurrency, min(COMMIT_JOBS, COMMIT_ROUNDS * self.concurrency))
        # Claimed ahead, so a freed slot starts its next job at once instead of after the next commit. By
        # default a batch and a round of the slots: when a batch's results are in, a round is still buffered to
        # run while the commit is written.
        default_prefetch = min(self.batch + self.concurrency, MAX_BATCH)
        self.prefetch = check_int(default_prefetch if prefetch is None else prefetch, "prefetch", 0, MAX_BATCH)
        # How long a finished result may wait for others to share its commit; by default 60 ms, at most a tenth
        # of the lease (a waiting result's lease is not renewed).
        default_linger = min(LINGER_MAX, self.lease_ms / 10_000)
        self.linger = check_seconds(default_linger if linger is None else linger, "linger")
        if self.linger * 2000 > self.lease_ms:  # a longer wait lets a result's lease run out before its commit
            raise ValueError(f"linger must be at most half the lease ({self.lease_ms / 2000} s), got {linger!r}")
        self.counters = PoolCounters()
        self.observer: PoolObserver = observer if observer is not None else NoObserver()
        self._observed = observer is not None
        self._handlers: dict[str, Handler] = {}
        # (the flight, outcome, delay_ms, error, a task's result): the flight's ticket may still be renewed until
        # the commit
        self._results: list[tuple[_InFlight, str, int, ErrorText | None, StoredResult | None]] = []
        self._fences = asyncio.Lock()  # a renewal and a group commit never overlap
        self._turn = 0  # which queue claims first this cycle: free slots go round the queues
        self._inflight: dict[tuple[str, int], _InFlight] = {}  # running, or claimed and waiting in _buffer
        self._buffer: deque[_InFlight] = deque()
        self._stopping = False
        self._wake = asyncio.Event()  # set when a job finishes, a slot frees or stop() is called
        self._workers: list[asyncio.Task[None]] = []
        self._idle_workers: deque[asyncio.Future[None]] = deque()  # one per worker waiting for a buffered job
        self._busy_wait = 0.0  # the pause before retrying a busy store (grows while it stays busy)
        self._started_ahead: list[_InFlight] = []  # started since the last commit, their attempts not counted yet

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
        return len(self._inflight) - len(self._buffer)

    def stop(self) -> None:
        """Stop claiming; jobs in flight finish (``run`` returns when they have)."""
        self._stopping = True
        self._wake.set()

    # -- the batcher ----------------------------------------------------------------------------------

    async def run(self, *, burst: bool = False) -> None:
        """Work until ``stop()`` (or, with ``burst``, until nothing is ready and nothing runs)."""
        self._check_handlers()
        self._stopping = False
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._renew_leases)
                self._start_workers()
                await self._work(burst)
                group.cancel_scope.cancel()
        finally:
            await self._abandon_inflight()

    async def _work(self, burst: bool) -> None:
        idle_wait = self.poll_min
        while not (self._stopping and not self._inflight and not self._results):
            if self._stopping and self._buffer:
                await self._release_buffer()
                continue
            await self._gather_results()
            try:
                claimed = await self._cycle(capacity=self._capacity())
            except StoreBusy as error:
                await self._wait_out_busy_store(error)
                continue
            self._busy_wait = 0.0
            if claimed or self._results or self._stopping:
                idle_wait = self.poll_min
                continue
            if burst and not self._inflight:
                return
            if self._buffer or self.running >= self.concurrency:
                continue  # nothing to claim for now; the next finished job wakes the batcher
            await self._idle(idle_wait)
            idle_wait = min(idle_wait * 2, self.poll_max)

    async def _wait_out_busy_store(self, error: StoreBusy) -> None:
        """Another process held the store's lock past the busy timeout (a debugger, a VM pause, a stopped
        process): nothing changed; keep every result, log, count, and try again after a growing pause."""
        self._busy_wait = min(max(self._busy_wait * 2, self.poll_min), self.poll_max)
        self.counters.store_busy += 1
        self._observe("on_store_busy")
        log.warning(
            "store busy (%s): %d result(s) kept, trying again in %.3f s", error, len(self._results), self._busy_wait
        )
        await anyio.sleep(self._busy_wait)

    def _capacity(self) -> int:
        """How many jobs to claim now: free slots plus the prefetch buffer's room, at most a claim's limit
        (none once stopping)."""
        return 0 if self._stopping else min(self.concurrency + self.prefetch - len(self._inflight), MAX_BATCH)

    def _starving(self) -> bool:
        return not self._stopping and not self._buffer and self.running < self.concurrency

    async def _gather_results(self) -> None:
        """Wait until a commit is worth its fsync: slots are starving, or a batch of results is waiting, or
        the oldest waiting result has lingered ``linger`` seconds (its lease is no longer renewed)."""
        batch = self.batch
        loop = asyncio.get_running_loop()
        deadline: float | None = None  # the oldest waiting result's: linger from then, not from each wake-up
        while not (self._starving() or len(self._results) >= batch):
            if self._stopping and (self._results or self._buffer or not self._inflight):
                return
            if self._results and deadline is None:
                deadline = loop.time() + self.linger
            if deadline is not None and loop.time() >= deadline:
                return
            self._wake.clear()
            # asyncio directly: this runs once per finished job, where anyio's scopes cost too much
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await self._wake.wait()

    async def run_once(self) -> int:
        """One claim (up to ``concurrency`` jobs), their handlers, and one finish commit; the job count."""
        self._check_handlers()
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._renew_leases)
                self._start_workers()
                claimed = await self._cycle(capacity=self.concurrency)
                while self._inflight:  # the last job to end finds the buffer empty and wakes this loop
                    self._wake.clear()
                    await self._wake.wait()
                group.cancel_scope.cancel()
            await self._cycle(capacity=0)
        finally:
            await self._abandon_inflight()
        return claimed

    def _check_handlers(self) -> None:
        if not self._handlers:
            raise ValueError("register a handler before running the pool")

    async def _cycle(self, *, capacity: int) -> int:
        """Finish what is done and claim up to ``capacity`` jobs, in one commit; start what slots allow."""
        async with self._fences:  # read each ticket after any renewal in flight has replaced it
            kept = self._results
            results = [(flight.ticket, outcome, delay, error, value) for flight, outcome, delay, error, value in kept]
            self._results = []
            started = self._take_started_ahead()
            wants = self._rotated_wants(capacity) if capacity > 0 else []
            if not results and not wants and not started:
                return 0
            free_now = max(0, self.concurrency - self.running - len(self._buffer))
            try:
                statuses, tickets, counted = await self.queue.commit_cycle(
                    results,
                    self.owner,
                    wants,
                    self.lease_ms,
                    capacity,
                    start_now=free_now,
                    started=[flight.ticket for flight in started],
                )
            except BaseException:
                self._results = kept + self._results  # nothing landed: the next commit carries them
                self._started_ahead = started + self._started_ahead
                raise
            self._counted(started, counted)
        self.counters.commits += 1
        debug = log.isEnabledFor(logging.DEBUG)  # once per cycle, not twice per job
        self._record_finishes(results, statuses, debug)
        if tickets:
            self.counters.claimed += len(tickets)
            self._observe("on_claimed", len(tickets))
            self._buffer_tickets(tickets, debug)
        return len(tickets)

    def _record_finishes(
        self,
        results: list[tuple[Ticket, str, int, ErrorText | None, StoredResult | None]],
        statuses: list[str | None],
        debug: bool,
    ) -> None:
        """Count (and log, and tell the observer of) each finish of a commit. When all landed and none is dead,
        with no observer and no debug log, only the counts change: counted per status, not per job."""
        if debug or self._observed or None in statuses or DEAD in statuses:
            for (ticket, outcome, *_rest), status in zip(results, statuses, strict=True):
                self._log_finish(ticket, status, debug)
                self._observe("on_finished", outcome, status)
            return
        finished = self.counters.finished
        for status, count in Counter(statuses).items():
            assert status is not None  # checked above
            finished[status] = finished.get(status, 0) + count

    def _buffer_tickets(self, tickets: list[Ticket], debug: bool) -> None:
        """Put claimed jobs in the buffer and wake a worker for each (as many as are idle)."""
        inflight, append = self._inflight, self._buffer.append
        for ticket in tickets:
            if debug:
                log.debug("job %s token %d -> leased by %s", ticket.id, ticket.token, self.owner)
            key = (ticket.id, ticket.fence.token)
            flight = inflight[key] = _InFlight(ticket, key)
            append(flight)
        self._wake_workers()

    # -- workers --------------------------------------------------------------------------------------

    def _start_workers(self) -> None:
        self._idle_workers.clear()
        self._workers = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]

    def _wake_workers(self) -> None:
        """Wake one idle worker per buffered job."""
        jobs = len(self._buffer)
        while jobs and self._idle_workers:
            waiter = self._idle_workers.popleft()
            if not waiter.done():
                waiter.set_result(None)
                jobs -= 1

    async def _worker(self) -> None:
        """Run buffered jobs one after another; wait while there are none (or the pool is stopping: those
        are released instead)."""
        loop, me = asyncio.get_running_loop(), asyncio.current_task()
        while True:
            if self._buffer and not self._stopping:
                flight = self._buffer.popleft()
                flight.task = me
                if not flight.ticket.counted:  # claimed ahead: its attempt is counted in the next commit
                    self._started_ahead.append(flight)
                if not self._buffer:
                    self._wake_if_needed()  # that was the last buffered job: free slots may want a claim
                try:
                    await self._run_job(flight)
                except Exception as error:  # the pool's own machinery failed around this job: keep the worker
                    self._machinery_failed(flight, error)
                continue
            waiter = loop.create_future()
            self._idle_workers.append(waiter)
            try:
                await waiter
            except BaseException:  # cancelled while idle: the waiter must not count as an idle worker
                with contextlib.suppress(ValueError):
                    self._idle_workers.remove(waiter)
                raise

    def _take_started_ahead(self) -> list[_InFlight]:
        """The jobs claimed ahead whose handlers started since the last commit and are still running: their
        attempts are counted in this commit (a job that already ended has its attempt counted by its finish)."""
        started = [flight for flight in self._started_ahead if self._inflight.get(flight.key) is flight]
        self._started_ahead = []
        return started

    def _counted(self, started: list[_InFlight], counted: list[bool]) -> None:
        for flight, landed in zip(started, counted, strict=True):
            if landed:
                flight.ticket = flight.ticket.started()

    def _machinery_failed(self, flight: _InFlight, error: Exception) -> None:
        """Not the handler but the pool failed around a job: log it loudly, count it, and never leave the job
        leased for its lease to run out: it is retried at once under its budget (or dropped if its lease was
        lost). The worker goes on with the next job."""
        self.counters.internal_errors += 1
        log.error(
            "internal error around job %s: %r",
            flight.ticket.id,
            error,
            exc_info=error,
            extra=_fields(flight.ticket, RETRY),
        )
        self._inflight.pop(flight.key, None)
        recorded = any(result[0] is flight for result in self._results)
        if not flight.lost and not recorded:
            self._results.append((flight, RETRY, DEFAULT_RETRY_BASE_MS, error_text(error), None))
        self._wake.set()

    def _observe(self, event: str, *args: object) -> None:
        """Tell the observer, which must never raise: if it does, log and count it, and carry on. A pool given no
        observer skips this (twice a job: the cost showed in the no-op benchmark)."""
        if not self._observed:
            return
        try:
            getattr(self.observer, event)(*args)
        except Exception as error:
            self.counters.internal_errors += 1
            log.error("pool observer failed in %s: %r", event, error, exc_info=error)

    def _rotated_wants(self, free: int) -> list[tuple[str, int]]:
        names = list(self._handlers)
        self._turn = (self._turn + 1) % len(names)
        return [(name, free) for name in names[self._turn :] + names[: self._turn]]

    async def _idle(self, seconds: float) -> None:
        """Nothing was ready: wait for an enqueue in this process, a finished job, or the poll interval."""
        self._wake.clear()
        with anyio.move_on_after(seconds):
            async with anyio.create_task_group() as waiters:

                async def on_enqueue() -> None:
                    await self.queue.wait_for_rows(seconds)
                    waiters.cancel_scope.cancel()

                async def on_wake() -> None:
                    await self._wake.wait()
                    waiters.cancel_scope.cancel()

                waiters.start_soon(on_enqueue)
                waiters.start_soon(on_wake)

    def _log_finish(self, ticket: Ticket, status: str | None, debug: bool) -> None:
        self.counters.count_status(status)
        if status is None:
            log.warning(
                "stale finish rejected for job %s token %d", ticket.id, ticket.token, extra=_fields(ticket, "stale")
            )
        elif status == "dead":  # a problem for an operator: it waits for a redrive
            log.warning(
                "job %s token %d -> dead after attempt %d",
                ticket.id,
                ticket.token,
                ticket.attempt,
                extra=_fields(ticket, status),
            )
        elif debug:
            log.debug("job %s token %d -> %s", ticket.id, ticket.token, status)

    # -- leases ---------------------------------------------------------------------------------------

    async def _renew_leases(self) -> None:
        """Every quarter lease, extend (in one commit) each lease past half its length; cancel the jobs
        whose lease was lost."""
        while True:
            await anyio.sleep(self.lease_ms / 4000)
            async with self._fences:
                now = self.queue.now()
                due = [f for f in self._inflight.values() if f.ticket.lease_until - now <= self.lease_ms // 2]
                if not due:
                    continue
                try:
                    with anyio.CancelScope(shield=True):  # a renewal that lands is always recorded
                        renewed = await self.queue.extend_many([flight.ticket for flight in due], self.lease_ms)
                except StoreBusy as error:  # nothing renewed; the next quarter lease tries again
                    self.counters.store_busy += 1
                    self._observe("on_store_busy")
                    log.warning("store busy (%s): %d lease(s) not renewed, trying again", error, len(due))
                    continue
                for flight, ticket in zip(due, renewed, strict=True):
                    if ticket is not None:
                        flight.ticket = ticket
                    else:
                        self._lose(flight)

    def _lose(self, flight: _InFlight) -> None:
        """The lease was taken away: cancel the handler (or drop the job from the buffer); no result."""
        if flight.task is None:
            self._buffer.remove(flight)
            del self._inflight[flight.key]
            self._count_lost(flight)
            self._wake.set()  # a slot's worth of work is gone: the batcher may claim again, run_once may end
        elif self._inflight.get(flight.key) is flight and not flight.lost:  # its worker is still running it
            flight.lost = True
            flight.task.cancel()

    def _count_lost(self, flight: _InFlight) -> None:
        self.counters.leases_lost += 1
        self._observe("on_lease_lost")
        ticket = flight.ticket
        log.warning(
            "lease lost for job %s token %d: result discarded", ticket.id, ticket.token, extra=_fields(ticket, "lost")
        )

    async def _release_buffer(self) -> None:
        """Stopping: give back the jobs claimed ahead and never started, so other workers take them at once
        instead of after their leases expire."""
        async with self._fences:
            flights = list(self._buffer)
            self._buffer.clear()
            for flight in flights:
                del self._inflight[flight.key]
            with anyio.CancelScope(shield=True):
                released = await self.queue.release_many([flight.ticket for flight in flights])
        log.debug("released %d job(s) claimed ahead and never started", sum(released))

    async def _abandon_inflight(self) -> None:
        """On cancellation: stop handlers unfinished. Their leases expire and the jobs run again (the buffer
        is given back first, when the file still answers)."""
        with anyio.CancelScope(shield=True):
            if self._buffer:
                with contextlib.suppress(Exception):  # best effort: their leases expire anyway
                    await self._release_buffer()
            for worker in self._workers:
                worker.cancel()
            await asyncio.gather(*self._workers, return_exceptions=True)
            self._workers = []

    # -- one job --------------------------------------------------------------------------------------

    async def _run_job(self, flight: _InFlight) -> None:
        """Run one job's handler and keep its result for the next group commit. The handler is awaited here,
        not in a helper: each coroutine frame between the worker and the handler's I/O is passed on every
        resumption (a request has several). This runs once a job: each step it takes is paid per job."""
        ticket = flight.ticket
        observed = self._observed
        started = time.perf_counter() if observed else 0.0  # only an observer is told a job's duration
        outcome: str | None = None  # stays None when the job ends without a result
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
            outcome = OK
        except Exception as error:  # classified once for every worker of asyncq (asyncq.core.failures)
            outcome, delay_ms, failure = self._failed(ticket, error)
        except asyncio.CancelledError:
            # The renewer cancelled this job's worker because the lease was lost: the worker lives on,
            # unless the pool itself is being cancelled too.
            if not flight.lost or _uncancel() > 0:
                raise
        finally:
            del self._inflight[flight.key]
            if outcome is None and not flight.lost:  # raised out: the batcher may be waiting for this slot
                self._wake_if_needed()
        if flight.lost:  # no result; if the handler swallowed the cancellation, withdraw it
            if outcome is not None:
                _uncancel()
            self._count_lost(flight)
        elif outcome is not None:  # always, here: without a result the job raised out above
            # a task's result (asyncq.tasks) is kept with the job by the same commit as its finish
            stored = value if type(value) is StoredResult else None
            self._results.append((flight, outcome, delay_ms, failure, stored))
            if observed:
                self._observe("on_delivery", time.perf_counter() - started, outcome)
        self._wake_if_needed()

    def _failed(self, ticket: Ticket, error: Exception) -> tuple[str, int, ErrorText]:
        """A handler's failure as an outcome, a delay and the error kept with the job. A policy that fails here
        (a jitter out of range) must not lose the job: its base delay is used, and the failure is logged."""
        try:
            outcome, delay_ms = classify(error, ticket.attempt, self.retry)
        except Exception as policy_error:
            self.counters.internal_errors += 1
            log.error(
                "retry policy failed for job %s: %r",
                ticket.id,
                policy_error,
                exc_info=policy_error,
                extra=_fields(ticket, RETRY),
            )
            outcome, delay_ms = RETRY, self.retry.base_ms
        if outcome == PERMANENT:
            log.warning("job %s failed permanently: %r", ticket.id, error, extra=_fields(ticket, outcome))
        else:
            self.counters.handler_errors += 1
            log.warning(
                "job %s attempt %d failed: %r", ticket.id, ticket.attempt, error, extra=_fields(ticket, outcome)
            )
        return outcome, delay_ms, error_text(error)

    def _wake_if_needed(self) -> None:
        """Wake the batcher only when a job's end can change its decision: the first waiting result starts
        the linger clock, a full batch or a starving slot ends the wait. Waking it for every job was a wasted
        loop iteration per job."""
        waiting = len(self._results)
        if waiting == 1 or waiting == self.batch or self._stopping or (not self._buffer and self._starving()):
            self._wake.set()

    # -- process life ---------------------------------------------------------------------------------

    async def serve(self, *, grace: float = 30.0, burst: bool = False) -> None:
        """``run`` until SIGINT or SIGTERM, then stop claiming and give jobs in flight ``grace`` seconds;
        any still running then are cancelled unfinished (their leases expire and they run again)."""
        async with anyio.create_task_group() as group:

            async def watch_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        log.info("signal %d: stopping, %d job(s) in flight", signum, len(self._inflight))
                        self.stop()
                        await anyio.sleep(grace)
                        group.cancel_scope.cancel()
                        return

            async def work() -> None:
                await self.run(burst=burst)
                group.cancel_scope.cancel()

            group.start_soon(watch_signals)
            group.start_soon(work)


def _uncancel() -> int:
    """Withdraw one cancellation request from the current task; how many remain."""
    task = asyncio.current_task()
    assert task is not None
    return task.uncancel()


def _fields(ticket: Ticket, outcome: str) -> dict[str, object]:
    return job_fields(ticket.id, ticket.queue, ticket.attempt, outcome)
