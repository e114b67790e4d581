"""A limited queue's claim on PostgreSQL (``core.flow_limits``; docs/flow-control.md, "Limits"), and what operators
read of the limits in force.

The plain claim (``statements.CLAIM``) takes nothing from a queue with limits; the group commit then runs
``claim_limited`` for it, in the same transaction. Under ``READ COMMITTED`` a statement sees only what committed
before it began, so two hosts counting leases at once would each miss the other's claim, not yet committed, and
together exceed the limit. The limited claim therefore first locks the queue's settings row (``LOCK_*``, in its own
statement), and only then counts the live leases and claims, each in a statement that begins after the lock was
granted: every claim of the queue that held the lock before has committed, and is counted. The lock is held to the
commit, which is also what the rate's state (``rate_tat_us`` on that row) needs.

The claim reads a bounded window of the queue's claim order (``CLAIM_LIMITED``) and, under a per-key limit when that
came back short, each key's best jobs by one seek a key (``CLAIM_BY_KEYS``): never a walk of a full key's backlog.

Deadlocks: a group commit may claim several limited queues, in its own order. Only its first limited queue waits for
the row's lock; the next ones are skipped if another transaction holds theirs (``SKIP LOCKED``: claimed at the next
commit), so no transaction ever holds one queue's lock while it waits for another's.
"""

from __future__ import annotations

from typing import Any

from asyncq.core.claim_plan import limited_take
from asyncq.core.flow_limits import (
    Hold,
    Limits,
    LimitState,
    LimitUsage,
    allowance,
    by_keys,
    claim_window,
    held_by_keys,
    rate_after,
    usage_of,
)
from asyncq.store.postgres.connection import Connection
from asyncq.store.postgres.statements import claimed_columns

_LIMITS = "limit_concurrency, limit_per_key, limit_rate, limit_per_ms, limit_burst"
_LIMITED = "coalesce(limit_concurrency, limit_per_key, limit_rate) IS NOT NULL"

#: Whether the queue has limits (a primary-key read; what a claim that found nothing asks).
IS_LIMITED = f"SELECT 1 FROM {{schema}}.queues WHERE queue = $1 AND {_LIMITED}"
LOCK_WAITING = (
    f"SELECT {_LIMITS}, rate_tat_us, paused_at IS NOT NULL FROM {{schema}}.queues WHERE queue = $1 FOR UPDATE"
)
LOCK_SKIPPING = LOCK_WAITING + " SKIP LOCKED"
# The queue's live leases: a range of ``jobs_leased`` (queue, lease_until), the first the earliest.
LIVE_LEASES = """
SELECT count(*), min(lease_until) FROM {schema}.jobs WHERE status = 'leased' AND queue = $1 AND lease_until > $2
"""
LIVE_BY_KEY = """
SELECT limit_key, count(*) FROM {schema}.jobs
WHERE status = 'leased' AND queue = $1 AND lease_until > $2 AND limit_key IS NOT NULL GROUP BY limit_key
"""
SET_RATE_STATE = "UPDATE {schema}.queues SET rate_tat_us = $2 WHERE queue = $1"
LIMITED_QUEUES = f"SELECT queue, {_LIMITS}, rate_tat_us FROM {{schema}}.queues WHERE {_LIMITED} ORDER BY queue"

