"""An idle pool's offer, planned once for every store (no I/O here).

A job enqueued by another process reaches an idle pool through two commits: the enqueue's, then the pool's claim
(a claim is durable before its handler runs: after a power loss an undone claim would hand its fencing token out
again). An enqueue of the pool's own process rides the pool's claim: one commit. So that another process's enqueue
also costs one, a pool whose group commit found nothing to claim leaves an **offer** in it: a row per queue it serves,
with its owner, its free slots, its lease and a short end. An enqueue that finds an offer for its queue leases its
jobs to that pool in its own transaction, claimed ahead (the token issued, the attempt counted when a handler starts
the job, as for a pool's own claim ahead), and notes each as offered: a job enqueued alone is inserted leased at once
when its queue is neither paused nor limited and holds no job claimable before it (the claim order holds); a batch
is inserted, then claimed with the pool's claim statement. The pool, woken by that commit, reads the jobs offered to
it (a read: no lock, no fsync), starts them, and its next commit counts their attempts.

An offer is one statement of a commit the pool makes anyway, except an idle pool's first (and its renewal, at half
its length): an idle pool's empty claim writes nothing otherwise. While an offer is out, each commit of the pool also
takes the jobs offered to it that no read found (a wake-up lost strands nothing) and forgets the ones it read; the
commit that claims a job, or finds no slot free, withdraws the offer. A pool killed with an offer out leaves it until
its end; the jobs offered to it until then wait for their lease to end, as the jobs it held do. An enqueue gives a
pool at most as many jobs as it offered slots, less those offered to it and not taken by its commits since.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from asyncq.core.jobs import Enqueued, NewJob, Ticket

#: How long an offer lasts at least (ms); a pool renews its offer when less than half of it is left. A pool that
#: polls less often than that offers for three of its polls.
OFFER_MS = 5_000


class Offer(NamedTuple):
    """What a pool's group commit says of its offer: ``slots`` (its free slots, offered if the commit claims nothing;
    0: none free, withdraw an offer out), ``until_ms`` (the end of the offer this commit writes; 0: write none, the
    one out stays as it is), ``out`` (an offer of the pool's is out), ``drain`` (jobs may have been claimed for it:
    take those that its reads did not find, and forget every note of a job offered to it) and ``picked`` (the seqs of
    the jobs offered to it that its reads found)."""

    slots: int
    until_ms: int
    out: bool
    drain: bool = False
    picked: frozenset[int] = frozenset()


class OfferStep(NamedTuple):
    """What a commit does with an offer, once its claims are known: ``withdraw`` the pool's offer rows, or ``write``
    them (one per queue it asked for, ending at ``Offer.until_ms``), after the jobs offered to it were taken (when
    ``Offer.drain`` says so)."""

    withdraw: bool
    write: bool


def offer_step(offer: Offer, claimed: int) -> OfferStep:
    """The step of ``offer`` in a commit that claimed ``claimed`` jobs, the jobs offered to the pool that it took
    among them (a pool counts every ticket its commit returned): a claim, or no free slot, withdraws an offer out; a
    commit that claimed nothing with slots free writes the offer it was given."""
    withdraw = offer.out and (claimed > 0 or offer.slots == 0)
    return OfferStep(withdraw, not withdraw and claimed == 0 and offer.slots > 0 and offer.until_ms > 0)


def offer_length(poll_max_ms: int) -> int:
    """How long a pool's offer lasts: ``OFFER_MS``, or three of its longest polls."""
    return max(OFFER_MS, 3 * poll_max_ms)


def next_offer(
    out_until: int | None, draining: bool, now_ms: int, slots: int, length_ms: int, picked: frozenset[int]
) -> Offer | None:
    """The ``Offer`` of a pool's next commit: ``out_until`` is the end of its offer out (``None``: none), ``draining``
    whether jobs may still be offered to it (an enqueue that read an offer may commit after the offer is withdrawn),
    ``slots`` its free slots (0 while it is stopping, or must not offer); ``None`` when the commit has nothing to
    say."""
    renew = slots > 0 and (out_until is None or out_until - now_ms < length_ms // 2)
    out = out_until is not None
    if not renew and not out and not draining:
        return None
    return Offer(slots, now_ms + length_ms if renew else 0, out, out or draining, picked)


def offer_taken(slots: int, offered: int, ready: int) -> int:
    """How many jobs an enqueue claims for an offer of ``slots`` with ``offered`` jobs offered to its pool already and
    ``ready`` jobs it just made ready in the offer's queue."""
    return max(0, min(slots - offered, ready))


def is_ready(job: NewJob) -> bool:
    """Whether ``job`` is ready at its enqueue (no delay), and carries its enqueue's time (``enqueued_at``; a row
    built without it is claimed for no offer)."""
    return job.enqueued_at > 0 and job.available_at <= job.enqueued_at


def made_ready(jobs: Sequence[NewJob], added: Sequence[Enqueued]) -> tuple[dict[str, int], int]:
    """How many jobs an enqueue inserted ready (not delayed) per queue, and its ``now``: what it may claim for
    offers. A row built without its enqueue's time (``enqueued_at`` 0) is claimed for no offer."""
    ready: dict[str, int] = {}
    now = 0
    for job, result in zip(jobs, added, strict=True):
        if result is True and is_ready(job):
            queue = job.payload["queue"]
            ready[queue] = ready.get(queue, 0) + 1
            now = max(now, job.enqueued_at)
    return ready, now


def offered_tickets(rows: Sequence[tuple[Any, ...]], owner: str) -> list[Ticket]:
    """The tickets (claimed ahead) of the jobs offered to ``owner``, from rows of a ticket's columns
    (``Ticket.from_row``), then the queue and the lease's end."""
    return [Ticket.from_row(row, False, row[9], owner, row[10]) for row in rows]
