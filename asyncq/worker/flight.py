"""A pool's jobs in flight: each claimed job from its claim to its result's commit, and the buffer of jobs claimed
ahead of the free slots. The pool's batcher and workers change it; the lease keeper renews and drops from it."""

from __future__ import annotations

import asyncio
from collections import deque

from asyncq.core.failures import ErrorText
from asyncq.core.jobs import StoredResult, Ticket
from asyncq.core.lifecycle import RETRY, OutcomeName
from asyncq.core.limits import DEFAULT_RETRY_BASE_MS
from asyncq.queue import Attempt

#: A finished job waiting for its commit: the flight (its ticket may still be renewed until then), the outcome,
#: the retry delay in ms, the error kept with the job, a task's result.
Result = tuple["InFlight", OutcomeName, int, ErrorText | None, StoredResult | None]
#: The same as the store takes it, with the ticket read at the commit.
Finish = Attempt


class InFlight:
    """A claimed job: waiting in the buffer (``task`` is None) or run by a worker."""

    __slots__ = ("cancel_requested", "cancelled", "key", "lost", "task", "ticket")

    def __init__(self, ticket: Ticket, key: tuple[str, int]) -> None:
        self.ticket = ticket
        self.key = key  # stays put while renewals replace the ticket
        self.task: asyncio.Task[None] | None = None
        self.lost = False
        self.cancel_requested = False  # a renewal found a cancel request on the job
        self.cancelled = False  # its handler was cancelled on that request


class Flights:
    """Every job a pool holds a lease on (``jobs``: running, or waiting in ``buffer``), the results not committed
    yet, and the jobs claimed ahead whose attempts the next commit counts. ``wake`` is set when the batcher may
    have something to do: a job finished, a slot freed, ``stop()`` was called."""

    __slots__ = ("buffer", "idle_workers", "jobs", "results", "started_ahead", "wake")

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, int], InFlight] = {}
        self.buffer: deque[InFlight] = deque()
        self.results: list[Result] = []
        self.started_ahead: list[InFlight] = []  # started since the last commit, their attempts not counted yet
        self.wake = asyncio.Event()
        self.idle_workers: deque[asyncio.Future[None]] = deque()  # one per worker waiting for a buffered job

    @property
    def running(self) -> int:
        """Jobs whose handler is running now."""
        return len(self.jobs) - len(self.buffer)

    def add(self, ticket: Ticket) -> None:
        """Put a claimed job in the buffer."""
        key = (ticket.id, ticket.fence.token)
        flight = self.jobs[key] = InFlight(ticket, key)
        self.buffer.append(flight)

    def buffer_all(self, tickets: list[Ticket]) -> None:
        """Put claimed jobs in the buffer and wake an idle worker for each (as many as are idle)."""
        for ticket in tickets:
            self.add(ticket)
        self.wake_workers()

    def wake_workers(self) -> None:
        """Wake one idle worker per buffered job."""
        jobs = len(self.buffer)
        while jobs and self.idle_workers:
            waiter = self.idle_workers.popleft()
            if not waiter.done():
                waiter.set_result(None)
                jobs -= 1

    def take_buffer(self) -> list[InFlight]:
        """Empty the buffer (stopping): its jobs, no longer in flight, to give back."""
        flights = list(self.buffer)
        self.buffer.clear()
        for flight in flights:
            del self.jobs[flight.key]
        return flights

    def take_started_ahead(self) -> list[InFlight]:
        """The jobs claimed ahead whose handlers started since the last commit and are still running: their
        attempts are counted in this commit (a job that already ended has its attempt counted by its finish)."""
        started = [flight for flight in self.started_ahead if self.jobs.get(flight.key) is flight]
        self.started_ahead = []
        return started

    def take_results(self) -> list[Result]:
        """The results to commit now (``restore`` puts them back if the commit fails)."""
        kept, self.results = self.results, []
        return kept

    def restore(self, results: list[Result], started: list[InFlight]) -> None:
        """Nothing landed: the next commit carries these results and counts these attempts."""
        self.results = results + self.results
        self.started_ahead = started + self.started_ahead

    @staticmethod
    def counted(started: list[InFlight], counted: list[bool]) -> None:
        """Mark the attempts that a commit counted."""
        for flight, landed in zip(started, counted, strict=True):
            if landed:
                flight.ticket = flight.ticket.started()

    def drop(self, flight: InFlight) -> bool:
        """Drop a job whose lease was lost: from the buffer at once (True), or mark a running one lost so that
        its worker keeps no result (False; the caller cancels it)."""
        if flight.task is None:
            self.buffer.remove(flight)
            del self.jobs[flight.key]
            self.wake.set()  # a slot's worth of work is gone: the batcher may claim again, run_once may end
            return True
        if self.jobs.get(flight.key) is flight and not flight.lost:  # its worker is still running it
            flight.lost = True
            flight.task.cancel()
        return False

    def cancel(self, flight: InFlight) -> bool:
        """Cancel a running job's handler on a cancel request (its worker then finishes it dead, ``cancelled``),
        unless it has ended or was cancelled already; whether it was."""
        if self.jobs.get(flight.key) is not flight or flight.task is None or flight.lost or flight.cancelled:
            return False
        flight.cancelled = True
        flight.task.cancel()
        return True

    def retry_now(self, flight: InFlight, error: ErrorText) -> None:
        """The pool's own machinery failed around a running job: never leave it leased for its lease to run out,
        retry it at once under its budget (unless its lease was lost, or its result is kept already)."""
        self.jobs.pop(flight.key, None)
        recorded = any(result[0] is flight for result in self.results)
        if not flight.lost and not recorded:
            self.results.append((flight, RETRY, DEFAULT_RETRY_BASE_MS, error, None))
        self.wake.set()


def uncancel() -> int:
    """Withdraw one cancellation request from the current task (a job's worker whose job was cancelled under it: the
    worker lives on); how many remain."""
    task = asyncio.current_task()
    assert task is not None
    return task.uncancel()