# The window walk: ``statements.CLAIM``'s branches and order, each reading at most $7 jobs of its index (the first of
# the queue's claim order), under the per-key limit ($6; NULL: none): ``live`` counts each key's live leases,
# ``full_keys`` lists the keys at their limit, whose jobs are left out (they keep their place and priority); of each
# other key's jobs ``chosen`` keeps only as many as its free slots (``nth``: the job's place among its key's, in the
# claim order). A job without a key is bound by the queue's limits only. $3 is what the queue's slots and rate allow
# (``core.flow_limits.allowance``); the claim counts the attempt (a limited queue is never claimed ahead). $1 queue,
# $2 now, $4 owner, $5 lease_ms. The window bounds the walk: the jobs of full keys ranked past it are reached by the
# key walk (``CLAIM_BY_KEYS``), not by walking them.
CLAIM_LIMITED = """
WITH flow AS MATERIALIZED (
  SELECT $2 - max_wait_ms AS late_at FROM {schema}.queues WHERE queue = $1
), live AS MATERIALIZED (
  SELECT limit_key, count(*) AS n FROM {schema}.jobs
  WHERE status = 'leased' AND queue = $1 AND lease_until > $2 AND limit_key IS NOT NULL GROUP BY limit_key
), full_keys AS MATERIALIZED (
  SELECT coalesce(array_agg(limit_key), '{{}}') AS keys FROM live WHERE n >= $6::integer
), late AS MATERIALIZED (
  SELECT seq, priority, available_at, limit_key FROM {schema}.jobs
  WHERE status = 'pending' AND queue = $1 AND available_at <= (SELECT late_at FROM flow) AND deadline > $2
    AND attempts < max_attempts AND cancel_requested_at IS NULL
  ORDER BY available_at, seq LIMIT $7
), pending AS MATERIALIZED (
  SELECT seq, priority, available_at, limit_key FROM {schema}.jobs
  WHERE status = 'pending' AND queue = $1 AND available_at <= $2 AND deadline > $2 AND attempts < max_attempts
    AND cancel_requested_at IS NULL
    AND NOT coalesce(available_at <= (SELECT late_at FROM flow), false)
  ORDER BY priority DESC, available_at, seq LIMIT $7
), expired AS MATERIALIZED (
  SELECT seq, priority, available_at, limit_key FROM {schema}.jobs
  WHERE status = 'leased' AND queue = $1 AND lease_until <= $2 AND deadline > $2 AND attempts < max_attempts
    AND cancel_requested_at IS NULL
  ORDER BY coalesce(available_at <= (SELECT late_at FROM flow), false) DESC,
    CASE WHEN coalesce(available_at <= (SELECT late_at FROM flow), false) THEN 0 ELSE priority END DESC,
    available_at, seq
  LIMIT $7
), ranked AS MATERIALIZED (
  SELECT seq, priority, available_at, limit_key, late,
    row_number() OVER (PARTITION BY limit_key
                       ORDER BY late DESC, CASE WHEN late THEN 0 ELSE priority END DESC, available_at, seq) AS nth
  FROM (SELECT seq, priority, available_at, limit_key,
          coalesce(available_at <= (SELECT late_at FROM flow), false) AS late
        FROM (SELECT * FROM late UNION ALL SELECT * FROM pending UNION ALL SELECT * FROM expired) c
        WHERE limit_key IS NULL OR limit_key <> ALL ((SELECT keys FROM full_keys)::text[])) r
), chosen AS MATERIALIZED (
  SELECT r.seq, r.late FROM ranked r LEFT JOIN live ON live.limit_key = r.limit_key
  WHERE r.limit_key IS NULL OR $6::integer IS NULL OR r.nth + coalesce(live.n, 0) <= $6::integer
  ORDER BY late DESC, CASE WHEN late THEN 0 ELSE priority END DESC, available_at, seq LIMIT $3
), {locked}
UPDATE {schema}.jobs j
SET status = 'leased', attempts = j.attempts + 1, token = j.token + 1, owner = $4,
    lease_until = least($2 + $5, j.deadline), reason = NULL
FROM chosen WHERE j.seq = chosen.seq AND j.seq IN (SELECT seq FROM locked)
RETURNING """ + claimed_columns("chosen.late")

