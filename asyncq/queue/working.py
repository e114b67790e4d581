"""The calls a worker makes on a ``Queue``: claim, finish, the pool's group commit, lease renewal and release."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

from asyncq.core.failures import ErrorText, error_text
from asyncq.core.jobs import (
    DEFAULT_LEASE_MS,
    DEFAULT_QUEUE,
    MAX_BATCH,
    MAX_LEASE_MS,
    MAX_TTL_MS,
    Finish,
    Settled,
    StoredResult,
    Ticket,
)
from asyncq.core.lifecycle import DEAD, DONE, OUTCOMES, Outcome, OutcomeName
from asyncq.core.offers import Offer
from asyncq.core.values import (
    Duration,
    check_choice,
    check_identifier,
    check_int,
    duration_ms,
)
from asyncq.store.facade import StoreFacade
from asyncq.store.port.queue import QueueStore


class Attempt(NamedTuple):
    """A finished attempt as ``finish_many`` and the group commit take it (a plain tuple in this order is accepted
    too): its ticket, its outcome, the wait before a retry in ms, the attempt's error kept with the job, and what a
    task returned (kept if the finish lands as ``done``)."""

    ticket: Ticket
    outcome: Outcome | OutcomeName
    delay_ms: int = 0
    error: BaseException | ErrorText | None = None
    result: StoredResult | None = None


class Claimed(NamedTuple):
    """What ``settle_and_claim`` did: the new status of each finish (``None``: stale) and the tickets claimed."""

    statuses: list[str | None]
    tickets: list[Ticket]


class Renewed(NamedTuple):
    """A renewed lease: the ticket holding it now, and whether a cancel of its job was requested."""

    ticket: Ticket
    cancel_requested: bool


class WorkerCalls(StoreFacade[QueueStore]):
    """What a worker calls: claim, finish, the group commit, lease renewal and release (``Queue`` has them)."""

    _ended: asyncio.Event

    async def claim(
        self,
        owner: str,
        *,
        queue: str = DEFAULT_QUEUE,
        limit: int = 1,
        lease: Duration | None = None,
    ) -> list[Ticket]:
        """Lease up to ``limit`` ready jobs of ``queue`` in one transaction, each with its own token; ``lease`` in
        seconds (default 30)."""
        check_int(limit, "limit", 1, MAX_BATCH)
        lease_ms = duration_ms(lease, "lease", DEFAULT_LEASE_MS, 1, MAX_LEASE_MS)
        _statuses, tickets = await self.settle_and_claim([], owner, [(queue, limit)], lease_ms)
        return tickets

    async def finish(
        self,
        ticket: Ticket,
        outcome: Outcome | OutcomeName,
        *,
        delay: Duration | None = None,
        error: BaseException | None = None,
    ) -> str | None:
        """Record one outcome (``ok``, ``retry``, ``permanent``); the new status, or ``None`` if stale. ``delay``
        (seconds) is the wait before a retry; ``error`` (a failed attempt's exception) is kept with the job.
        Durations are keyword-only, so that a call written for the older milliseconds fails loudly."""
        delay_ms = duration_ms(delay, "delay", 0, 0, MAX_TTL_MS)
        return (await self.finish_many([Attempt(ticket, outcome, delay_ms, error)]))[0]

    async def finish_many(self, results: Sequence[Attempt]) -> list[str | None]:
        """Record several outcomes (``Attempt(ticket, outcome, delay_ms)``, optionally the attempt's error) in one
        commit, each fenced on its own (stale ones change nothing). The batch API takes the store's unit,
        milliseconds, like ``settle_and_claim``: it is what a worker pool sends."""
        items = [_finish_item(*result) for result in _results(results)]
        if not items:
            return []
        return self._note_ends(await self.store.finish(items, self.now()))

    async def settle_and_claim(
        self,
        results: Sequence[Attempt],
        owner: str,
        wants: Sequence[tuple[str, int]],
        lease_ms: int = DEFAULT_LEASE_MS,
        total: int | None = None,
    ) -> Claimed:
        """Finish ``results`` and claim up to ``n`` jobs for each ``(queue, n)`` of ``wants`` (and at most
        ``total`` over all of them, if given) in one commit, every claimed job's attempt counted."""
        settled = await self.commit_cycle(results, owner, wants, lease_ms, total)
        return Claimed(settled.statuses, settled.tickets)

    async def commit_cycle(
        self,
        results: Sequence[Attempt],
        owner: str,
        wants: Sequence[tuple[str, int]],
        lease_ms: int = DEFAULT_LEASE_MS,
        total: int | None = None,
        *,
        start_now: int | None = None,
        started: Sequence[Ticket] = (),
        resend: bool = False,
        offer: Offer | None = None,
    ) -> Settled:
        """The worker pool's group commit: ``settle_and_claim``, where only the first ``start_now`` claimed jobs
        (those for free slots) count an attempt at once, and the jobs claimed ahead that handlers have
        ``started`` since count theirs now (``QueueStore.settle_and_claim``). ``resend``: the results were sent
        before by a call whose commit may have landed (``StoreBusy.may_have_landed``); ``offer``: the pool's idle
        offer (``core.offers``), the jobs enqueues claimed for it coming last among the tickets."""
        check_identifier(owner, "owner")
        check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
        items = [_finish_item(*result) for result in _results(results)]
        checked = [(check_identifier(q, "queue"), check_int(n, "n", 0, MAX_BATCH)) for q, n in wants]
        if total is not None:
            check_int(total, "total", 0, MAX_BATCH)
        if start_now is not None:
            check_int(start_now, "start_now", 0, MAX_BATCH)
        begun = [_ticket(ticket) for ticket in started]
        if offer is not None and type(offer) is not Offer:
            raise TypeError(f"offer must be a core.offers.Offer, not {type(offer).__name__}")
        settled = await self.store.settle_and_claim(
            items, self.now(), owner, lease_ms, checked, total, start_now=start_now, started=begun, resend=resend,
            offer=offer,
        )  # fmt: skip
        self._note_ends(settled.statuses)
        return settled

    async def offered(self, owner: str) -> list[Ticket]:
        """The jobs enqueues claimed for ``owner``'s idle offer that its commits have not taken yet
        (``QueueStore.offered``): a read."""
        return await self.store.offered(check_identifier(owner, "owner"), self.now())

    def _note_ends(self, statuses: list[str | None]) -> list[str | None]:
        """Wake ``wait_for_end`` callers if one of these finishes ended a job (done or dead)."""
        if DONE in statuses or DEAD in statuses:
            ended, self._ended = self._ended, asyncio.Event()
            ended.set()
        return statuses

    async def wait_for_end(self, timeout: float) -> None:
        """Return when a finish in this process ends a job, or after ``timeout`` seconds (the fallback for jobs
        that end in another process, or by the sweep)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._ended.wait()

    async def extend(self, ticket: Ticket, *, lease: Duration | None = None) -> Ticket | None:
        """Renew a held lease by ``lease`` seconds (default 30); the renewed ticket, or ``None`` if it is lost."""
        lease_ms = duration_ms(lease, "lease", DEFAULT_LEASE_MS, 1, MAX_LEASE_MS)
        return (await self.extend_many([ticket], lease_ms))[0]

    async def extend_many(self, tickets: Sequence[Ticket], lease_ms: int = DEFAULT_LEASE_MS) -> list[Ticket | None]:
        """Renew several held leases in one commit; ``None`` for each one that is lost (the batch API: ms)."""
        return [None if renewed is None else renewed.ticket for renewed in await self.renew_many(tickets, lease_ms)]

    async def renew_many(self, tickets: Sequence[Ticket], lease_ms: int = DEFAULT_LEASE_MS) -> list[Renewed | None]:
        """``extend_many``, each renewed ticket with whether a cancel of its job was requested (``Queue.cancel``):
        what a pool's renewal reads, in the renewal's own fenced statement; ``None`` for each lease lost."""
        check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
        tickets = [_ticket(ticket) for ticket in tickets]
        leases = [(ticket.id, ticket.fence) for ticket in tickets]
        renewals = await self.store.extend(leases, self.now(), lease_ms)
        return [
            None if renewal is None else Renewed(replace(ticket, fence=renewal.fence), renewal.cancel_requested)
            for ticket, renewal in zip(tickets, renewals, strict=True)
        ]

    async def release_many(self, tickets: Sequence[Ticket]) -> list[bool]:
        """Give back leases on jobs this worker claimed but never started (they are ``pending`` again, the
        attempt not counted); ``False`` for each lease no longer held."""
        checked = [_ticket(ticket) for ticket in tickets]
        leases = [(ticket.id, ticket.fence) for ticket in checked]
        return await self.store.release(leases, self.now(), [ticket.counted for ticket in checked])

    async def reconcile(self, ticket: Ticket) -> str | None:
        """After a finish whose outcome is unknown (cancelled while committing): the status it left, or
        ``None`` if it cannot be told from the row: the ticket still holds the lease (the finish did not land),
        or the job has since been claimed again under a newer token (finishing this ticket again is refused
        as stale either way)."""
        ticket = _ticket(ticket)
        job = await self.store.get(ticket.id)
        if job is None or job.token != ticket.token:
            return None
        return None if job.status == "leased" and job.lease_until == ticket.lease_until else job.status

    async def wait_for_rows(self, timeout: float) -> None:
        """Return when new work may be ready, or after ``timeout`` seconds."""
        await self.store.wait_for_work(timeout)


def _ticket(ticket: object) -> Ticket:
    if type(ticket) is not Ticket:
        raise TypeError(f"expected a Ticket from claim(), not {type(ticket).__name__}")
    return ticket


def _results(results: Sequence[Attempt]) -> Sequence[Attempt]:
    for result in results:
        if not isinstance(result, tuple) or len(result) not in (3, 4, 5):
            raise TypeError("results must be (ticket, outcome, delay_ms[, error[, result]]) tuples")
    return results


def _finish_item(
    ticket: Ticket,
    outcome: str,
    delay_ms: int,
    error: BaseException | ErrorText | None = None,
    result: StoredResult | None = None,
) -> Finish:
    if (  # what a pool sends, checked in one expression (a group commit checks every job's result)
        type(ticket) is Ticket
        and type(outcome) is str
        and outcome in _OUTCOME_VALUES
        and type(delay_ms) is int
        and 0 <= delay_ms <= MAX_TTL_MS
        and (error is None or type(error) is ErrorText)
        and (result is None or type(result) is StoredResult)
    ):
        return tuple.__new__(
            Finish, (ticket.id, ticket.fence, outcome, delay_ms, ticket.held, error, ticket.counted, result)
        )
    _ticket(ticket)
    if result is not None and type(result) is not StoredResult:
        raise TypeError(f"result must be a StoredResult, not {type(result).__name__}")
    check_choice(outcome, "outcome", OUTCOMES)
    check_int(delay_ms, "delay_ms", 0, MAX_TTL_MS)
    if isinstance(error, BaseException):
        error = error_text(error)
    elif error is not None and type(error) is not ErrorText:
        raise TypeError(f"error must be an exception, not {type(error).__name__}")
    return Finish(ticket.id, ticket.fence, outcome, delay_ms, ticket.held, error, ticket.counted, result)


_OUTCOME_VALUES = frozenset(outcome.value for outcome in OUTCOMES)
