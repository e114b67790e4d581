"""Idle pools' offers on PostgreSQL (``core.offers`` has the rules; the SQLite store's ``offers`` runs the same steps):
an enqueue leases its jobs to an offer's pool in its own transaction, a pool's group commit writes, withdraws and
drains its offer, and a pool reads the jobs offered to it.

No statement here locks an offer row: an enqueue reads the offer, then inserts its job leased to the pool or claims
with the pool's claim statement (its rows locked as any claim's), so a withdrawal never waits for an app's
transaction. An enqueue that read an offer may commit after the pool withdrew it; the pool reads and takes the jobs
offered to it until its offer's end (``worker.offering``), so such a job is taken too, and one committed later still
is run when its lease ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncq.core.jobs import Enqueued, NewJob, Ticket
from asyncq.core.offers import Offer, is_ready, made_ready, offer_step, offer_taken, offered_tickets
from asyncq.store.postgres.connection import Connection
from asyncq.store.postgres.statements import sql

# The offers out at ``$2`` for the queues ``$1``, each with the jobs offered to its pool and not yet taken.
OFFERS_FOR = """
SELECT o.queue, o.owner, o.slots, o.lease_ms, (SELECT count(*) FROM {schema}.offered d WHERE d.owner = o.owner)
FROM {schema}.offers o WHERE o.queue = ANY($1::text[]) AND o.until_ms > $2
"""
NOTE_OFFERED = """
INSERT INTO {schema}.offered (owner, job_seq) SELECT $1, unnest($2::bigint[]) ON CONFLICT DO NOTHING
"""
# The offer that one job enqueued ready into ``$1`` at ``$2`` is inserted leased to (``core.offers``): one with slots
# left, its queue neither paused nor limited, and no job of the queue claimable already (``jobs_waiting``, then
# ``jobs_leased``), so that the job is the first of the claim order.
OFFER_NOW = """
SELECT o.owner, o.lease_ms FROM {schema}.offers o
WHERE o.queue = $1 AND o.until_ms > $2
  AND o.slots > (SELECT count(*) FROM {schema}.offered d WHERE d.owner = o.owner)
  AND NOT EXISTS (SELECT 1 FROM {schema}.queues q WHERE q.queue = $1 AND (q.paused_at IS NOT NULL
                  OR coalesce(q.limit_concurrency, q.limit_per_key, q.limit_rate) IS NOT NULL))
  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs j WHERE j.status = 'pending' AND j.queue = $1 AND j.available_at <= $2)
  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs j WHERE j.status = 'leased' AND j.queue = $1 AND j.lease_until <= $2)
ORDER BY o.slots DESC LIMIT 1
"""
# One job inserted leased to an offer's pool: its token issued, its attempt not counted (claimed ahead).
INSERT_LEASED = """
INSERT INTO {schema}.jobs
  (id, queue, body, status, attempts, max_attempts, token, available_at, deadline, priority, unique_key, task,
   group_name, limit_key, owner, lease_until)