# The key walk, when the window walk came back short under a per-key limit: every key with pending jobs, one seek
# each of ``jobs_keyed`` (queue, limit_key, priority DESC, available_at, seq: keyed pending jobs only), from the first
# key to the last (``keys``); of each key with free slots (``room``), its best ready jobs, at most its free slots, by
# priority, then ready time, then seq (a ``LATERAL`` seek); the best $3 of them all, then locked. Its cost is one seek
# a key with pending jobs, whatever their backlogs. It sees the window walk's claims (this transaction's) in ``live``.
# The seek names its key as a range and orders by it: with ``limit_key = r.k`` the key's order is implied, and the
# planner could take ``jobs_ranked`` (same order after the queue) and walk a big key's backlog to find a small key's
# jobs (43 ms at 300,000 jobs, ``tests/test_claim_plans.py``); only the keyed index gives this order.
CLAIM_BY_KEYS = """
WITH RECURSIVE live AS MATERIALIZED (
  SELECT limit_key, count(*) AS n FROM {schema}.jobs
  WHERE status = 'leased' AND queue = $1 AND lease_until > $2 AND limit_key IS NOT NULL GROUP BY limit_key
), keys(k) AS (
  SELECT (SELECT min(limit_key) FROM {schema}.jobs WHERE status = 'pending' AND queue = $1 AND limit_key IS NOT NULL)
  UNION ALL
  SELECT (SELECT min(limit_key) FROM {schema}.jobs
          WHERE status = 'pending' AND queue = $1 AND limit_key IS NOT NULL AND limit_key > keys.k)
  FROM keys WHERE keys.k IS NOT NULL
), room AS MATERIALIZED (
  SELECT keys.k, $6::integer - coalesce(live.n, 0) AS free
  FROM keys LEFT JOIN live ON live.limit_key = keys.k WHERE keys.k IS NOT NULL
), candidates AS MATERIALIZED (
  SELECT c.seq, c.priority, c.available_at, r.k, r.free,
    row_number() OVER (PARTITION BY r.k ORDER BY c.priority DESC, c.available_at, c.seq) AS nth
  FROM room r CROSS JOIN LATERAL (
    SELECT seq, priority, available_at FROM {schema}.jobs
    WHERE status = 'pending' AND queue = $1 AND limit_key >= r.k AND limit_key <= r.k AND available_at <= $2
      AND deadline > $2 AND attempts < max_attempts AND cancel_requested_at IS NULL
    ORDER BY limit_key, priority DESC, available_at, seq LIMIT $6
  ) c WHERE r.free > 0
), chosen AS MATERIALIZED (
  SELECT seq, false AS late FROM candidates WHERE nth <= free ORDER BY priority DESC, available_at, seq LIMIT $3
), {locked}
UPDATE {schema}.jobs j
SET status = 'leased', attempts = j.attempts + 1, token = j.token + 1, owner = $4,
    lease_until = least($2 + $5, j.deadline), reason = NULL
FROM chosen WHERE j.seq = chosen.seq AND j.seq IN (SELECT seq FROM locked)
RETURNING """ + claimed_columns(
    "coalesce(j.available_at <= (SELECT $2 - max_wait_ms FROM {schema}.queues WHERE queue = $1), false)"
)

# The rows chosen, locked before they are leased: a row another transaction holds (a cancel, the sweep) is left for
# the next claim, and one that changed since the statement's snapshot is locked only if it is still claimable (the
# lock re-checks these conditions on the row's newest version), so a job cancelled meanwhile is never leased.
_LOCKED = """locked AS MATERIALIZED (
  SELECT l.seq FROM {schema}.jobs l
  WHERE l.seq IN (SELECT seq FROM chosen) AND l.queue = $1 AND l.deadline > $2 AND l.attempts < l.max_attempts
    AND l.cancel_requested_at IS NULL
    AND (l.status = 'pending' AND l.available_at <= $2 OR l.status = 'leased' AND l.lease_until <= $2)
  FOR UPDATE SKIP LOCKED
)"""
CLAIM_LIMITED = CLAIM_LIMITED.replace("{locked}", _LOCKED)
CLAIM_BY_KEYS = CLAIM_BY_KEYS.replace("{locked}", _LOCKED)


