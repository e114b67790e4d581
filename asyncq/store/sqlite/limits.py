"""A limited queue's claim on SQLite (``core.flow_limits``; docs/flow-control.md, "Limits"), and what operators read
of the limits in force.

The plain claim (``statements.CLAIM_RANKED``) takes nothing from a queue with limits; the group commit then runs
``claim_limited`` for it, in the same transaction: it reads the queue's limits, its rate state and its live leases,
asks ``core.flow_limits.allowance`` how many jobs it may take, claims them with ``CLAIM_LIMITED`` (which applies the
per-key limit row by row) and advances the rate's state. SQLite's write lock serialises every claim of the file, so
the count a claim reads is exact: no other claim can land between the count and the lease.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from asyncq.core.claim_plan import limited_take
from asyncq.core.flow_limits import (
    Hold,
    Limits,
    LimitState,
    LimitUsage,
    allowance,
    held_by_keys,
    limited_again,
    rate_after,
    usage_of,
)

_LIMITS = "limit_concurrency, limit_per_key, limit_rate, limit_per_ms, limit_burst"

#: Whether the queue has limits (a primary-key read; what a claim that came back short asks).
IS_LIMITED = (
    "SELECT 1 FROM asyncq_queues WHERE queue = :queue"
    " AND coalesce(limit_concurrency, limit_per_key, limit_rate) IS NOT NULL"
)
LIMIT_SETTINGS = f"SELECT {_LIMITS}, rate_tat_us, paused_at IS NOT NULL FROM asyncq_queues WHERE queue = :queue"
# The queue's live leases: a range of ``asyncq_jobs_leased`` (queue, status, lease_until), the first the earliest.
LIVE_LEASES = """
SELECT count(*), min(lease_until) FROM asyncq_jobs WHERE status = 'leased' AND queue = :queue AND lease_until > :now
"""
LIVE_BY_KEY = """
SELECT limit_key, count(*) FROM asyncq_jobs
WHERE status = 'leased' AND queue = :queue AND lease_until > :now AND limit_key IS NOT NULL GROUP BY limit_key
"""
SET_RATE_STATE = "UPDATE asyncq_queues SET rate_tat_us = :tat_us WHERE queue = :queue"
LIMITED_QUEUES = f"""
SELECT queue, {_LIMITS}, rate_tat_us FROM asyncq_queues
WHERE coalesce(limit_concurrency, limit_per_key, limit_rate) IS NOT NULL ORDER BY queue
"""

# CLAIM_RANKED's branches and order, under the per-key limit: ``live`` counts each key's live leases (the queue's
# leased range), ``full`` the keys at their limit; every branch steps over a full key's jobs (they keep their place
# and their priority), and ``fits`` keeps, of what the branches found, a key's jobs only up to its free slots
# (``nth``: the job's place among its key's, in the claim order). A job without a key is bound by the queue's limits
# only. ``:limit`` is what the queue's slots and rate allow (``core.flow_limits.allowance``); ``:per_key`` NULL: no
# per-key limit. A paused queue never gets here (``claim_limited`` reads it first, under the write lock).
CLAIM_LIMITED = """
WITH flow AS (SELECT :now - max_wait_ms AS late_at FROM asyncq_queues WHERE queue = :queue),
live AS (
  SELECT limit_key, count(*) AS n FROM asyncq_jobs
  WHERE status = 'leased' AND queue = :queue AND lease_until > :now AND limit_key IS NOT NULL GROUP BY limit_key
),
full AS (SELECT limit_key FROM live WHERE n >= :per_key),
ready AS (
  SELECT * FROM (SELECT seq, 1 AS late, priority, available_at, limit_key FROM asyncq_jobs
                 WHERE status = 'pending' AND queue = :queue AND available_at <= (SELECT late_at FROM flow)
                   AND (limit_key IS NULL OR limit_key NOT IN full)
                 ORDER BY available_at, seq LIMIT :limit)
  UNION ALL
  SELECT * FROM (SELECT seq, 0, priority, available_at, limit_key FROM asyncq_jobs
                 WHERE status = 'pending' AND queue = :queue AND +available_at <= :now
                   AND +available_at > ifnull((SELECT late_at FROM flow), -1)
                   AND (limit_key IS NULL OR limit_key NOT IN full)
                 ORDER BY priority DESC, available_at, seq LIMIT :limit)
  UNION ALL
  SELECT * FROM (SELECT seq, available_at <= ifnull((SELECT late_at FROM flow), -1) AS late, priority, available_at,
                   limit_key
                 FROM asyncq_jobs WHERE status = 'leased' AND lease_until <= :now AND queue = :queue
                   AND (limit_key IS NULL OR limit_key NOT IN full)
                 ORDER BY late DESC, CASE WHEN late THEN 0 ELSE priority END DESC, available_at, seq LIMIT :limit)
),
ranked AS (
  SELECT seq, late, priority, available_at, limit_key,
    row_number() OVER (PARTITION BY limit_key
                       ORDER BY late DESC, CASE WHEN late THEN 0 ELSE priority END DESC, available_at, seq) AS nth
  FROM ready
),
fits AS (
  SELECT r.seq, r.late, r.priority, r.available_at FROM ranked r
  WHERE r.limit_key IS NULL OR :per_key IS NULL
    OR r.nth + ifnull((SELECT n FROM live WHERE live.limit_key = r.limit_key), 0) <= :per_key
)
UPDATE asyncq_jobs
SET status = 'leased', attempts = attempts + 1, token = token + 1, owner = :owner,
    lease_until = min(:now + :lease_ms, deadline), reason = NULL
