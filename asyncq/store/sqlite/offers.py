"""Idle pools' offers on SQLite (``core.offers`` has the rules): an enqueue leases its jobs to an offer's pool in its
own transaction, a pool's group commit writes, withdraws and drains its offer, and a pool reads the jobs offered to it.
The enqueue's and the commit's steps run inside a write transaction the caller holds; the read needs none.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from functools import cache
from typing import Any

from asyncq.core.jobs import Enqueued, NewJob, Ticket
from asyncq.core.offers import Offer, is_ready, made_ready, offer_step, offer_taken, offered_tickets
from asyncq.store.sqlite.claiming import claim_rows_in_transaction
from asyncq.store.sqlite.schema import Layout

# The offer an enqueue of ``?1``'s jobs may claim for at ``?2``: the one with the most slots left (its slots less the
# jobs offered to its pool and not yet taken by the pool's commits).
OFFER_FOR = """
SELECT owner, slots, lease_ms, offered FROM (
  SELECT owner, slots, lease_ms, (SELECT count(*) FROM asyncq_offered d WHERE d.owner = o.owner) AS offered
  FROM asyncq_offers o WHERE queue = ?1 AND until_ms > ?2)
WHERE slots > offered ORDER BY slots - offered DESC LIMIT 1
"""
NOTE_OFFERED = "INSERT OR IGNORE INTO asyncq_offered (owner, job_seq) VALUES (?, ?)"

# The offer that one job enqueued ready into ``?1`` at ``?2`` is inserted leased to (``core.offers``): the one with the
# most slots left, its queue neither paused nor limited, and no job of the queue claimable already, so that the job is
# the first of the claim order. Each ``NOT EXISTS`` is one seek (the default priority's range of
# ``asyncq_jobs_ranked``, then ``asyncq_jobs_prioritised``, then ``asyncq_jobs_leased``), run only for a live offer
# (they name ``o``). ``max()`` picks the row without the sorter an ``ORDER BY … LIMIT 1`` opens at every run: that
# took ~4 of this read's ~10 µs at each enqueue, offer or none (docs/benchmarks.md, "singles", stop 43).
OFFER_NOW = """
SELECT owner, lease_ms FROM (
  SELECT owner, lease_ms, max(slots - (SELECT count(*) FROM asyncq_offered d WHERE d.owner = o.owner)) AS room
  FROM asyncq_offers o
  WHERE queue = ?1 AND until_ms > ?2
    AND slots > (SELECT count(*) FROM asyncq_offered d WHERE d.owner = o.owner)
    AND NOT EXISTS (SELECT 1 FROM asyncq_queues q WHERE q.queue = o.queue
                    AND (paused_at IS NOT NULL OR coalesce(limit_concurrency, limit_per_key, limit_rate) IS NOT NULL))
    AND NOT EXISTS (SELECT 1 FROM asyncq_jobs WHERE status = 'pending' AND queue = o.queue AND priority = 0
                    AND available_at <= ?2)
    AND NOT EXISTS (SELECT 1 FROM asyncq_jobs WHERE status = 'pending' AND queue = o.queue AND priority <> 0
                    AND available_at <= ?2)
    AND NOT EXISTS (SELECT 1 FROM asyncq_jobs WHERE queue = o.queue AND status = 'leased' AND lease_until <= ?2))
WHERE room IS NOT NULL
"""

WITHDRAW = "DELETE FROM asyncq_offers WHERE owner = ?"
PUT_OFFER = """
INSERT INTO asyncq_offers (queue, owner, slots, lease_ms, until_ms) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (queue, owner) DO UPDATE SET slots = excluded.slots, lease_ms = excluded.lease_ms,
  until_ms = excluded.until_ms