async def is_limited(conn: Connection, schema: str, queue: str) -> bool:
    """Whether ``queue`` has limits now (its plain claim takes nothing then)."""
    return await conn.fetchval(IS_LIMITED.format(schema=schema), queue) is not None


async def limit_state(conn: Connection, schema: str, queue: str, now_ms: int, wait: bool) -> LimitState | bool:
    """``queue``'s limits read with its settings row locked to the commit, then its live leases (a later statement:
    it sees every claim that held the lock before). ``False``: no limits (any more); ``True``: another transaction
    holds the lock and ``wait`` is false (claim it at the next commit)."""
    row = await conn.fetchrow((LOCK_WAITING if wait else LOCK_SKIPPING).format(schema=schema), queue)
    if row is None:
        return not wait and await is_limited(conn, schema, queue)
    limits = Limits(*tuple(row)[:5])
    if not limits.limited:
        return False
    live, first_expiry = await _live(conn, schema, queue, now_ms)
    return LimitState(limits, row[5], bool(row[6]), live, first_expiry)


async def _live(conn: Connection, schema: str, queue: str, now_ms: int) -> tuple[int, int | None]:
    """How many leases of ``queue`` are live at ``now_ms``, and when the first of them expires."""
    row = await conn.fetchrow(LIVE_LEASES.format(schema=schema), queue, now_ms)
    assert row is not None  # an aggregate returns its row
    return int(row[0]), row[1]


async def claim_limited(
    conn: Connection, schema: str, queue: str, want: int, counts: bool, params: tuple[int, str, int], wait: bool
) -> tuple[list[tuple[Any, ...]], Hold | None] | None:
    """Claim up to ``want`` jobs of the limited ``queue`` (``params``: the claim's ``now``, ``owner``, ``lease_ms``)
    as its limits allow: the rows (``statements.CLAIM``'s columns) and what holds the queue when it took none;
    ``None`` if it has no limits (the caller runs the plain claim). Never claims ahead (``counts`` false: nothing).
    ``wait``: wait for the queue's lock (the first limited queue of the transaction), else skip it if it is held."""
    now_ms, owner, lease_ms = params
    state = await limit_state(conn, schema, queue, now_ms, wait)
    if state is False:
        return None
    if not isinstance(state, LimitState) or state.paused:  # held by another transaction, or paused
        return [], None
    allowed = allowance(queue, state, now_ms)
    asked = limited_take(counts, want, allowed.jobs)
    if asked == 0:
        return [], allowed.hold
    limits = state.limits
    shape = (owner, lease_ms, limits.per_key_concurrency)
    rows = await conn.fetch(
        CLAIM_LIMITED.format(schema=schema), queue, now_ms, asked, *shape, claim_window(limits, asked)
    )
    taken = [tuple(row) for row in rows]
    if by_keys(limits, asked, len(taken)):
        rows = await conn.fetch(CLAIM_BY_KEYS.format(schema=schema), queue, now_ms, asked - len(taken), *shape)
        taken += [tuple(row) for row in rows]
    if taken and limits.rate is not None:
        tat_us = rate_after(limits, state.tat_us, now_ms, len(taken))
        await conn.execute(SET_RATE_STATE.format(schema=schema), queue, tat_us)
    return taken, None if taken else held_by_keys(queue, state)


async def limit_usage(conn: Connection, schema: str, now_ms: int) -> list[LimitUsage]:
    """Every limited queue's limits and what they hold now (``core.flow_limits.LimitUsage``), by name."""
    usage = []
    for row in await conn.fetch(LIMITED_QUEUES.format(schema=schema)):
        queue, *limits, tat_us = tuple(row)
        live, _first = await _live(conn, schema, queue, now_ms)
        per_key = {key: n for key, n in await conn.fetch(LIVE_BY_KEY.format(schema=schema), queue, now_ms)}
        usage.append(usage_of(queue, Limits(*limits), tat_us, now_ms, live, per_key))
    return usage