VALUES ($1, $2, $3, 'leased', 0, $4, 1, $5, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT DO NOTHING
RETURNING seq
"""
WITHDRAW = "DELETE FROM {schema}.offers WHERE owner = $1"
PUT_OFFERS = """
INSERT INTO {schema}.offers (queue, owner, slots, lease_ms, until_ms)
SELECT unnest($1::text[]), $2, $3, $4, $5
ON CONFLICT (queue, owner) DO UPDATE SET slots = EXCLUDED.slots, lease_ms = EXCLUDED.lease_ms,
  until_ms = EXCLUDED.until_ms
"""
# Offers past their end (a pool killed with one out), and the notes of jobs no longer held under a live lease by
# the pool they were offered to (a killed pool's, once their leases end): cleared when a pool writes its offer. A
# note of a live lease stays, even of a pool whose offer is gone: it may still take it (an enqueue that read the
# offer can commit after the pool withdrew it).
CLEAR_ENDED = """
WITH ended AS (DELETE FROM {schema}.offers WHERE until_ms <= $1)
DELETE FROM {schema}.offered d
WHERE d.owner <> $2 AND NOT EXISTS (
  SELECT 1 FROM {schema}.jobs j
  WHERE j.seq = d.job_seq AND j.status = 'leased' AND j.owner = d.owner AND j.lease_until > $1)
"""
# The jobs of ``{seqs}`` that ``$1`` still holds at ``$2``: the columns of ``Ticket.from_row`` (a rank in place of the
# claim's), then the queue and the lease's end.
_HELD = """
SELECT j.seq, j.id, j.body, j.priority, j.token, j.attempts, j.deadline, j.max_attempts, 0, j.queue, j.lease_until
FROM {{schema}}.jobs j
WHERE j.seq {seqs} AND j.status = 'leased' AND j.owner = $1 AND j.lease_until > $2
ORDER BY j.seq
"""
# The jobs offered to ``$1`` that it still holds (a pool's read).
OFFERED_TO = _HELD.format(seqs="IN (SELECT o.job_seq FROM {schema}.offered o WHERE o.owner = $1)")
# A commit's drain: the notes of the jobs offered to ``$1`` that this statement sees, deleted and returned in one
# statement (under READ COMMITTED a note committed by an enqueue after a separate read would be deleted unseen, and
# its job left to wait for its lease); then the jobs of those notes it still holds (``$3``: their seqs).
FORGET_OFFERED = "DELETE FROM {schema}.offered WHERE owner = $1 RETURNING job_seq"
OFFERED_BY_SEQ = _HELD.format(seqs="= ANY($3::bigint[])")


async def insert_for_offer(conn: Connection, schema: str, job: NewJob) -> bool:
    """Insert ``job``, enqueued alone, leased at once to an idle pool's offer (``OFFER_NOW``) and note it as offered:
    ``True`` if it was; ``False`` if no offer takes it (no offer, the job not ready at its enqueue, or in a graph), or
    its id or unique key was taken (the plain insert then says which)."""
    if job.linked or not is_ready(job):
        return False
    queue = job.payload["queue"]
    offer = await conn.fetchrow(OFFER_NOW.format(schema=schema), queue, job.enqueued_at)
    if offer is None:
        return False
    owner, lease_ms = offer
    payload = job.payload
    seq = await conn.fetchval(
        INSERT_LEASED.format(schema=schema), job.id, queue, payload["body"], job.max_attempts, job.available_at,
        job.deadline, payload["priority"], payload["unique_key"], payload["task"], payload["group_name"],
        payload["limit_key"], owner, min(job.enqueued_at + lease_ms, job.deadline),
    )  # fmt: skip
    if seq is None:
        return False
    await conn.execute(NOTE_OFFERED.format(schema=schema), owner, [seq])
    return True


async def claim_for_offers(conn: Connection, schema: str, jobs: Sequence[NewJob], added: Sequence[Enqueued]) -> None:
    """After a batch's inserts, in its transaction: for each queue in which it made jobs ready, claim (ahead)
    for the idle pool's offer with the most slots left as many as it has left, in the claim order, and note them
    as offered."""
    ready, now = made_ready(jobs, added)
    if not ready:
        return
    best: dict[str, tuple[int, str, int]] = {}  # queue -> (slots left, owner, lease_ms)
    for queue, owner, slots, lease_ms, offered in await conn.fetch(OFFERS_FOR.format(schema=schema), list(ready), now):
        left = slots - offered
        if left > 0 and left > best.get(queue, (0, "", 0))[0]:
            best[queue] = (left, owner, lease_ms)
    for queue, (left, owner, lease_ms) in best.items():
        take = offer_taken(left, 0, ready[queue])
        rows = await conn.fetch(sql(schema, "CLAIM"), queue, now, take, owner, lease_ms, 0)
        if rows:
            await conn.execute(NOTE_OFFERED.format(schema=schema), owner, [row[0] for row in rows])


async def settle_offer(
    conn: Connection,
    schema: str,
    offer: Offer,
    owner: str,
    queues: Sequence[str],
    lease_ms: int,
    now_ms: int,
    claimed: int,
) -> list[Ticket]:
    """A pool's offer in its group commit, after its ``claimed`` claims: if it drains, take the jobs offered to the
    pool that its reads did not find (claimed ahead: their tickets) and forget every note of a job offered to it;
    then withdraw the offer or write it (``core.offers.offer_step``, the jobs taken counted as claimed)."""
    taken: list[Ticket] = []
    if offer.drain:
        noted = [seq for (seq,) in await conn.fetch(FORGET_OFFERED.format(schema=schema), owner)]
        fresh = [seq for seq in noted if seq not in offer.picked]
        if fresh:
            rows = await conn.fetch(OFFERED_BY_SEQ.format(schema=schema), owner, now_ms, fresh)
            taken = offered_tickets([tuple(row) for row in rows], owner)
    step = offer_step(offer, claimed + len(taken))
    if step.withdraw:
        await conn.execute(WITHDRAW.format(schema=schema), owner)
    elif step.write:
        await conn.execute(CLEAR_ENDED.format(schema=schema), now_ms, owner)
        await conn.execute(PUT_OFFERS.format(schema=schema), list(queues), owner, offer.slots, lease_ms, offer.until_ms)
    return taken


async def offered_rows(conn: Connection, schema: str, owner: str, now_ms: int) -> list[tuple[Any, ...]]:
    """The rows of the jobs offered to ``owner`` that it still holds (``OFFERED_TO``), oldest first."""
    return [tuple(row) for row in await conn.fetch(OFFERED_TO.format(schema=schema), owner, now_ms)]
