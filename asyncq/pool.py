"""The asyncio worker pool: claim → await the handler with no transaction open → finish.

One batcher task owns the queue's writes: each cycle it finishes every handler result gathered so far
and claims jobs for the free slots in the same transaction (a group commit), then starts one asyncio
task per claimed job. One renewer task extends, in one transaction, every lease past half its length;
a job whose renewal is refused (the lease was lost) is cancelled and its result is never written.
The retry policy for unexpected errors lives here, above the lifecycle, which stays exactly the lab's.

The outer structure (signals, the batcher and renewer) uses anyio; the per-job path uses plain asyncio
tasks because anyio's per-task cancel scopes cost more than the whole queue cycle (measured: 2.3x
slower end to end; docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from asyncq.core.backoff import retry_delay
from asyncq.core.lifecycle import OK, PERMANENT, RETRY
from asyncq.core.values import check_identifier, check_int
from asyncq.delivery.base import Transport
from asyncq.errors import Permanent, Retryable
from asyncq.jobs import DEFAULT_LEASE_MS, DEFAULT_QUEUE, Ticket
from asyncq.queue import Queue

log = logging.getLogger("asyncq.pool")


@dataclass(frozen=True)
class JobContext:
    """What a handler knows about the job it runs."""

    id: str
    queue: str
    attempt: int
    token: int
    deadline: int
    lease_until: int


Handler = Callable[[Any, JobContext], Awaitable[object]]


def deliver_with(transport: Transport) -> Handler:
    """A handler that delivers each job's body through ``transport``, with its fencing token in the
    ``Asyncq-Token`` header (the transport adds the id as ``Idempotency-Key``)."""

    async def deliver(body: Any, context: JobContext) -> None:
        await transport.deliver(context.id, body, {"Asyncq-Token": str(context.token)})

    return deliver


@dataclass(frozen=True)
class RetryPolicy:
    """Capped, jittered exponential backoff for failed attempts (``retry_delay``'s rule).

    ``jitter`` draws a ratio in 0-1 for each retry: random by default, injectable for tests."""

    base_ms: int = 1000
    cap_ms: int = 60_000
    jitter: Callable[[], float] = random.random

    def delay_ms(self, attempt: int, error: BaseException | None) -> int:
        """The delay before the next attempt; a ``Retryable(delay_ms=…)`` asks for one, capped."""
        if isinstance(error, Retryable) and error.delay_ms is not None:
            return max(0, min(error.delay_ms, self.cap_ms))
        return retry_delay(min(attempt, 16), self.base_ms, self.cap_ms, self.jitter())


@dataclass
class PoolCounters:
    """Running totals, for logs, tests and the metrics endpoint."""

    claimed: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    stale_finishes: int = 0
    leases_lost: int = 0
    handler_errors: int = 0
    commits: int = 0

    def count_status(self, status: str | None) -> None:
        if status is None:
            self.stale_finishes += 1
        else:
            self.finished[status] = self.finished.get(status, 0) + 1


class PoolObserver(Protocol):
    """What a pool reports as it works (``asyncq.metrics.PoolMetrics`` is one). Called on the event loop:
    each method must return at once and never raise."""

    def on_claimed(self, count: int) -> None: ...

    def on_finished(self, outcome: str, status: str | None) -> None: ...

    def on_delivery(self, seconds: float, outcome: str) -> None: ...

    def on_lease_lost(self) -> None: ...


class _NoObserver:
    def on_claimed(self, count: int) -> None:
        pass

    def on_finished(self, outcome: str, status: str | None) -> None:
        pass

    def on_delivery(self, seconds: float, outcome: str) -> None:
        pass

    def on_lease_lost(self) -> None:
        pass


@dataclass
class _InFlight:
    ticket: Ticket
    task: asyncio.Task[None] | None = None
    lost: bool = False

    def __post_init__(self) -> None:
        self.key = (self.ticket.id, self.ticket.token)  # stays put while renewals replace the ticket


class Pool:
    """Run registered handlers for a queue's jobs with ``concurrency`` tasks in one process."""

    def __init__(
        self,
        queue: Queue,
        *,
        concurrency: int = 16,
        owner: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        job_timeout: float | None = None,
        retry: RetryPolicy | None = None,
        poll_min: float = 0.05,
        poll_max: float = 1.0,
        observer: PoolObserver | None = None,
    ) -> None:
        self.queue = queue
        self.concurrency = check_int(concurrency, "concurrency", 1, 1000)
        self.owner = check_identifier(owner or f"pool-{random.getrandbits(48):012x}", "owner")
        self.lease_ms = check_int(lease_ms, "lease_ms", 4, 24 * 3600 * 1000)
        self.job_timeout = job_timeout
        self.retry = retry or RetryPolicy()
        self.poll_min, self.poll_max = poll_min, poll_max
        self.counters = PoolCounters()
        self.observer: PoolObserver = observer if observer is not None else _NoObserver()
        self._handlers: dict[str, Handler] = {}
        self._results: list[tuple[_InFlight, str, int]] = []  # the flight: its ticket may still be renewed
        self._fences = asyncio.Lock()  # a renewal and a group commit never overlap
        self._turn = 0  # which queue claims first this cycle: free slots go round the queues
        self._inflight: dict[tuple[str, int], _InFlight] = {}
        self._stopping = False
        self._wake = anyio.Event()

    def register(self, queue_name: str, handler: Handler) -> None:
        """Run ``handler(body, context)`` for jobs of ``queue_name``."""
        self._handlers[check_identifier(queue_name, "queue_name")] = handler

    def handler(self, queue_name: str = DEFAULT_QUEUE) -> Callable[[Handler], Handler]:
        """Decorator form of ``register``."""

        def decorate(function: Handler) -> Handler:
            self.register(queue_name, function)
            return function

        return decorate

    @property
    def running(self) -> int:
        """Jobs whose handler is running now."""
        return len(self._inflight)

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
                await self._work(burst)
                group.cancel_scope.cancel()
        finally:
            await self._abandon_inflight()

    async def _work(self, burst: bool) -> None:
        idle_wait = self.poll_min
        while True:
            claimed = await self._cycle(claiming=True)
            if self._stopping and not self._inflight and not self._results:
                return
            if claimed or self._results:
                idle_wait = self.poll_min
                continue
            if burst and not self._inflight:
                return
            await self._idle(idle_wait)
            idle_wait = min(idle_wait * 2, self.poll_max)

    async def run_once(self) -> int:
        """One claim (up to ``concurrency`` jobs), their handlers, and one finish commit; the job count."""
        self._check_handlers()
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._renew_leases)
                claimed = await self._cycle(claiming=True)
                await asyncio.gather(*(flight.task for flight in self._inflight.values() if flight.task))
                group.cancel_scope.cancel()
            await self._cycle(claiming=False)
        finally:
            await self._abandon_inflight()
        return claimed

    def _check_handlers(self) -> None:
        if not self._handlers:
            raise ValueError("register a handler before running the pool")

    async def _cycle(self, *, claiming: bool) -> int:
        """Finish what is done and claim for the free slots, in one commit; start the claimed jobs."""
        async with self._fences:  # read each ticket after any renewal in flight has replaced it
            results = [(flight.ticket, outcome, delay) for flight, outcome, delay in self._results]
            self._results = []
            free = self.concurrency - len(self._inflight) if claiming and not self._stopping else 0
            wants = self._rotated_wants(free) if free > 0 else []
            if results or wants:
                statuses, tickets = await self.queue.settle_and_claim(
                    results, self.owner, wants, self.lease_ms, total=free
                )
        if not results and not wants:
            if claiming:
                await self._wait_for_slot()
            return 0
        self.counters.commits += 1
        for (ticket, outcome, _delay), status in zip(results, statuses, strict=True):
            self._log_finish(ticket, status)
            self.observer.on_finished(outcome, status)
        self.counters.claimed += len(tickets)
        if tickets:
            self.observer.on_claimed(len(tickets))
        for ticket in tickets:
            log.debug("job %s token %d -> leased by %s", ticket.id, ticket.token, self.owner)
            flight = self._inflight[ticket.id, ticket.token] = _InFlight(ticket)
            flight.task = asyncio.create_task(self._run_job(flight))
        return len(tickets)

    def _rotated_wants(self, free: int) -> list[tuple[str, int]]:
        names = list(self._handlers)
        self._turn = (self._turn + 1) % len(names)
        return [(name, free) for name in names[self._turn :] + names[: self._turn]]

    async def _wait_for_slot(self) -> None:
        self._wake = anyio.Event()
        if self._results or self._stopping or len(self._inflight) < self.concurrency:
            return
        await self._wake.wait()

    async def _idle(self, seconds: float) -> None:
        """Nothing was ready: wait for an enqueue in this process, a finished job, or the poll interval."""
        self._wake = anyio.Event()
        with anyio.move_on_after(seconds):
            async with anyio.create_task_group() as waiters:

                async def on_enqueue() -> None:
                    await self.queue.wait_for_jobs(seconds)
                    waiters.cancel_scope.cancel()

                async def on_wake() -> None:
                    await self._wake.wait()
                    waiters.cancel_scope.cancel()

                waiters.start_soon(on_enqueue)
                waiters.start_soon(on_wake)

    def _log_finish(self, ticket: Ticket, status: str | None) -> None:
        self.counters.count_status(status)
        if status is None:
            log.warning("stale finish rejected for job %s token %d", ticket.id, ticket.token)
        else:
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
                with anyio.CancelScope(shield=True):  # a renewal that lands is always recorded
                    renewed = await self.queue.extend_many([flight.ticket for flight in due], self.lease_ms)
                for flight, ticket in zip(due, renewed, strict=True):
                    if ticket is not None:
                        flight.ticket = ticket
                    elif flight.task is not None and not flight.task.done():
                        flight.lost = True
                        flight.task.cancel()

    async def _abandon_inflight(self) -> None:
        """On cancellation: stop handlers unfinished. Their leases expire and the jobs run again."""
        tasks = [flight.task for flight in self._inflight.values() if flight.task is not None]
        for task in tasks:
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- one job --------------------------------------------------------------------------------------

    async def _run_job(self, flight: _InFlight) -> None:
        started = time.perf_counter()
        try:
            outcome, delay_ms = await self._call_handler(flight.ticket)
        except asyncio.CancelledError:
            if not flight.lost:
                raise
            self.counters.leases_lost += 1
            self.observer.on_lease_lost()
            log.warning("lease lost for job %s token %d: result discarded", flight.ticket.id, flight.ticket.token)
            return
        finally:
            del self._inflight[flight.key]
            self._wake.set()
        self.observer.on_delivery(time.perf_counter() - started, outcome)
        self._results.append((flight, outcome, delay_ms))

    async def _call_handler(self, ticket: Ticket) -> tuple[str, int]:
        handler = self._handlers[ticket.queue]
        context = JobContext(ticket.id, ticket.queue, ticket.attempt, ticket.token, ticket.deadline, ticket.lease_until)
        try:
            async with asyncio.timeout(self.job_timeout):
                await handler(ticket.body, context)
        except Permanent as error:
            log.warning("job %s failed permanently: %r", ticket.id, error)
            return PERMANENT, 0
        except Exception as error:  # any other failure is retried under the policy and the budget
            self.counters.handler_errors += 1
            log.warning("job %s attempt %d failed: %r", ticket.id, ticket.attempt, error)
            return RETRY, self.retry.delay_ms(ticket.attempt, error)
        return OK, 0

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