WHERE seq IN (
  SELECT seq FROM fits ORDER BY late DESC, CASE WHEN late THEN 0 ELSE priority END DESC, available_at, seq LIMIT :limit)
RETURNING seq, id, queue, body, priority, owner, token, attempts, lease_until, deadline, max_attempts, available_at,
  available_at <= ifnull((SELECT :now - max_wait_ms FROM asyncq_queues WHERE queue = :queue), -1)
"""


def is_limited(con: sqlite3.Connection, queue: str) -> bool:
    """Whether ``queue`` has limits now (its plain claim takes nothing then)."""
    return con.execute(IS_LIMITED, {"queue": queue}).fetchone() is not None


def limit_state(con: sqlite3.Connection, queue: str, now_ms: int) -> LimitState | None:
    """What ``queue``'s limited claim reads first: ``None`` if it has no limits (any more)."""
    row = con.execute(LIMIT_SETTINGS, {"queue": queue}).fetchone()
    limits = None if row is None else Limits(*row[:5])
    if limits is None or not limits.limited:
        return None
    live, first_expiry = con.execute(LIVE_LEASES, {"queue": queue, "now": now_ms}).fetchone()
    return LimitState(limits, row[5], bool(row[6]), live, first_expiry)


def claim_limited(
    con: sqlite3.Connection, queue: str, want: int, counts: bool, params: dict[str, Any]
) -> tuple[list[tuple[Any, ...]], Hold | None] | None:
    """Claim up to ``want`` jobs of the limited ``queue`` (``params``: the claim's ``now``, ``owner``, ``lease_ms``),
    as its limits allow: the rows (``CLAIM_RANKED``'s columns) and what holds the queue when it took none; ``None``
    if the queue has no limits (the caller runs the plain claim). Never claims ahead (``counts`` false: nothing)."""
    now_ms = params["now"]
    taken: list[tuple[Any, ...]] = []
    while True:
        state = limit_state(con, queue, now_ms)
        if state is None:
            return None if not taken else (taken, None)
        if state.paused:
            return taken, None
        allowed = allowance(queue, state, now_ms)
        asked = limited_take(counts, want - len(taken), allowed.jobs)
        if asked == 0:
            return taken, None if taken else allowed.hold
        limits = state.limits
        found = con.execute(
            CLAIM_LIMITED, params | {"queue": queue, "limit": asked, "per_key": limits.per_key_concurrency}
        ).fetchall()
        if found and limits.rate is not None:
            tat_us = rate_after(limits, state.tat_us, now_ms, len(found))
            con.execute(SET_RATE_STATE, {"queue": queue, "tat_us": tat_us})
        taken += found
        if not limited_again(limits, asked, len(found)):
            return taken, None if taken else held_by_keys(queue, state)


def limit_usage(con: sqlite3.Connection, now_ms: int) -> list[LimitUsage]:
    """Every limited queue's limits and what they hold now (``core.flow_limits.LimitUsage``), by name."""
    usage = []
    for queue, *limits, tat_us in con.execute(LIMITED_QUEUES).fetchall():
        live, _first = con.execute(LIVE_LEASES, {"queue": queue, "now": now_ms}).fetchone()
        per_key = dict(con.execute(LIVE_BY_KEY, {"queue": queue, "now": now_ms}).fetchall())
        usage.append(usage_of(queue, Limits(*limits), tat_us, now_ms, live, per_key))
    return usage