"""
# Offers past their end (a pool killed with one out), and the notes of jobs no longer held under a live lease by
# the pool they were offered to: cleared when a pool writes its offer (the same rule as PostgreSQL's).
CLEAR_ENDED = (
    "DELETE FROM asyncq_offers WHERE until_ms <= :now",
    """DELETE FROM asyncq_offered WHERE owner <> :owner AND NOT EXISTS (
  SELECT 1 FROM asyncq_jobs j
  WHERE j.seq = asyncq_offered.job_seq AND j.status = 'leased' AND j.owner = asyncq_offered.owner
    AND j.lease_until > :now)""",
)

# The jobs offered to ``:owner`` that it still holds: the columns of ``Ticket.from_row`` (a rank in place of the
# claim's), then the queue and the lease's end.
OFFERED_TO = """
SELECT j.seq, j.id, j.body, j.priority, j.token, j.attempts, j.deadline, j.max_attempts, 0, j.queue, j.lease_until
FROM asyncq_offered o JOIN asyncq_jobs j ON j.seq = o.job_seq
WHERE o.owner = :owner AND j.status = 'leased' AND j.owner = :owner AND j.lease_until > :now
ORDER BY j.seq
"""
FORGET_OFFERED = "DELETE FROM asyncq_offered WHERE owner = ?"


def offer_now(con: sqlite3.Connection, job: NewJob) -> tuple[str, int] | None:
    """The owner and lease of the offer ``job``, enqueued alone, is inserted leased to (``OFFER_NOW``); ``None`` for
    none (no offer, the job not ready at its enqueue, or in a graph: those go the plain way)."""
    if job.linked or not is_ready(job):
        return None
    found: tuple[str, int] | None = con.execute(OFFER_NOW, (job.payload["queue"], job.enqueued_at)).fetchone()
    return found


@cache
def insert_leased(layout: Layout, columns: tuple[str, ...]) -> str:
    """The insert of one job leased at once to an offer's pool (``columns``: the payload's, as ``insert_rows``): its
    token issued, its attempt not counted (claimed ahead), its lease to the pool's ``lease_ms`` or its deadline."""
    marks = ", ".join(["?"] * (1 + len(columns)))
    return (
        f"INSERT INTO {layout.jobs} (id, {', '.join(columns)}, status, attempts, max_attempts, token, available_at,"
        f" deadline, owner, lease_until) VALUES ({marks}, 'leased', 0, ?, 1, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
    )


def claim_for_offers(
    con: sqlite3.Connection, layout: Layout, jobs: Sequence[NewJob], added: Sequence[Enqueued]
) -> None:
    """After a batch's inserts, in its transaction: for each queue in which it made jobs ready, claim (ahead) for an
    idle pool's offer as many as the offer has slots left, in the claim order, and note them as offered."""
    if not layout.offers:
        return
    ready, now = made_ready(jobs, added)
    for queue, count in ready.items():
        offer = con.execute(OFFER_FOR, (queue, now)).fetchone()
        if offer is None:
            continue
        owner, slots, lease_ms, offered = offer
        take = offer_taken(slots, offered, count)
        rows = claim_rows_in_transaction(
            con, layout, owner, now, lease_ms, limit=take, scope={"queue": queue}, count=False, sweep=False
        )
        con.executemany(NOTE_OFFERED, [(owner, row[0]) for row in rows])


def settle_offer(
    con: sqlite3.Connection, offer: Offer, owner: str, queues: Sequence[str], lease_ms: int, now_ms: int, claimed: int
) -> list[Ticket]:
    """A pool's offer in its group commit, after its ``claimed`` claims: if it drains, take the jobs offered to the
    pool that its reads did not find (claimed ahead: their tickets) and forget every note of a job offered to it;
    then withdraw the offer or write it (``core.offers.offer_step``, the jobs taken counted as claimed)."""
    taken: list[Ticket] = []
    if offer.drain:
        found = offered_tickets(offered_rows(con, owner, now_ms), owner)
        taken = [ticket for ticket in found if ticket.seq not in offer.picked]
        con.execute(FORGET_OFFERED, (owner,))
    step = offer_step(offer, claimed + len(taken))
    if step.withdraw:
        con.execute(WITHDRAW, (owner,))
    elif step.write:
        for statement in CLEAR_ENDED:
            con.execute(statement, {"now": now_ms, "owner": owner})
        con.executemany(PUT_OFFER, [(queue, owner, offer.slots, lease_ms, offer.until_ms) for queue in queues])
    return taken


def offered_rows(con: sqlite3.Connection, owner: str, now_ms: int) -> list[tuple[Any, ...]]:
    """The rows of the jobs offered to ``owner`` that it still holds (``OFFERED_TO``), oldest first."""
    return con.execute(OFFERED_TO, {"owner": owner, "now": now_ms}).fetchall()
